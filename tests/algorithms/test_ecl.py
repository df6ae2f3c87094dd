"""C-ECL: per-node code equals the edge-by-edge form, duals stay antisymmetric in sum, exact
optimum on heterogeneous data with masked (rand-k) dual updates, configuration errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.helpers import reference_tracking as reft
from tests.helpers.algorithm_setup import (
    PROBLEM,
    TOPO,
    X0,
    W,
    assert_same,
    full_grad,
    oracles,
    row_compressor,
    run_engine,
    x0_fn,
)

L = PROBLEM.smoothness().L


@pytest.mark.parametrize(("spec", "period", "rho", "rounds"), [
    ("none", 5, 1.0, 60), ("none", 1, 0.5, 40), ("topk:0.25", 5, 0.25, 40), ("sign", 3, 1.0, 40)])
def test_cecl_equals_edge_form(spec, period, rho, rounds):
    eta = 0.2 / L
    alg = make_algorithm("c-ecl", eta=eta, period=period, rho=None if spec == "topk:0.25" else rho,
                         theta=0.7, weight_decay=1e-3)
    ours, eng = run_engine(alg, spec, rounds, problem=PROBLEM)
    assert_same(ours, reft.cecl(X0(), W, full_grad(PROBLEM), eta, period, rho, 0.7, rounds,
                                row_compressor(spec), weight_decay=1e-3))
    for i, nd in eng.nodes.items():  # each mirror equals the neighbor's dual (lists by sorted neighbor)
        for j, r in zip(nd.view.neighbors, nd.state["r"], strict=True):
            k = eng.nodes[j].view.neighbors.index(i)
            np.testing.assert_allclose(r.numpy(), eng.nodes[j].state["z"][k].numpy(), atol=1e-12)


def test_masked_duals_reach_the_exact_optimum():
    from tests.helpers.algorithm_setup import HETERO, distance

    x0 = HETERO.initial_point()
    eta = 0.2 / HETERO.smoothness().L
    eng = Engine(make_algorithm("c-ecl", eta=eta, period=5), topologies.build("ring", 8),
                 lambda i: x0, compressor="randk:0.2", oracles=lambda i, gen: HETERO.oracle(i, gen), seed=1)
    for _ in range(3000):
        eng.step()
    assert distance(eng, HETERO) < 1e-9


def test_configuration_errors():
    with pytest.raises(ConfigError, match="period/rho > 1"):
        Engine(make_algorithm("c-ecl", period=1), TOPO, x0_fn(), oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="stateless"):
        Engine(make_algorithm("c-ecl"), TOPO, x0_fn(), compressor="lowrank:1", oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="symmetric"):
        Engine(make_algorithm("c-ecl"), topologies.build("directed-exponential", 8), x0_fn(),
               oracles=oracles(PROBLEM))


def test_a_checkpoint_with_duals_as_lists_resumes():
    """Checkpoints of the per-node code held each node's duals as lists of d-vectors (one per
    neighbor); they load into the [deg, d] rows of the per-arc state."""
    def engine():
        return Engine(make_algorithm("c-ecl", eta=0.2 / L, period=2), TOPO, x0_fn(),
                      compressor="topk:0.25", oracles=oracles(PROBLEM), seed=3)

    straight, first = engine(), engine()
    for _ in range(6):
        straight.step()
    for _ in range(3):
        first.step()
    nodes = first.node_state_dicts()
    for blob in nodes.values():
        blob["state"] = {k: list(v.clone()) if k in ("z", "r") else v.clone()
                         for k, v in blob["state"].items()}
    resumed = engine()
    resumed.load_state_dicts(nodes, first.run_state_dict())
    for _ in range(3):
        resumed.step()
    for i in straight.nodes:
        assert torch.equal(resumed.nodes[i].x, straight.nodes[i].x)


@pytest.mark.parametrize("spec", ["loss=0.1", "loss=ge:p_gb=0.02,p_bg=0.18"])
def test_lossy_duals_keep_their_mirrors_and_reach_the_exact_optimum(spec):
    """on_loss "ack": a lost dual update moves neither the receiver's dual nor the sender's
    mirror of it, so they stay equal (bit for bit), and the run still reaches the exact
    optimum (a lost update is only late; at the fixed point every message is zero)."""
    from tests.helpers.algorithm_setup import HETERO, distance

    x0 = HETERO.initial_point()
    eta = 0.2 / HETERO.smoothness().L
    eng = Engine(make_algorithm("c-ecl", eta=eta, period=2), topologies.build("ring", 8),
                 lambda i: x0, compressor="randk:0.2", oracles=lambda i, gen: HETERO.oracle(i, gen),
                 seed=1, network=spec)
    for _ in range(3000):
        eng.step()
    assert eng.network.delivery.lost_total.sum() > 0.05 * 1500 * 16
    for i, nd in eng.nodes.items():
        for j, r in zip(nd.view.neighbors, nd.state["r"], strict=True):
            k = eng.nodes[j].view.neighbors.index(i)
            assert torch.equal(r, eng.nodes[j].state["z"][k]), (i, j)
    assert distance(eng, HETERO) < 1e-9
