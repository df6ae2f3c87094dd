"""Weight rules of `mixing_matrix` and every failure of `validate`."""

from __future__ import annotations

import time

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import topologies as T
from topologies import (
    GraphFileError,
    MixingMatrixError,
    TopologyError,
)

GRAPHS = {
    "ring": T.ring(9),
    "star": T.star(7),
    "grid": T.grid(12),
    "er": T.erdos_renyi(20, 0.3, seed=1),
    "path": T.path(6),
}


def assert_doubly_stochastic(W, atol=1e-12):
    W = W.toarray() if sp.issparse(W) else W
    np.testing.assert_allclose(W.sum(axis=1), 1, atol=atol)
    np.testing.assert_allclose(W.sum(axis=0), 1, atol=atol)
    assert W.min() >= 0


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("rule", ["metropolis", "max-degree"])
@pytest.mark.parametrize("lazy", [False, True])
def test_rules_symmetric_doubly_stochastic_on_support(name, rule, lazy):
    g = GRAPHS[name]
    W = T.mixing_matrix(g, rule, lazy=lazy)
    assert isinstance(W, np.ndarray) and W.dtype == np.float64
    assert_doubly_stochastic(W)
    np.testing.assert_array_equal(W, W.T)
    assert np.all(np.diag(W) > 0)
    off = (W > 0) & ~np.eye(len(W), dtype=bool)
    assert {(int(i), int(j)) for i, j in zip(*np.nonzero(off), strict=True)} == {
        (i, j) for u, v in g.edges() for i, j in ((u, v), (v, u))}
    T.validate(W, g)


def test_metropolis_values():
    W = T.mixing_matrix(T.star(8))
    assert W[0, 1] == pytest.approx(1 / 8)  # 1 / (1 + max(7, 1))
    assert W[0, 0] == pytest.approx(1 / 8) and W[1, 1] == pytest.approx(7 / 8)
    W = T.mixing_matrix(T.path(3))
    np.testing.assert_allclose(W, [[2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]])


def test_max_degree_values():
    W = T.mixing_matrix(T.path(4), "max-degree")
    assert W[0, 1] == pytest.approx(1 / 3) and W[0, 0] == pytest.approx(2 / 3)
    assert T.mixing_matrix(T.path(4), "max_degree")[0, 1] == W[0, 1]  # '_' spelling


def test_uniform_on_regular_graphs():
    W = T.mixing_matrix(T.torus(16), "uniform")
    assert set(np.round(W[W > 0], 12)) == {0.2}
    np.testing.assert_allclose(T.mixing_matrix(T.ring(5), "uniform"), T.mixing_matrix(T.ring(5)))


def test_uniform_refuses_irregular_graphs():
    with pytest.raises(MixingMatrixError, match=r"regular graph.*node \d+ has degree 1.*metropolis"):
        T.mixing_matrix(T.star(5), "uniform")


def test_lazy_is_half_identity_plus_half_w():
    W = T.mixing_matrix(T.ring(6))
    np.testing.assert_allclose(T.mixing_matrix(T.ring(6), lazy=True), (np.eye(6) + W) / 2)


def test_explicit_weights():
    g = nx.Graph()
    g.add_edge(0, 1, weight=0.5)
    g.add_edge(1, 2, weight=0.25)
    W = T.mixing_matrix(g, "weights")
    np.testing.assert_allclose(W, [[0.5, 0.5, 0], [0.5, 0.25, 0.25], [0, 0.25, 0.75]])
    T.validate(W, g)


def test_explicit_weights_errors():
    g = nx.Graph([(0, 1), (1, 2)])
    g.edges[0, 1]["weight"] = 0.5
    with pytest.raises(MixingMatrixError, match=r"edge \(1, 2\) has none"):
        T.mixing_matrix(g, "weights")
    g.edges[1, 2]["weight"] = 0.75
    with pytest.raises(MixingMatrixError, match=r"node 1: .*sum to 1.25 > 1"):
        T.mixing_matrix(g, "weights")
    g.edges[1, 2]["weight"] = -0.1
    with pytest.raises(MixingMatrixError, match=r"edge \(1, 2\) has negative weight"):
        T.mixing_matrix(g, "weights")


def test_directed_exponential_weights():
    for n, tau in [(8, 3), (12, 4)]:
        g = T.directed_exponential(n)
        for rule in ("metropolis", "uniform", "max-degree"):
            W = T.mixing_matrix(g, rule)
            assert set(np.round(W[W > 0], 12)) == {round(1 / (tau + 1), 12)}
            assert_doubly_stochastic(W)
            assert not np.allclose(W, W.T)
            T.validate(W, g, symmetric=False)
        assert W[0, n - 1] > 0 and W[n - 1, 0] == 0  # 0 receives from n-1 (arc n-1 -> 0)


def test_directed_rules_on_irregular_digraphs():
    balanced = nx.DiGraph([(0, 1), (1, 2), (2, 0), (0, 3), (3, 0)])  # in = out everywhere
    W = T.mixing_matrix(balanced, "max-degree")
    assert_doubly_stochastic(W)
    T.validate(W, balanced, symmetric=False)
    with pytest.raises(MixingMatrixError, match="regular graph"):
        T.mixing_matrix(balanced, "metropolis")
    unbalanced = nx.DiGraph([(0, 1), (1, 2), (2, 0), (0, 2)])
    with pytest.raises(MixingMatrixError, match="node 0 has in-degree 1 and out-degree 2"):
        T.mixing_matrix(unbalanced, "uniform")


def test_sparse_output_and_threshold():
    W = T.mixing_matrix(T.ring(10), sparse=True)
    assert isinstance(W, sp.csr_array)
    np.testing.assert_allclose(W.toarray(), T.mixing_matrix(T.ring(10)))
    assert isinstance(T.mixing_matrix(T.ring(10), dense_max_n=5), sp.csr_array)
    assert isinstance(T.mixing_matrix(T.ring(3000)), sp.csr_array)
    assert isinstance(T.mixing_matrix(T.ring(30), lazy=True, sparse=True), sp.csr_array)


def test_ring_of_ten_thousand_is_fast():
    t0 = time.perf_counter()
    g = T.ring(10_000)
    W = T.mixing_matrix(g)
    T.validate(W, g)
    built = time.perf_counter() - t0
    assert isinstance(W, sp.csr_array) and W.nnz == 30_000
    assert built < 1.0, f"ring(10000) W + validation took {built:.2f} s"


def test_graph_checks():
    g = nx.relabel_nodes(T.ring(4), {0: "a"})
    with pytest.raises(TopologyError, match=r"0..3.*'a'.*relabel"):
        T.mixing_matrix(g)
    g = T.ring(4)
    g.add_edge(2, 2)
    with pytest.raises(GraphFileError, match="self-loop on node 2"):
        T.mixing_matrix(g)
    with pytest.raises(MixingMatrixError, match="valid rules: metropolis, max-degree"):
        T.mixing_matrix(T.ring(4), "fastest")


# -- validate -----------------------------------------------------------------------------------


def ring_w(n=6):
    return T.ring(n), T.mixing_matrix(T.ring(n))


def test_validate_shape():
    g, W = ring_w()
    with pytest.raises(MixingMatrixError, match="square"):
        T.validate(W[:5], g)
    with pytest.raises(MixingMatrixError, match="W is 5 x 5 but the graph has 6 nodes"):
        T.validate(W[:5, :5], g)


def test_validate_non_finite():
    g, W = ring_w()
    W[0, 1] = np.nan
    with pytest.raises(MixingMatrixError, match=r"W\[0, 1\] = nan"):
        T.validate(W, g)


@pytest.mark.parametrize("sparse", [False, True])
def test_validate_off_graph_weight(sparse):
    g, W = ring_w()
    W[0, 3] = W[3, 0] = 0.1
    W[0, 0] -= 0.1
    W[3, 3] -= 0.1
    W = sp.csr_array(W) if sparse else W
    with pytest.raises(MixingMatrixError, match=r"W\[0, 3\] = 0.1 but the graph has no edge"):
        T.validate(W, g)


def test_validate_off_graph_weight_directed():
    g = T.directed_exponential(8)
    W = T.mixing_matrix(g)
    W = W.T.copy()  # weights on reversed arcs
    with pytest.raises(MixingMatrixError, match=r"no arc"):
        T.validate(W, g, symmetric=False)


def test_validate_negative():
    g, W = ring_w()
    W[0, 1] = W[1, 0] = -0.2
    with pytest.raises(MixingMatrixError, match=r"W\[0, 1\] = -0.2 < 0"):
        T.validate(W, g)


@pytest.mark.parametrize("sparse", [False, True])
def test_validate_rows_and_columns(sparse):
    g, W = ring_w()
    W[2, 2] += 0.05
    with pytest.raises(MixingMatrixError, match=r"row 2 of W sums to 1.05"):
        T.validate(sp.csr_array(W) if sparse else W, g)
    g = T.path(3)
    W = np.array([[0.5, 0.5, 0], [0.25, 0.5, 0.25], [0, 0.5, 0.5]])  # rows 1, columns not
    with pytest.raises(MixingMatrixError, match=r"column 1 of W sums to 1.5"):
        T.validate(W, g)


def test_validate_symmetry():
    g = T.complete(3)
    W = np.array([[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]])  # doubly stochastic, directed
    with pytest.raises(MixingMatrixError, match=r"W\[0, 1\] = 0.5 but W\[1, 0\] = 0"):
        T.validate(W, g)
    T.validate(W, g, symmetric=False)


def test_validate_disconnected():
    g = nx.disjoint_union(T.ring(3), T.ring(4))
    W = T.mixing_matrix(g)
    with pytest.raises(MixingMatrixError, match=r"2 connected components \(sizes 4, 3\)"):
        T.validate(W, g)
    T.validate(W, g, connected=False)
    g = T.ring(5)
    g.add_edge(0, 2)
    W = T.mixing_matrix(T.ring(5))  # W keeps the ring: connected on the larger graph
    T.validate(W, g)
    empty = nx.empty_graph(3)
    with pytest.raises(MixingMatrixError, match="node 1 cannot be reached from node 0"):
        T.validate(np.eye(3), empty)


def test_validate_no_spectral_gap():
    g = T.ring(4)  # bipartite: zero self weights make W periodic (eigenvalue -1)
    W = np.array([[0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0]])
    with pytest.raises(MixingMatrixError, match="lazy=True"):
        T.validate(W, g)
    T.validate((np.eye(4) + W) / 2, g)
    odd = np.array([[0, 0.5, 0, 0, 0.5], [0.5, 0, 0.5, 0, 0], [0, 0.5, 0, 0.5, 0],
                    [0, 0, 0.5, 0, 0.5], [0.5, 0, 0, 0.5, 0]])
    T.validate(odd, T.ring(5))  # zero self weights on an odd ring: still aperiodic


def test_one_error_class_per_way_a_caller_handles_it():
    """TopologyError (a ValueError) and its four kinds; NotNeighborError a KeyError too."""
    from topologies import errors

    classes = [getattr(errors, name) for name in errors.__all__]
    assert errors.__all__[0] == "TopologyError" and len(classes) == 5
    assert all(issubclass(cls, TopologyError) and issubclass(cls, ValueError) for cls in classes)
    assert issubclass(T.NotNeighborError, KeyError)
