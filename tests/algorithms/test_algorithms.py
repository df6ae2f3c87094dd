"""Every per-node algorithm equals its vectorized matrix form (tests/helpers/reference.py), float64.

The reference gets the same compressor as a row-wise callable (deterministic ones: identity,
top-k with lowest-index ties, scaled sign), so any difference is in the per-node algorithm.
Top-k runs are compared over fewer rounds: near-ties can flip late (docs/algorithms/choco.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.layout import Layout
from tests.helpers import reference as ref
from tests.helpers.algorithm_setup import (
    LASSO,
    PROBLEM,
    TOPO,
    X0,
    D,
    N,
    W,
    assert_same,
    full_grad,
    oracles,
    row_compressor,
    run_engine,
    x0_fn,
)


@pytest.mark.parametrize(("spec", "rounds"), [("none", 50), ("sign", 50), ("topk:0.25", 20)])
def test_choco_gossip(spec, rounds):
    ours, _ = run_engine(make_algorithm("choco", gamma=0.4), spec, rounds)
    assert_same(ours, ref.choco(X0(), W, rounds, 0.4, row_compressor(spec)))


@pytest.mark.parametrize(("spec", "rounds"), [("sign", 50), ("topk:0.25", 20)])
def test_choco_sgd_full_gradient(spec, rounds):
    ours, _ = run_engine(make_algorithm("choco", gamma=0.3, eta=0.05), spec, rounds, problem=PROBLEM)
    theirs = ref.choco(X0(), W, rounds, 0.3, row_compressor(spec), grad=full_grad(PROBLEM), eta=0.05)
    assert_same(ours, theirs)


def test_gossip_and_dpsgd():
    ours, _ = run_engine(make_algorithm("gossip", gamma=0.8), "none", 50)
    assert_same(ours, ref.gossip(X0(), W, 50, gamma=0.8))
    ours, _ = run_engine(make_algorithm("dpsgd", eta=0.05), "none", 50, problem=PROBLEM)
    assert_same(ours, ref.dpsgd(X0(), W, full_grad(PROBLEM), 0.05, 50))


@pytest.mark.parametrize("spec", ["none", "sign"])
def test_deepsqueeze(spec):
    ours, _ = run_engine(make_algorithm("deepsqueeze", gamma=0.3, eta=0.05), spec, 50,
                         problem=PROBLEM)
    theirs = ref.deepsqueeze(X0(), W, 50, 0.3, row_compressor(spec), grad=full_grad(PROBLEM),
                             eta=0.05)
    assert_same(ours, theirs)


@pytest.mark.parametrize("name", ["dcd", "ecd"])
def test_dcd_ecd(name):
    ours, _ = run_engine(make_algorithm(name, eta=0.05), "fp16" if name == "dcd" else "none", 50,
                         problem=PROBLEM)
    fn = getattr(ref, name)
    theirs = fn(X0(), W, full_grad(PROBLEM), 0.05, 50,
                row_compressor("fp16" if name == "dcd" else "none"))
    assert_same(ours, theirs, atol=1e-9)


@pytest.mark.parametrize(("spec", "rounds"), [("none", 60), ("sign", 60), ("topk:0.25", 20)])
def test_lead(spec, rounds):
    eta = 1.0 / PROBLEM.smoothness().L
    ours, eng = run_engine(make_algorithm("lead", eta=eta, alpha=0.3, gamma_dual=0.6), spec,
                           rounds, problem=PROBLEM)
    theirs = ref.lead(X0(), W, full_grad(PROBLEM), eta, 0.3, 0.6, rounds, row_compressor(spec))
    assert_same(ours, theirs)
    d = np.stack([eng.nodes[i].state["d"].numpy() for i in range(N)])
    h = np.stack([eng.nodes[i].state["h"].numpy() for i in range(N)])
    gap = np.stack([eng.nodes[i].state["gap"].numpy() for i in range(N)])
    assert np.abs(d.sum(0)).max() < 1e-9  # Σ_i d_i = 0
    np.testing.assert_allclose(gap, W @ h - h, atol=1e-12)  # hw − h


def test_lead_without_compression_is_nids():
    eta = 1.0 / PROBLEM.smoothness().L
    ours, _ = run_engine(make_algorithm("lead", eta=eta, alpha=1.0, gamma_dual=1.0), "none", 80,
                         problem=PROBLEM)
    assert_same(ours, ref.nids(X0(), W, full_grad(PROBLEM), eta, 80))


def test_prox_lead():
    eta = 1.0 / LASSO.smoothness().L
    ours, _ = run_engine(make_algorithm("prox-lead", eta=eta, alpha=0.5, gamma_dual=1.0), "sign",
                         60, problem=LASSO)
    prox = lambda v, e: LASSO.regularizer.prox_numpy(v, e)  # noqa: E731
    theirs = ref.prox_lead(X0(), W, full_grad(LASSO), eta, 0.5, 1.0, 60, row_compressor("sign"),
                           prox)
    assert_same(ours, theirs)


@pytest.mark.parametrize(("spec", "rounds"), [("none", 60), ("topk:0.25", 20)])
def test_beer(spec, rounds):
    eta = 0.2 / PROBLEM.smoothness().L
    ours, eng = run_engine(make_algorithm("beer", eta=eta, gamma=0.4), spec, rounds,
                           problem=PROBLEM)
    theirs = ref.beer(X0(), W, full_grad(PROBLEM), eta, 0.4, rounds, row_compressor(spec))
    assert_same(ours, theirs)
    v = np.stack([eng.nodes[i].state["v"].numpy() for i in range(N)])
    gp = np.stack([eng.nodes[i].state["grad_prev"].numpy() for i in range(N)])
    np.testing.assert_allclose(v.mean(0), gp.mean(0), atol=1e-12)  # tracking invariant


def _seed_edges_like_reference(eng, basis, m, k, r):
    """Give both ends of each edge the reference's initial factors (sorted edges, P then Q)."""
    for lo in range(N):
        for hi in TOPO.view(lo).neighbors:
            if hi <= lo:
                continue
            P = torch.from_numpy(basis(lo, hi, "P", (m, r)))
            Q = torch.from_numpy(basis(lo, hi, "Q", (k, r)))
            for a, b in ((lo, hi), (hi, lo)):
                eng.nodes[a].state[f"P{b}"][0].copy_(P)
                eng.nodes[a].state[f"Q{b}"][0].copy_(Q)


@pytest.mark.parametrize("rank", [1, 2])
def test_powergossip(rank):
    m, k = 6, 5
    shape = (m, k)
    eng = Engine(make_algorithm("powergossip", gamma=1.2, rank=rank), TOPO, x0_fn(2, shape),
                 layout=Layout([shape]))
    _seed_edges_like_reference(eng, ref.default_basis(0), m, k, rank)
    Ms = np.stack([eng.nodes[i].x.numpy().reshape(shape).copy() for i in range(N)])
    theirs = ref.powergossip(Ms, W, 41, 1.2, rank=rank)
    for r in range(40):
        eng.step()
        ours = np.stack([eng.nodes[i].x.numpy().reshape(shape) for i in range(N)])
        np.testing.assert_allclose(ours, theirs[r + 2], atol=1e-10, err_msg=f"round {r + 1}")
    np.testing.assert_allclose(ours.mean(0), Ms.mean(0), atol=1e-13)  # average preserved
    for i in range(N):  # both ends hold bit-identical factors
        for j in TOPO.view(i).neighbors:
            assert torch.equal(eng.nodes[i].state[f"P{j}"][0], eng.nodes[j].state[f"P{i}"][0])
            assert torch.equal(eng.nodes[i].state[f"Q{j}"][0], eng.nodes[j].state[f"Q{i}"][0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_powergossip_batched_gram_schmidt_equals_each_factors(dtype):
    """Gram–Schmidt over [A, n, r] (the block's per-arc factors) gives every arc the bits of
    Gram–Schmidt on that factor alone (a fresh tensor, as a per-edge factor)."""
    from gossip.algorithms.arcs import aligned_arcs
    from gossip.algorithms.powergossip import EPS, orthonormalize_arcs

    def orthonormalize(m: torch.Tensor) -> torch.Tensor:
        for c in range(m.shape[1]):
            col = m[:, c]
            col.div_(col.norm() + EPS)
            if c + 1 < m.shape[1]:
                rest = m[:, c + 1 :]
                rest.sub_(torch.outer(col, col @ rest))
        return m

    gen = torch.Generator().manual_seed(0)
    for n, r in [(1, 1), (7, 1), (33, 2), (100, 3), (5, 5), (257, 2)]:
        f = aligned_arcs(6, (n, r), dtype, torch.device("cpu"))
        f.copy_(torch.randn(6, n, r, generator=gen, dtype=dtype))
        alone = [orthonormalize(f[a].clone()) for a in range(6)]
        orthonormalize_arcs(f)
        for a in range(6):
            assert f[a].data_ptr() % 64 == 0
            assert torch.equal(f[a], alone[a]), (n, r, a)


def test_powergossip_redraws_each_arc_from_its_edge_stream_at_its_own_count():
    """A collapsed factor is redrawn from the edge's stream (both ends of an edge draw it), at
    that arc's count of draws this round, even when arcs of one redraw stand at different counts."""
    from gossip.rng import Stream

    topo = topologies.build("ring", 5)
    eng = Engine(make_algorithm("powergossip"), topo, x0_fn(2, (3, 2)), layout=Layout([(3, 2)]),
                 seed=4)
    eng.step()
    block = eng.block
    work = block.workspace["edges"]
    f = block.arc_state["P{j}"][0]
    arcs = work.arcs.route.arcs
    work.redraw(block, f, torch.tensor([a in (0, 3) for a in range(len(arcs))]))
    work.redraw(block, f, torch.tensor([a in (0, 5) for a in range(len(arcs))]))
    for a, draws in ((0, 2), (3, 1), (5, 1)):
        i, j = arcs[a]
        edge = Stream(4, (min(i, j) << 32 | max(i, j),), "edge")
        edge.begin_round(block.round)
        for _ in range(draws):
            want = edge.normal(f[a].numel(), dtype=f.dtype).view(f[a].shape)
        assert torch.equal(f[a], want), arcs[a]


def test_powergossip_full_rank_square_equals_relaxed_gossip():
    shape = (5, 5)
    eng = Engine(make_algorithm("powergossip", gamma=1.1, rank=5, eps=0.0), TOPO,
                 x0_fn(3, shape), layout=Layout([shape]))
    X = np.stack([eng.nodes[i].x.numpy().copy() for i in range(N)])
    for _ in range(20):
        eng.step()
        X = X + 1.1 * (W @ X - X)
    ours = np.stack([eng.nodes[i].x.numpy() for i in range(N)])
    np.testing.assert_allclose(ours, X, atol=1e-11)


def test_bad_hyperparameters_and_problems_are_refused_before_any_message():
    with pytest.raises(ConfigError, match="gamma_dual"):
        make_algorithm("lead", gamma_dual=1.5)
    with pytest.raises(ConfigError, match="alpha"):
        make_algorithm("lead", alpha=0.0)
    with pytest.raises(ConfigError, match="regularizer"):
        Engine(make_algorithm("prox-lead", eta=0.1), TOPO, x0_fn(), oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="needs gradients"):
        Engine(make_algorithm("lead"), TOPO, x0_fn())
    with pytest.raises(ConfigError, match="symmetric"):
        Engine(make_algorithm("lead"), topologies.build("directed-exponential", 8), x0_fn(),
               oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="static"):
        Engine(make_algorithm("beer"), topologies.build("matchings", 8), x0_fn(),
               oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="rank"):
        Engine(make_algorithm("powergossip"), TOPO, x0_fn(), compressor="topk:0.5")
    with pytest.raises(ValueError, match="finite sum|estimator"):
        from gossip.problems import Consensus

        Consensus(torch.zeros(N, D, dtype=torch.float64)).oracle(0, torch.Generator(), "sgd")
