"""Spectral quantities against docs/topologies.md, and the sparse solvers against dense."""

from __future__ import annotations

import time

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import topologies as T
from topologies.spectral import spectrum


def W_of(graph, rule="metropolis", lazy=False):
    return T.mixing_matrix(graph, rule, lazy=lazy)


@pytest.mark.parametrize(
    "n, gap, beta",
    [(8, 0.1953, 1.333), (9, 0.1560, 1.293), (16, 0.0508, 1.333), (25, 0.0209, 1.328),
     (32, 0.0128, 1.333)],
)
def test_ring_table(n, gap, beta):
    W = W_of(T.ring(n), "uniform")
    assert T.spectral_gap(W) == pytest.approx(gap, abs=6e-5)
    assert T.beta(W) == pytest.approx(beta, abs=6e-4)
    assert T.rho(W) == pytest.approx(1 - gap, abs=6e-5)


def test_ring_eigenvalues_formula():
    n = 10
    W = W_of(T.ring(n))
    expected = sorted(1 / 3 + 2 / 3 * np.cos(2 * np.pi * k / n) for k in range(n))
    np.testing.assert_allclose(np.linalg.eigvalsh(W), expected, atol=1e-12)
    assert T.lambda2(W) == pytest.approx(expected[-2], abs=1e-12)


def test_lazy_ring():
    assert T.spectral_gap(W_of(T.ring(8), lazy=True)) == pytest.approx(0.0976, abs=6e-5)


@pytest.mark.parametrize("n, gap", [(16, 0.400), (25, 0.2764), (64, 0.1172)])
def test_torus_table(n, gap):
    W = W_of(T.torus(n), "uniform")
    assert set(np.round(W[W > 0], 12)) == {0.2}
    assert T.spectral_gap(W) == pytest.approx(gap, abs=6e-5)


def test_complete_star_grid():
    for n in (2, 5, 12):
        assert T.spectral_gap(W_of(T.complete(n))) == pytest.approx(1, abs=1e-12)
    assert T.spectral_gap(W_of(T.star(8))) == pytest.approx(0.125, abs=1e-12)
    assert T.spectral_gap(W_of(T.grid(40, rows=8))) == pytest.approx(0.0335, abs=6e-5)


@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_directed_exponential_gap(n):
    tau = int(np.log2(n))
    W = W_of(T.directed_exponential(n), "uniform")
    assert T.spectral_gap(W) == pytest.approx(2 / (tau + 1), abs=1e-10)
    assert T.lambda2(W) < 1  # second-largest eigenvalue modulus for non-symmetric W


@pytest.mark.parametrize("n, gap", [(8, 0.667), (16, 0.5), (32, 0.4)])
def test_symmetric_exponential(n, gap):
    assert T.spectral_gap(W_of(T.exponential(n))) == pytest.approx(gap, abs=6e-4)


@pytest.mark.parametrize("p, low, high", [(0.2, 0.05, 0.4), (0.5, 0.35, 0.7)])
def test_erdos_renyi_ballpark(p, low, high):
    # one draw gives ~0.28 / ~0.45; over 30 seeds we see 0.06-0.31 (mean 0.22)
    # and 0.44-0.62 (mean 0.53)
    for seed in range(3):
        assert low < T.spectral_gap(W_of(T.erdos_renyi(40, p, seed=seed))) < high


def davis(n):
    """The Davis Southern Women graph (32 nodes, string labels)."""
    return nx.davis_southern_women_graph()


def test_davis_social_graph_via_callable():
    topo = T.build(f"{__file__}:davis", 32)
    assert topo.gap == pytest.approx(0.0821, abs=6e-5)


def test_sparse_and_dense_inputs_agree():
    W = W_of(T.ring(12))
    assert T.rho(sp.csr_array(W)) == pytest.approx(T.rho(W), abs=1e-14)


@pytest.mark.parametrize(
    "graph, method",
    [
        (T.ring(121), "sparse-lu"),
        (T.path(120), "sparse-lu"),
        (T.torus(400), "sparse-lu"),
        (T.exponential(120), "lanczos"),
        (T.random_regular(120, 4, seed=0), "lanczos"),
        (T.star(120), "lanczos"),
        (T.directed_exponential(120), "lanczos"),
    ],
)
def test_sparse_solvers_match_dense(graph, method):
    W = W_of(graph)
    dense = spectrum(W)
    fast = spectrum(sp.csr_array(W), dense_max_n=10, closed_form=False)
    assert fast.method == method
    assert fast.gap == pytest.approx(dense.gap, rel=1e-7, abs=1e-12)
    assert fast.rho == pytest.approx(dense.rho, abs=1e-10)
    assert fast.beta == pytest.approx(dense.beta, abs=1e-8)
    if dense.lambda2 is not None:
        assert fast.lambda2 == pytest.approx(dense.lambda2, abs=1e-10)
        assert fast.lambda_min == pytest.approx(dense.lambda_min, abs=1e-8)


def test_lazy_and_disconnected_sparse():
    W = W_of(T.ring(100), lazy=True)
    fast = spectrum(sp.csr_array(W), dense_max_n=10)
    assert fast.gap == pytest.approx(spectrum(W).gap, rel=1e-7)
    split = W_of(nx.disjoint_union(T.ring(50), T.ring(50)))
    assert spectrum(sp.csr_array(split), dense_max_n=10).gap == pytest.approx(0, abs=1e-12)


def test_generic_fallback_for_non_stochastic_matrices():
    rng = np.random.default_rng(0)
    A = sp.random_array((60, 60), density=0.1, random_state=rng)
    for M in (A + A.T, A):
        dense = spectrum(M.toarray())
        fast = spectrum(sp.csr_array(M), dense_max_n=10)
        assert fast.method == "arpack"
        assert fast.rho == pytest.approx(dense.rho, rel=1e-8)
        assert fast.beta == pytest.approx(dense.beta, rel=1e-8)


def test_ring_of_ten_thousand_gap_is_fast_and_accurate():
    n = 10_000
    t0 = time.perf_counter()
    topo = T.build("ring", n)
    gap = topo.gap
    elapsed = time.perf_counter() - t0
    exact = 2 / 3 * (1 - np.cos(2 * np.pi / n))  # 1.3e-7
    assert gap == pytest.approx(exact, rel=1e-6)
    assert topo.beta == pytest.approx(4 / 3, abs=1e-9)
    assert elapsed < 3.0, f"ring(10000) topology + gap took {elapsed:.2f} s"


def test_sparse_spectrum_is_deterministic():
    # every MPI rank must derive the same step sizes from the gap, to the last bit
    W = sp.csr_array(W_of(T.exponential(150)))
    assert spectrum(W, dense_max_n=10) == spectrum(W, dense_max_n=10)
    W = sp.csr_array(W_of(T.ring(150)))
    assert spectrum(W, dense_max_n=10) == spectrum(W, dense_max_n=10)
