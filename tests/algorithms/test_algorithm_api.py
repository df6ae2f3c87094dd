"""The algorithm API's contract: an algorithm object is configuration only (a run never changes
it, so one instance serves several runs), and what a run derives lives on its block."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.problems import make_problem


def _engine(alg, compressor: str = "none", problem: str = "least-squares") -> Engine:
    cls = type(alg)
    graph = cls.requires.graph
    topo = topologies.build("complete" if graph.complete else "star" if graph.star else "ring", 4)
    kw = {}
    if cls.trains:
        pb = make_problem(problem, n_nodes=4, dim=12, samples_per_node=10, seed=1,
                          dtype=torch.float64)
        kw["oracles"] = lambda i, gen: pb.oracle(i, gen, "full", 2)
    x0 = {i: torch.randn(12, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
          for i in range(4)}
    return Engine(alg, topo, x0, compressor=compressor, seed=3, **kw)


def test_lead_reused_on_a_second_engine_gets_that_runs_defaults():
    lead = make_algorithm("lead", eta=0.05)
    first = _engine(lead, "none")
    assert (first.hparams["alpha"], first.hparams["gamma_dual"]) == (1.0, 1.0)  # NIDS
    second = _engine(lead, "topk:0.1")
    assert (second.hparams["alpha"], second.hparams["gamma_dual"]) == (0.1, 0.5)  # biased C
    assert lead.alpha is None and lead.gamma_dual is None


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_run_never_changes_the_algorithm_object(name):
    alg = make_algorithm(name, **({"start": "zero"} if name == "lodadac" else {}))  # nodes start apart
    before = {k: repr(v) for k, v in vars(alg).items()}
    try:
        engine = _engine(alg)
    except ConfigError:
        engine = _engine(alg, problem="lasso")  # prox methods need a regularizer
    for _ in range(3):
        engine.step()
    assert {k: repr(v) for k, v in vars(alg).items()} == before


def test_scratch_lives_in_the_workspace_not_the_checkpointed_state():
    engine = _engine(make_algorithm("choco", gamma=0.5), "topk:0.25")
    assert set(engine.block.state) == {"x_hat", "gap"}
    assert "channel" in engine.block.workspace  # the channel holds the message rows (scratch)
    saved = engine.node_state_dicts()[0]["state"]
    assert set(saved) == {"x_hat", "gap"}


def test_a_checkpoint_with_former_scratch_keys_still_loads():
    """Checkpoints written when scratch sat in the state hold extra keys: they load, and a
    checkpoint that lacks a key this run needs is refused naming it."""
    from gossip.engine.engine import _load_node_state

    engine = _engine(make_algorithm("choco", gamma=0.5), "topk:0.25")
    node = engine.nodes[0]
    saved = {k: v.clone() + 1.0 for k, v in node.state.items()}
    _load_node_state(node, saved | {"diff": torch.zeros(12)})
    assert torch.equal(node.state["gap"], saved["gap"])
    with pytest.raises(ConfigError, match="missing \\['x_hat'\\]"):
        _load_node_state(node, {"gap": saved["gap"]})
