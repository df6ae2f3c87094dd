"""Checkpoints of asynchronous runs (virtual time): a run saved after K sweeps and resumed into
a fresh engine equals the uninterrupted run bit for bit (models, algorithm state, records), for
every asynchronous algorithm on a straggler network with loss (and delays for the methods that
post messages, so some are in flight at the checkpoint; churn with fresh restarts for one)."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.checkpoint import Checkpointer
from gossip.engine import Engine
from gossip.errors import CheckpointError
from gossip.network.events import _ARRIVE
from gossip.problems import make_problem

N, D, K = 8, 12, 5
STRAGGLER = "loss=0.2;compute=exp:1;slow=nodes:0x5"
POSTS = STRAGGLER + ";delay=lognormal:0.1,0.5"  # posted messages travel: some are in flight
ASYNC = sorted(n for n, c in REGISTRY.items() if c.asynchronous)
CASES = {  # eta: a multiple of 1/L
    "ad-psgd": ({"eta": 0.2}, "none", STRAGGLER),
    "async-choco": ({"gamma": 0.5, "eta": 0.2}, "qsgd:4bit", STRAGGLER),
    "async-sgp": ({"eta": 0.1}, "none", POSTS),
    "gossip-learning": ({"eta": 0.2}, "none", POSTS),
    "pairwise-gossip": ({}, "none", STRAGGLER),
    "async-choco-churn": ({"gamma": 0.5}, "topk:0.5", "loss=0.1;compute=exp:1;churn=at:2@3-9+5@4-30,fresh"),
}


def build(case: str) -> Engine:
    """An 8-ring run of ``case``: mini-batch gradients (their generators are saved too) for
    the methods that train, distinct starting points for the averaging ones."""
    name = case.removesuffix("-churn")
    hp, spec, network = CASES[case]
    problem = make_problem("least-squares", n_nodes=N, dim=D, samples_per_node=20, seed=1,
                           dtype=torch.float64)
    trains = REGISTRY[name].trains or "eta" in hp
    if "eta" in hp:
        hp = hp | {"eta": hp["eta"] / problem.smoothness().L}
    oracles = (lambda i, gen: problem.oracle(i, gen, "sgd", 4)) if trains else None
    x0 = {i: torch.randn(D, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
          for i in range(N)}
    return Engine(make_algorithm(name, **hp), topologies.build("ring", N), x0, compressor=spec,
                  network=network, seed=7, dtype=torch.float64, oracles=oracles)


def snapshot(engine: Engine) -> tuple[list[torch.Tensor], dict]:
    tensors = []
    for nd in engine.nodes.values():
        tensors.append(nd.x.clone())
        for value in nd.state.values():
            tensors.extend(v.clone() for v in (value if isinstance(value, list) else [value]))
    rec = {k: v for k, v in engine.record().items()  # wall-clock seconds differ; virtual do not
           if not k.endswith("_s") or k == "time_virtual_s"}
    return tensors, rec


def test_every_asynchronous_algorithm_is_covered():
    assert sorted({c.removesuffix("-churn") for c in CASES}) == ASYNC


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_equals_uninterrupted(tmp_path, case):
    full = build(case)
    full.run(2 * K, log_every=K)
    first = build(case)
    ck = Checkpointer(tmp_path, identity={"run": case}, every=K)
    first.run(K, log_every=K)
    if CASES[case][2] == POSTS:  # the payloads in flight are part of the checkpoint
        assert any(kind == _ARRIVE for _, _, kind, _ in first.network.events._heap)
    ck.save(first)
    resumed = build(case)
    assert ck.restore(resumed) == K
    resumed.run(K, log_every=K)
    (a, ra), (b, rb) = snapshot(full), snapshot(resumed)
    assert ra == rb
    assert ra["messages_lost_total"] > 0 and ra["activations"] == 2 * K * N
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v), f"{case}: the resumed run differs by {float((u - v).abs().max())}"
    if case.endswith("-churn"):
        assert ra["rejoins"] > 0


def test_a_free_run_still_refuses_checkpoints_in_one_line():
    from argparse import Namespace

    from gossip.cli import check_asynchronous

    args = Namespace(overlap=False, link_latency=0.0, checkpoint_dir="ck", resume=None,
                     checkpoint_every=0, free_run=1.0, gamma=None)
    with pytest.raises(SystemExit, match="--free-run and --checkpoint-dir together") as err:
        check_asynchronous(args, "ad-psgd")
    assert "\n" not in str(err.value)
    args.free_run = None
    check_asynchronous(args, "ad-psgd")  # in virtual time: checkpoints work


def test_a_synchronous_checkpoint_is_refused_by_an_asynchronous_run(tmp_path):
    sync = Engine(make_algorithm("gossip"), topologies.build("ring", N),
                  lambda i: torch.zeros(D, dtype=torch.float64), seed=7)
    sync.run(2)
    ck = Checkpointer(tmp_path, identity={"run": "x"}, every=2)
    ck.save(sync)
    with pytest.raises(CheckpointError, match="no event queue"):
        ck.restore(build("pairwise-gossip"))
