"""Large-n setup: closed-form spectra against dense eigvalsh, the time cap, edge-array builds."""

from __future__ import annotations

import logging

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import topologies as T
from topologies import builders as B
from topologies.edgelist import EdgeList
from topologies.spec import parse_edges
from topologies.spectral import closed_form_spectrum, spectrum


def _dense(W):
    return spectrum(W.toarray() if sp.issparse(W) else W)


def _close(fast, dense):
    assert fast.method == "closed form"
    assert fast.exact
    assert fast.symmetric == dense.symmetric
    assert fast.rho == pytest.approx(dense.rho, abs=1e-12)
    assert fast.gap == pytest.approx(dense.gap, abs=1e-12)
    assert fast.beta == pytest.approx(dense.beta, abs=1e-12)
    if dense.symmetric:
        assert fast.lambda2 == pytest.approx(dense.lambda2, abs=1e-12)
        assert fast.lambda_min == pytest.approx(dense.lambda_min, abs=1e-12)


RULES = [("metropolis", False), ("uniform", False), ("max-degree", False), ("metropolis", True)]


@pytest.mark.parametrize("n", [2, 3, 4, 7, 10, 31, 64, 101])
@pytest.mark.parametrize("rule, lazy", RULES)
def test_circulants_closed_form(n, rule, lazy):
    for graph in (B.ring(n), B.exponential(n), B.complete(n), B.directed_exponential(n)):
        if graph.is_directed() and rule == "max-degree" and lazy:
            continue
        W = T.mixing_matrix(graph, rule, lazy=lazy)
        _close(closed_form_spectrum(W), _dense(W))


@pytest.mark.parametrize("n, rows", [(4, 2), (6, 2), (9, 3), (12, 3), (12, 4), (15, 3), (35, 5),
                                     (64, 8), (100, 4)])
@pytest.mark.parametrize("rule, lazy", RULES)
def test_torus_closed_form(n, rows, rule, lazy):
    W = T.mixing_matrix(B.torus(n, rows), rule, lazy=lazy)
    _close(closed_form_spectrum(W, (rows, n // rows)), _dense(W))


@pytest.mark.parametrize("n", [2, 4, 8, 32, 128])
@pytest.mark.parametrize("rule, lazy", RULES)
def test_hypercube_closed_form(n, rule, lazy):
    W = T.mixing_matrix(B.hypercube(n), rule, lazy=lazy)
    _close(closed_form_spectrum(W, (2,) * (n.bit_length() - 1)), _dense(W))


@pytest.mark.parametrize("n", [3, 4, 7, 10, 33])
@pytest.mark.parametrize("rule, lazy", [("metropolis", False), ("max-degree", False),
                                        ("metropolis", True)])
def test_star_closed_form(n, rule, lazy):
    W = T.mixing_matrix(B.star(n), rule, lazy=lazy)
    _close(closed_form_spectrum(W), _dense(W))


def test_symmetry_is_checked_on_w_not_taken_from_the_name():
    # a ring whose weights break the rotation symmetry: no closed form, the right answer anyway
    graph = B.ring(12)
    for k, (a, b) in enumerate(graph.edges()):
        graph.edges[a, b]["weight"] = 0.2 + 0.01 * k
    W = T.mixing_matrix(graph, "weights")
    assert closed_form_spectrum(W) is None
    topo = T.Topology(graph, rule="weights")
    assert topo.spectrum.method.startswith("dense")
    # a wrong group hint is verified and dropped: the torus's W is no circulant on Z_n
    W = T.mixing_matrix(B.torus(12, 3), "metropolis")
    assert closed_form_spectrum(W, (4, 3)) is None
    assert closed_form_spectrum(W) is None
    # a star with unequal edge weights has no closed form
    star = B.star(6)
    for k, (a, b) in enumerate(star.edges()):
        star.edges[a, b]["weight"] = 0.1 + 0.02 * k
    assert closed_form_spectrum(T.mixing_matrix(star, "weights")) is None
    # not doubly stochastic: no closed form
    assert closed_form_spectrum(T.mixing_matrix(B.ring(8), "push") * 0.5) is None


def test_large_topologies_use_closed_forms_and_agree_with_the_solvers():
    for spec, n in (("ring", 3000), ("torus", 3000), ("exponential", 2500)):
        topo = T.build(spec, n)
        fast = topo.spectrum
        assert fast.method == "closed form", spec
        slow = spectrum(topo.W, closed_form=False)
        assert fast.gap == pytest.approx(slow.gap, rel=1e-6)
        assert fast.beta == pytest.approx(slow.beta, abs=1e-8)


def test_ring_of_a_million_gap_in_closed_form():
    topo = T.build("ring", 10**6)
    s = topo.spectrum
    assert s.method == "closed form"
    exact = (2 / 3) * (1 - np.cos(2 * np.pi / 10**6))  # 1 - lambda_2, metropolis weights 1/3
    assert s.gap == pytest.approx(exact, rel=1e-9)


def test_time_cap_gives_bounds_and_says_so(caplog):
    W = T.mixing_matrix(B.random_regular(3000, 4, seed=1), "metropolis")
    exact = spectrum(W)
    with caplog.at_level(logging.WARNING, logger="topologies.spectral"):
        capped = spectrum(W, time_budget=0.0, name="regular:k=4")
    assert not capped.exact and capped.method == "estimated"
    assert "estimated" in caplog.text and "regular:k=4" in caplog.text
    # the bounds hold on the safe side
    assert capped.rho >= exact.rho and capped.gap <= exact.gap
    assert capped.lambda_min <= exact.lambda_min and capped.beta >= exact.beta
    assert capped.lambda2 >= exact.lambda2
    # with time, the same matrix gets its values
    assert spectrum(W, time_budget=60.0).exact


def test_time_cap_without_bounds_skips():
    rng = np.random.default_rng(0)
    A = sp.random_array((3000, 3000), density=0.002, random_state=rng)
    capped = spectrum(sp.csr_array(A + A.T), time_budget=0.0)
    assert capped.method == "skipped" and not capped.exact
    assert np.isnan(capped.rho) and np.isnan(capped.gap)


def test_topology_spectrum_is_lazy_and_capped(monkeypatch):
    calls = []
    import topologies.topology as topology_module

    real = topology_module.spectrum
    monkeypatch.setattr(topology_module, "spectrum", lambda *a, **k: calls.append(k) or real(*a, **k))
    topo = T.build("regular:k=4", 3000, time_budget=0.0)
    topo.view(0)
    repr(topo)
    assert calls == []  # building, views and repr compute no spectrum
    assert topo.spectrum.method == "estimated"
    assert calls[0]["time_budget"] == 0.0
    assert topo.describe()["spectrum"] == "estimated"


@pytest.mark.parametrize("spec, n", [("ring", 10), ("path", 9), ("torus", 12), ("torus:rows=2", 8),
                                     ("grid", 12), ("complete", 6), ("star", 7), ("hypercube", 16),
                                     ("exponential", 11), ("directed-exponential", 9),
                                     ("regular:k=3", 20)])
def test_edge_arrays_give_the_parsed_graph(spec, n):
    edges = parse_edges(spec, n, seed=5)
    assert isinstance(edges, EdgeList)
    graph = T.parse(spec, n, seed=5)
    built = edges.to_networkx()
    assert list(built.edges) == list(graph.edges) and built.graph == graph.graph
    assert built.is_directed() == graph.is_directed()
    topo = T.build(spec, n, seed=5)
    assert topo.number_of_edges() == graph.number_of_edges()
    assert topo._graph is None  # not made until asked for
    assert nx.utils.graphs_equal(topo.graph, graph)
    np.testing.assert_array_equal(topo.dense(), T.Topology(graph).dense())


def test_large_random_regular_is_simple_regular_connected_and_reproducible():
    n, k = B.REGULAR_VECTOR_MIN_N + 2, 4
    a = B.random_regular_edges(n, k, seed=3)
    b = B.random_regular_edges(n, k, seed=3)
    np.testing.assert_array_equal(a.u, b.u)
    np.testing.assert_array_equal(a.v, b.v)
    assert not B._bad_pairs(a.u, a.v, n).size
    assert np.all(np.bincount(np.concatenate([a.u, a.v]), minlength=n) == k)
    assert B._connected(n, a.u, a.v)
    c = B.random_regular_edges(n, k, seed=4)
    assert not np.array_equal(c.u, a.u)


def test_edge_list_topology_keeps_error_paths():
    with pytest.raises(T.MixingMatrixError, match="'weight' attribute"):
        T.build("ring", 5000, weights="weights")
    with pytest.raises(T.MixingMatrixError, match="regular graph"):
        T.build("star", 5000, weights="uniform")
    with pytest.raises(T.SpecError):
        T.build("regular", 5000)


def test_budgeted_solvers_give_the_unbudgeted_values():
    rng = np.random.default_rng(1)
    perm = rng.permutation(2100)  # a relabeled directed exponential graph: no circulant left
    graph = nx.relabel_nodes(B.directed_exponential(2100), dict(enumerate(perm.tolist())))
    graph = nx.DiGraph(nx.convert_node_labels_to_integers(graph, ordering="sorted"))
    A = sp.random_array((2100, 2100), density=0.003, random_state=rng)
    for W in (T.mixing_matrix(graph, "metropolis", sparse=True), sp.csr_array(A + A.T)):
        free, timed = spectrum(W), spectrum(W, time_budget=300.0)
        assert timed.exact and free.method == timed.method != "closed form"
        assert timed.rho == pytest.approx(free.rho, rel=1e-12)
        assert timed.beta == pytest.approx(free.beta, rel=1e-12)


def test_a_budget_too_small_for_the_solvers_gives_the_bounds_without_starting_them(monkeypatch):
    from topologies import spectral

    W = T.build("regular:k=4", 2100, seed=1).W  # no closed form, above the dense size
    monkeypatch.setattr(spectral, "MIN_PRODUCTS", 10**12)  # no budget pays for these
    monkeypatch.setattr(spectral, "_sparse_spectrum", lambda *a: pytest.fail("solver started"))
    bounds = spectral.spectrum(W, time_budget=60.0)
    assert bounds.method == "estimated" and not bounds.exact
    assert bounds.rho == 1.0 and bounds.gap == 0.0 and bounds.lambda_min >= -1.0  # safe side
    with pytest.raises(pytest.fail.Exception, match="solver started"):
        spectral.spectrum(W, time_budget=None)  # no budget: the solvers run
