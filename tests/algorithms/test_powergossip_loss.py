"""PowerGossip under message loss (on_loss "edge", gossip/network/loss.py): an edge either of
whose messages of a step is lost sits the step out at both ends. Against a float64 replay of
the same drops, the average kept exactly, the factors equal at both ends, consensus reached,
the masks and bytes of a delivered phase."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.layout import Layout
from gossip.network import LossDraws, arc_keys, parse_network
from tests.algorithms.test_algorithms import _seed_edges_like_reference
from tests.helpers import reference as ref
from tests.helpers.algorithm_setup import TOPO, N, W, x0_fn


def edge_active(spec: str, seed: int):
    """``active(t, (lo, hi))`` of the reference: neither of the edge's messages of round t
    (phase 0, one power step per round) is lost, by the engine's keyed draws."""
    model = parse_network(spec).loss
    draws: dict[tuple[int, int], LossDraws] = {}

    def active(t: int, e: tuple[int, int]) -> bool:
        d = draws.setdefault(e, LossDraws(model, seed, arc_keys([e, e[::-1]])))
        return not d.lost(t, 0).any()

    return active


@pytest.mark.parametrize(("rank", "spec"), [(1, "loss=0.1"), (2, "loss=ge:p_gb=0.1,p_bg=0.3")])
def test_lossy_powergossip_equals_its_float64_replay(rank, spec):
    m, k, rounds = 6, 5, 40
    eng = Engine(make_algorithm("powergossip", gamma=1.2, rank=rank), TOPO, x0_fn(2, (m, k)),
                 layout=Layout([(m, k)]), network=spec, seed=3)
    _seed_edges_like_reference(eng, ref.default_basis(0), m, k, rank)
    Ms = np.stack([eng.nodes[i].x.numpy().reshape(m, k).copy() for i in range(N)])
    active = edge_active(spec, 3)
    theirs = ref.powergossip(Ms, W, rounds + 1, 1.2, rank=rank, active=active)
    skipped = sum(not active(t, (i, j)) for t in range(1, rounds + 1)
                  for i in range(N) for j in TOPO.view(i).neighbors if i < j)
    assert skipped > 5
    for r in range(rounds):
        eng.step()
        ours = np.stack([eng.nodes[i].x.numpy().reshape(m, k) for i in range(N)])
        np.testing.assert_allclose(ours, theirs[r + 2], atol=1e-10, err_msg=f"round {r + 1}")
    np.testing.assert_allclose(ours.mean(0), Ms.mean(0), atol=1e-13)  # average kept
    assert eng.network.delivery.lost_total.sum() > 0
    for i in range(N):  # both ends hold bit-identical factors
        for j in TOPO.view(i).neighbors:
            assert torch.equal(eng.nodes[i].state[f"P{j}"][0], eng.nodes[j].state[f"P{i}"][0])
            assert torch.equal(eng.nodes[i].state[f"Q{j}"][0], eng.nodes[j].state[f"Q{i}"][0])


@pytest.mark.parametrize("spec", ["loss=0.1", "loss=0.3"])
def test_lossy_powergossip_keeps_the_average_and_reaches_consensus(spec):
    """A matrix and a vector (gossiped exactly), two power steps per round on a ring: the
    average stays exact while messages are lost, and the models reach it."""
    topo = topologies.build("ring", 8)
    layout = Layout([(6, 5), (7,)])
    eng = Engine(make_algorithm("powergossip", rank=2, iterations=2), topo, x0_fn(4, (37,)),
                 layout=layout, network=spec, seed=1)
    x0 = eng.block.x.clone()
    mean0 = x0.mean(0)
    for _ in range(300):
        eng.step()
    x = eng.block.x
    assert torch.allclose(x.mean(0), mean0, rtol=0, atol=1e-13)
    assert float((x - mean0).norm() / (x0 - mean0).norm()) < 1e-6
    assert eng.network.delivery.lost_total.sum() > 0.5 * float(spec.split("=")[1]) * 300 * 2 * 16


def test_an_edge_phase_masks_the_edge_and_counts_the_arc():
    """The delivered plan of a PowerGossip phase: an arc's masks are its edge's (both of its
    messages arrived); the transfers and out-degrees are the arcs' own (a message whose reverse
    was lost still moves, and its bytes count)."""
    eng = Engine(make_algorithm("powergossip"), topologies.build("ring", 8),
                 x0_fn(1, (4, 3)), layout=Layout([(4, 3)]), network="loss=0.3", seed=5)
    route = eng.block.workspace["edges"].arcs.route
    model = eng.network.model.loss
    for t in (1, 7):
        plan = eng.network.delivery.route(route, eng.topology, t, 0)
        out = LossDraws(model, 5, arc_keys(route.arcs)).lost(t, 0)
        back = LossDraws(model, 5, arc_keys([(j, i) for i, j in route.arcs])).lost(t, 0)
        assert plan.out_delivered.tolist() == (~(out | back)).tolist()
        assert plan.in_delivered.tolist() == plan.out_delivered.tolist()  # symmetric rows
        assert plan.out_degree == [int(not lost) for lost in out]
        assert (out & ~back).any()  # some arc moves bytes its edge discards


def test_powergossip_refuses_late_messages():
    with pytest.raises(ConfigError, match="moves both ends of an edge together"):
        Engine(make_algorithm("powergossip"), topologies.build("ring", 8), x0_fn(1, (4, 3)),
               layout=Layout([(4, 3)]), network="stale=1")
