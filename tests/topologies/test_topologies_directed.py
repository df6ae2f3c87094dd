"""Directed graphs of any degrees: the push (column-stochastic) and pull (row-stochastic) rules,
one-way validation, the directed-random builder, and out-weights in node views."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import topologies
from topologies import MixingMatrixError


def test_directed_random_is_strongly_connected_irregular_and_seeded():
    g = topologies.directed_random(12, p=0.15, seed=4)
    assert nx.is_strongly_connected(g)
    assert all(g.has_edge(i, (i + 1) % 12) for i in range(12))
    assert len({d for _, d in g.out_degree()}) > 1
    assert sorted(g.edges) == sorted(topologies.directed_random(12, p=0.15, seed=4).edges)
    assert sorted(g.edges) != sorted(topologies.directed_random(12, p=0.15, seed=5).edges)
    assert topologies.directed_random(5, p=0.0).number_of_edges() == 5
    assert topologies.parse("directed-random:p=0.3", 6, seed=1).number_of_edges() >= 6


@pytest.mark.parametrize("lazy", [False, True])
def test_push_and_pull_rules(lazy):
    g = topologies.directed_random(10, p=0.2, seed=2)
    push = topologies.Topology(g, rule="push", lazy=lazy)
    pull = topologies.Topology(g, rule="pull", lazy=lazy)
    C, R = push.dense(), pull.dense()
    np.testing.assert_allclose(C.sum(0), 1.0, atol=1e-15)
    np.testing.assert_allclose(R.sum(1), 1.0, atol=1e-15)
    assert push.stochastic == "column" and pull.stochastic == "row"
    for u, v in g.edges:  # an arc u -> v lets v mix u's value
        out_u, in_v = g.out_degree(u), g.in_degree(v)
        assert C[v, u] == pytest.approx((0.5 if lazy else 1.0) / (1 + out_u))
        assert R[v, u] == pytest.approx((0.5 if lazy else 1.0) / (1 + in_v))
    # the views carry both the in-weights (W[i, j]) and the out-weights (W[j, i])
    for i in range(10):
        view = push.view(i)
        assert view.out_weights == tuple(C[j, i] for j in view.out_neighbors)
        assert view.in_weights == tuple(C[i, j] for j in view.in_neighbors)
    # an undirected graph gets the same rules, each edge being two arcs
    ring = topologies.Topology(topologies.ring(5), rule="column-stochastic")
    np.testing.assert_allclose(ring.dense(), topologies.build("ring", 5).dense())


def test_one_way_validation_and_errors():
    g = topologies.directed_random(8, p=0.2, seed=1)
    with pytest.raises(MixingMatrixError, match="rule='push'"):
        topologies.Topology(g)  # metropolis needs equal in- and out-degrees
    C = topologies.mixing_matrix(g, "push")
    topologies.validate(C, g, symmetric=False, stochastic="column")
    with pytest.raises(MixingMatrixError, match="column-stochastic"):
        topologies.validate(topologies.mixing_matrix(g, "pull"), g, symmetric=False,
                            stochastic="column")
    with pytest.raises(MixingMatrixError, match="doubly stochastic"):
        topologies.validate(C, g, symmetric=False)
    zero_diag = C.copy()
    zero_diag[0, 0] = 0.0
    zero_diag[1, 0] += C[0, 0]  # still column-stochastic, but 0 keeps nothing
    with pytest.raises(MixingMatrixError, match="positive diagonal"):
        topologies.validate(zero_diag, g, symmetric=False, stochastic="column")
    with pytest.raises(topologies.TopologyError, match="stochastic must be"):
        topologies.validate(C, g, stochastic="sideways")
