"""Resume equals the uninterrupted run, bit for bit, for every algorithm x stateful compressor.

A run of 2K rounds is compared with K rounds, a checkpoint written by
:class:`gossip.checkpoint.Checkpointer`, a fresh engine restored from it, and K more rounds.
Models are per tensor (a two-tensor layout) and flat, so per-tensor wrappers of stateful
compressors are covered; gradient algorithms run on least squares with a stateful
variance-reduced oracle (L-SVRG).
"""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.checkpoint import Checkpointer
from gossip.compress import available, make
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.layout import Layout
from gossip.problems import make_problem
from gossip.stateful import Stateful

SHAPES = [(6, 5), (4,)]
DIM = 34
K = 6
EXAMPLE = {"topk": "topk:0.2", "randk": "randk:0.2", "qsgd": "qsgd:4bit:biased", "lead": "lead:2",
           "lowrank": "lowrank:1"}
"""A concrete spec of each compressor whose spec takes parameters."""


def example_specs() -> list[str]:
    """One spec per registered compressor."""
    names = dict.fromkeys(form.split(":")[0] for form in available())
    return [EXAMPLE.get(name, name) for name in names]


STATEFUL = [spec for spec in example_specs() if make(spec).stateful]


def build(name: str, spec: str, per_tensor: bool, problem_name: str = "least-squares") -> Engine:
    """A 4-node ring engine (the complete graph for an all-reduce); trainable algorithms get a
    problem (lasso if they need a prox)."""
    try:
        return _build(name, spec, per_tensor, problem_name)
    except ConfigError:
        if problem_name == "lasso" or not REGISTRY[name].trains:
            raise
        return _build(name, spec, per_tensor, "lasso")


def _build(name: str, spec: str, per_tensor: bool, problem_name: str) -> Engine:
    cls = REGISTRY[name]
    graph = cls.requires.graph
    topo = topologies.build("complete" if graph.complete else "star" if graph.star else "ring", 4)
    layout = Layout(SHAPES) if per_tensor else None
    kw: dict = {}
    if cls.trains:
        problem = make_problem(problem_name, n_nodes=4, dim=DIM, samples_per_node=20, seed=1,
                               dtype=torch.float64)
        kw["oracles"] = lambda i, gen: problem.oracle(i, gen, "lsvrg", 2)
        hp = cls.suggest_hparams(problem, "lsvrg")
    else:
        hp = {}
    x0 = {i: torch.randn(DIM, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
          for i in range(4)}
    return Engine(make_algorithm(name, **hp), topo, x0, compressor=spec, layout=layout, seed=3, **kw)


def states(engine: Engine) -> list[torch.Tensor]:
    out = []
    for nd in engine.nodes.values():
        out.append(nd.x.clone())
        for value in nd.state.values():
            out.extend(v.clone() for v in (value if isinstance(value, list) else [value]))
    return out


@pytest.mark.parametrize("per_tensor", [True, False], ids=["per-tensor", "flat"])
@pytest.mark.parametrize("spec", ["none", *STATEFUL])
@pytest.mark.parametrize("name", sorted(n for n, c in REGISTRY.items() if not c.asynchronous))
def test_resume_equals_uninterrupted(tmp_path, name, spec, per_tensor):
    """(Asynchronous runs: tests/asynchronous/test_checkpoint_async.py.)"""
    try:
        full = build(name, spec, per_tensor)
    except ConfigError as exc:
        pytest.skip(f"{name} does not run with {spec}: {exc}")
    for _ in range(2 * K):
        full.step()
    first = build(name, spec, per_tensor)
    ck = Checkpointer(tmp_path, identity={"run": name}, every=K)
    for _ in range(K):
        first.step()
    ck.save(first)
    resumed = build(name, spec, per_tensor)
    assert ck.restore(resumed) == K
    for _ in range(K):
        resumed.step()
    for a, b in zip(states(full), states(resumed), strict=True):
        assert torch.equal(a, b), f"{name} with {spec}: resumed run differs by {float((a - b).abs().max())}"
    assert resumed.round == full.round


def test_there_is_a_stateful_compressor_to_test():
    assert "lowrank:1" in STATEFUL


@pytest.mark.parametrize("spec", STATEFUL)
def test_per_tensor_compressor_state_round_trips(spec):
    layout = Layout(SHAPES)
    c = make(spec, layout=layout)
    assert isinstance(c, Stateful)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(DIM, dtype=torch.float64)
    c.encode(x, gen)
    twin = make(spec, layout=layout)
    twin.load_state_dict(c.state_dict())
    y = torch.randn(DIM, dtype=torch.float64)
    assert torch.equal(c.encode(y).buffer, twin.encode(y).buffer)


def test_node_state_holds_tensors_only():
    from gossip.core.algorithm import Algorithm

    class Bad(Algorithm):
        name = "bad-state"

        def setup(self, block):
            block.state["helper"] = object()

        def step(self, block):
            yield from ()

    with pytest.raises(ConfigError, match="tensors"):
        Engine(Bad(), topologies.build("ring", 3), lambda i: torch.zeros(3))


def _records(path) -> list[dict]:
    import json

    recs = [json.loads(line) for line in open(path)]
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k != "lr"}
            for r in recs if r["type"] == "round"]


SCRIPT_RUNS = {
    # the trainer's default per-tensor compression with warm-started low-rank factors
    "train-lowrank": ("train", ["--algorithm", "choco", "--compressor", "lowrank:1", "--gamma", "0.3",
                                "--data", "synthetic", "--synthetic-samples", "300", "--nodes", "4",
                                "--dtype", "float64", "--log-every", "10", "--optimizer", "sgd"]),
    # BEER's second (tracker) compressor stream
    "optimize-beer": ("optimize", ["--algorithm", "beer", "--compressor", "topk:0.2", "--dim", "20",
                                   "--samples-per-node", "30", "--nodes", "4", "--log-every", "10"]),
    # asynchronous, in virtual time: the event queue, with messages in flight at the checkpoint
    "optimize-gossip-learning": ("optimize", [
        "--algorithm", "gossip-learning", "--dim", "20", "--samples-per-node", "30", "--nodes", "4",
        "--log-every", "10", "--network", "loss=0.2;delay=lognormal:0.1,0.5;compute=exp:1;slow=nodes:0x5"]),
    "train-ad-psgd": ("train", ["--algorithm", "ad-psgd", "--data", "synthetic",
                                "--synthetic-samples", "300", "--nodes", "4", "--dtype", "float64",
                                "--log-every", "10", "--optimizer", "sgd",
                                "--network", "loss=0.1;compute=exp:1;slow=nodes:0x5"]),
}


@pytest.mark.parametrize("run", sorted(SCRIPT_RUNS))
def test_script_resume_after_a_crash_equals_uninterrupted(tmp_path, monkeypatch, run):
    """20 rounds, a crash, --resume for 20 more: the same log as 40 rounds in one go."""
    from tests.helpers.extending_driver import script

    name, args = SCRIPT_RUNS[run]
    length = ["--rounds", "40"] if name == "train" else ["--iterations", "40"]
    main = script(name).main
    full, cut, ck = tmp_path / "full.jsonl", tmp_path / "cut.jsonl", tmp_path / "ck"
    main([*args, *length, "--out", str(full)])
    original = Engine.step

    def crash_after_round_20(self, **kw):
        if self.round == 20:
            raise KeyboardInterrupt
        original(self, **kw)

    monkeypatch.setattr(Engine, "step", crash_after_round_20)
    with pytest.raises(KeyboardInterrupt):
        main([*args, *length, "--out", str(cut), "--checkpoint-dir", str(ck), "--checkpoint-every", "10"])
    monkeypatch.undo()
    main([*args, *length, "--out", str(cut), "--resume", str(ck)])
    assert _records(cut) == _records(full)
