"""A user's compressor and algorithm from outside the package, through every script and MPI;
the registries' checks; the extension guide's examples run as written."""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import pytest
import torch

import topologies
from examples.my_parts import LocalGossip, StochasticInt8
from gossip.algorithms import REGISTRY, make_algorithm, register_algorithm
from gossip.compress import TopK, available, make, register_compressor
from gossip.engine import Engine
from gossip.errors import CompressionError, ConfigError, PluginError
from gossip.problems import make_problem
from tests.helpers.extending_driver import RUNS, script
from tests.helpers.launch import Beside, run_mpi

LAUNCHES_MARKED_PER_TEST = True  # only the mpiexec test launches (tests/conftest.py)


@pytest.fixture(autouse=True)
def restore_registries():
    """Registrations a test makes end with it (the example's own, made at import, stay)."""
    import gossip.compress as compress
    import gossip.problems.factory as problems
    from gossip.compress import wire

    saved = [(d, dict(d)) for d in (REGISTRY, compress._REGISTRY, compress._KIND_CLASS, wire.KINDS,
                                    problems._BUILDERS)]
    names = list(problems.PROBLEMS)
    yield
    for live, copy in saved:
        live.clear()
        live.update(copy)
    problems.PROBLEMS[:] = names


def rounds(path) -> list[dict]:
    recs = [json.loads(line) for line in open(path)]
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in recs if r["type"] == "round"]


def test_int8_compressor_is_unbiased_and_exact_in_size():
    c = make("examples.my_parts:StochasticInt8")
    x = torch.randn(500, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    mean = sum(c.decode(c.encode(x, gen)) for _ in range(400)) / 400
    assert float((mean - x).abs().max()) < 0.05 * float(x.abs().max())
    p = c.encode(x, gen)
    assert p.nbytes == 8 + 8 + 500
    assert torch.equal(c.decode(c.from_bytes(p.to_bytes(), x)), c.decode(p))
    bad = p.to_bytes().clone()
    bad[-1] = 255
    with pytest.raises(CompressionError, match="code 255"):
        c.from_bytes(bad, x)


def test_scripts_run_the_user_parts_in_process(tmp_path):
    rows = script("consensus").main([*RUNS["consensus"], "--nodes", "4", "--rounds", "200"])
    assert rows[0]["status"] == "ok" and rows[0]["final_rel_error"] < 1e-8
    rows = script("optimize").main([*RUNS["optimize"], "--nodes", "4", "--iterations", "300"])
    assert rows[0]["status"] == "ok" and rows[0]["final"] < 0.5
    row = script("train").main([*RUNS["train"], "--nodes", "4", "--flat-compression",
                                "--out", str(tmp_path / "t.jsonl")])
    assert row["status"] == "ok"
    recs = rounds(tmp_path / "t.jsonl")
    assert recs[-1]["train_loss"] < recs[1]["train_loss"]
    # 30 rounds, an exchange every 2nd: 15 messages of 8 + 4 + d bytes (one flat float32 vector)
    # to each of 2 ring neighbors
    config = json.loads(open(tmp_path / "t.jsonl").readline())
    assert recs[-1]["bits_per_node"] == 15 * 2 * 8 * (12 + config["flat_numel"])


@pytest.mark.launches
@pytest.mark.slow
def test_user_parts_under_mpiexec_equal_the_in_process_run(tmp_path):
    with Beside(["tests/helpers/extending_driver.py", str(tmp_path / "local")]) as local:
        res = run_mpi(2, ["tests/helpers/extending_driver.py", str(tmp_path / "mpi")])
    assert local.result.returncode == 0, local.result.stderr[-3000:]
    assert res.returncode == 0, res.stderr[-3000:]
    for name in RUNS:
        assert rounds(tmp_path / "mpi" / f"{name}.jsonl") == rounds(tmp_path / "local" / f"{name}.jsonl"), name


def test_engine_and_trainer_take_instances():
    topo = topologies.build("ring", 4)
    x0 = {i: torch.full((10,), float(i), dtype=torch.float64) for i in range(4)}
    by_spec = Engine(make_algorithm("local-gossip", period=1), topo, x0, compressor="int8")
    by_instance = Engine(LocalGossip(period=1), topo, x0, compressor=StochasticInt8("int8"))
    for _ in range(5):
        by_spec.step()
        by_instance.step()
    for i in range(4):
        assert torch.equal(by_spec.nodes[i].x, by_instance.nodes[i].x)
    assert by_instance.nodes[0].compressor is not by_instance.nodes[1].compressor


def test_wire_kind_collision_is_refused():
    class Clash(StochasticInt8):
        kind = 4  # top-k's

    with pytest.raises(CompressionError, match="kind 4 is already used by 'topk'"):
        register_compressor("clash", Clash)
    assert "clash" not in {form.split(":")[0] for form in available()}
    alias = register_compressor("top-tenth", lambda spec: TopK(spec, ratio=0.1))  # same class: fine
    assert isinstance(make("top-tenth"), TopK) and alias is not None

    class SubTopK(TopK):  # another class setting no kind: its own, assigned when first built
        pass

    register_compressor("subtopk", lambda spec: SubTopK(spec, ratio=0.1))
    assert make("subtopk").kind not in (0, TopK.kind)


def test_wire_kinds_are_assigned_by_the_package(tmp_path):
    """A compressor class that sets no kind gets one of its own (32..127), stable from its name,
    whether registered, built from a spec by path or passed as an instance; its messages carry
    it and another class's receiver refuses them."""
    from gossip.compress import _ASSIGNED, wire

    assert StochasticInt8 in _ASSIGNED  # the example picks no byte
    assert StochasticInt8.kind in wire.ASSIGNED_KINDS and wire.kind_name(StochasticInt8.kind) == "int8"
    copy = type("Copy", (StochasticInt8,), {})  # a subclass: its own kind, not its parent's
    register_compressor("int8-copy", copy)
    assert copy.kind in wire.ASSIGNED_KINDS and copy.kind != StochasticInt8.kind
    assert copy.kind == wire.assigned_kind(f"{copy.__module__}.{copy.__qualname__}",
                                           set(wire.KINDS) - {copy.kind})
    (tmp_path / "free_codec.py").write_text(textwrap.dedent('''
        from examples.my_parts import StochasticInt8

        class Free(StochasticInt8):
            pass

        class Loose(StochasticInt8):
            pass
    '''))
    by_path = make(f"{tmp_path / 'free_codec.py'}:Free")
    kinds = {StochasticInt8.kind, copy.kind, type(by_path).kind}
    assert len(kinds) == 3 and 0 not in kinds
    x = torch.randn(50)
    sent = by_path.encode(x, torch.Generator().manual_seed(0)).to_bytes()
    assert int(sent[2]) == type(by_path).kind  # the header's kind byte
    with pytest.raises(CompressionError, match="produced by compressor 'Free'"):
        make("int8").from_bytes(sent, x)
    from topologies.registry import import_target

    loose = import_target(f"{tmp_path / 'free_codec.py'}:Loose", error=PluginError)("loose")  # never registered
    topo = topologies.build("ring", 4)
    Engine(make_algorithm("choco"), topo, lambda i: torch.zeros(8), compressor=loose)
    assert type(loose).kind in wire.ASSIGNED_KINDS and type(loose).kind not in kinds


def test_registry_errors_say_what_to_fix():
    with pytest.raises(ConfigError, match="already registered"):
        register_algorithm(type("Other", (LocalGossip,), {"name": "choco"}))
    with pytest.raises(ConfigError, match="`name` class attribute"):
        register_algorithm(type("NoName", (LocalGossip,), {"name": None}))
    with pytest.raises(PluginError, match="cannot import module 'no_such_pkg.mod'"):
        make_algorithm("no_such_pkg.mod:Alg")
    with pytest.raises(ConfigError, match="not a gossip.algorithms.Algorithm"):
        make_algorithm("examples.my_parts:StochasticInt8")
    with pytest.raises(CompressionError, match="not a gossip.compress.Compressor"):
        make("examples.my_parts:LocalGossip")
    with pytest.raises(ConfigError, match="unknown algorithm 'chocoo'"):
        make_algorithm("chocoo")


def test_help_lists_registered_parts_and_each_default_once(capsys):
    for name in ("consensus", "optimize", "train"):
        with pytest.raises(SystemExit) as exit_:
            script(name).parse_args(["--help"])
        assert exit_.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert len(re.findall(r"\(default: ring\)", text)) == 1, "a default printed twice"
        assert "(default: ring) (default" not in text
        assert "module:Class" in text and "lowrank:RANK" in text and "local-gossip" in text
        if name == "train":  # a zero default is shown too (0.0 == False must not hide it)
            assert "final multiplier of the cosine schedule (default: 0.0)" in text


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_suggested_steps_converge(name):
    """Every registered gradient algorithm's suggest_hparams gives a run that gets closer to x*."""
    cls = REGISTRY[name]
    if not cls.trains:
        pytest.skip(f"{name} uses no gradients")
    # an all-reduce gets the complete graph, on 8 nodes (a power of two, for adasum's tree)
    n = 8 if cls.requires.graph.complete else 6
    star = cls.requires.graph.star  # federated: node 0 the server, the data on the n − 1 clients
    problem = make_problem("lasso" if name.startswith("prox-lead") else "least-squares", n_nodes=n - star,
                           dim=15, samples_per_node=30, seed=2, dtype=torch.float64)
    x_star = torch.as_tensor(problem.solution(), dtype=torch.float64)
    graph = "complete" if cls.requires.graph.complete else "star" if star else "ring"
    topo = topologies.build(graph, n)
    hp = cls.suggest_hparams(problem, "full", topo)
    engine = Engine(make_algorithm(name, **hp), topo, lambda i: problem.initial_point(), compressor="none",
                    oracles=lambda i, gen: None if star and i == 0 else problem.oracle(i - star, gen, "full", 1))

    def dist() -> float:  # federated: the server's model is the run's
        nodes = [engine.nodes[0]] if star else engine.nodes.values()
        return sum(float((nd.x - x_star).square().sum()) for nd in nodes)

    start = dist()
    for _ in range(300):
        engine.step()
    assert dist() < 0.5 * start, f"{name} with {hp} does not converge"


def test_init_file_gives_the_dimension(tmp_path):
    data = np.random.default_rng(0).standard_normal((4, 7))
    np.save(tmp_path / "x0.npy", data)
    out = tmp_path / "log.jsonl"
    script("consensus").main(["--init", str(tmp_path / "x0.npy"), "--nodes", "4", "--rounds", "5",
                              "--dtype", "float64", "--out", str(out)])
    config = json.loads(open(out).readline())
    assert config["args"]["dim"] is None
    first = rounds(out)[0]
    expected = float(np.mean(np.sum((data - data.mean(0)) ** 2, axis=1)))
    assert first["consensus_error"] == pytest.approx(expected, rel=1e-12)
    np.save(tmp_path / "cube.npy", np.random.default_rng(1).standard_normal((4, 3, 5)))
    rows = script("consensus").main(["--init", str(tmp_path / "cube.npy"), "--nodes", "4",
                                     "--rounds", "2", "--algorithm", "powergossip"])
    assert rows[0]["status"] == "ok"
    with pytest.raises(SystemExit, match=r"expected \(5, d\)"):
        script("consensus").main(["--init", str(tmp_path / "x0.npy"), "--nodes", "5", "--rounds", "1"])
    with pytest.raises(SystemExit, match="drop --dim"):
        script("consensus").main(["--init", str(tmp_path / "x0.npy"), "--nodes", "4", "--dim", "6"])


def test_plugin_file_path_spec(tmp_path):
    """``path/to/file.py:Class`` works like ``module:Class`` for a file outside any package."""
    (tmp_path / "mine.py").write_text(textwrap.dedent('''
        from examples.my_parts import LocalGossip

        class Every(LocalGossip):
            name = "every-round"
    '''))
    alg = make_algorithm(f"{tmp_path / 'mine.py'}:Every", period=1)
    assert alg.name == "every-round" and alg.period == 1
    assert make_algorithm(f"{tmp_path / 'mine.py'}:Every").__class__ is type(alg)  # imported once


def test_public_api_resolves():
    import gossip

    for name in gossip.__all__:
        assert getattr(gossip, name) is not None, name
    assert issubclass(gossip.ConfigError, gossip.GossipError)
    assert issubclass(gossip.CompressionError, gossip.GossipError)
    assert issubclass(PluginError, gossip.GossipError)
    assert "local-gossip" in gossip.available_algorithms() and "int8" in gossip.available_compressors()


def test_optimize_takes_a_problem_builder_by_path(tmp_path):
    (tmp_path / "probs.py").write_text(textwrap.dedent('''
        from gossip.problems import make_problem

        def small(*, n_nodes, seed, dtype, device, **_):
            return make_problem("logistic", n_nodes=n_nodes, dim=6, samples_per_node=20, seed=seed,
                                dtype=dtype, device=device)
    '''))
    rows = script("optimize").main(["--problem", f"{tmp_path / 'probs.py'}:small", "--algorithm", "lead",
                                    "--compressor", "none", "--nodes", "4", "--iterations", "200"])
    assert rows[0]["status"] == "ok" and rows[0]["final"] < 1e-8
    with pytest.raises(SystemExit, match="unknown problem 'nope'"):
        script("optimize").main(["--problem", "nope", "--nodes", "4", "--iterations", "1"])


def test_a_plugin_loaded_by_path_has_a_short_label(tmp_path):
    """Tables and records name a plug-in by its registered name (or class name) and its
    parameters, not by the file's path; the config keeps the spec as given."""
    from gossip.cli.runs import short_label

    (tmp_path / "labelled.py").write_text(textwrap.dedent('''
        from examples.my_parts import LocalGossip, StochasticInt8
        from gossip.algorithms import register_algorithm

        class Unnamed(StochasticInt8):
            def __init__(self, spec, *params):
                super().__init__(spec)

        class Named(LocalGossip):
            name = "named-gossip"

        register_algorithm(Named)
    '''))
    path = tmp_path / "labelled.py"
    assert short_label(f"{path}:Unnamed:7:x") == "Unnamed:7:x"
    assert short_label(f"{path}:Named") == "named-gossip"
    assert short_label("examples.my_parts:StochasticInt8") == "int8"
    assert short_label("topk:0.1") == "topk:0.1" and short_label("choco") == "choco"
    log = tmp_path / "c.jsonl"
    rows = script("consensus").main(["--algorithm", "examples.my_parts:LocalGossip",
                                     "--compressor", f"{path}:Unnamed:3", "--nodes", "4",
                                     "--dim", "8", "--rounds", "2", "--out", str(log)])
    assert rows[0]["run"].startswith("local-gossip Unnamed:3")
    config = json.loads(log.read_text().splitlines()[0])
    assert config["compressor"] == f"{path}:Unnamed:3" and config["label"] == rows[0]["run"]
    rows = script("optimize").main(["--compare", f"examples.my_parts:LocalGossip@{path}:Unnamed",
                                    "--nodes", "4", "--dim", "8", "--iterations", "2",
                                    "--out", str(tmp_path / "o.jsonl")])
    assert rows[0]["run"] == "local-gossip@Unnamed"
