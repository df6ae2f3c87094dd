"""beer-arcs and prox-lead-arcs (BEER and Prox-LEAD with their public copies kept per arc,
updated at both ends only on delivery): the block code equals its float64 [A, d] matrix form
under the same drops, it is the plain method without loss, BEER's tracker sum is kept under any
loss (the lossy contrast with the plain methods and the refusals are
tests/algorithms/test_lead_cgt_arcs.py's, for every per-arc variant)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import topologies
from tests.algorithms.test_lead_cgt_arcs import ArcForm, N, engine, grads, lasso, least_squares


def beer_arcs_form(topo, problem, spec, network, seed, eta, gamma, rounds):
    """BEER's round over the arcs: ``D^g`` of the copies before the exchange, ``D^h`` after."""
    form = ArcForm(topo, spec, network, seed)
    X = problem.initial_point().expand(topo.n, -1).clone()
    V = grads(problem, X)
    G_prev = V.clone()
    X = X - eta * V
    Hx = torch.zeros(len(form.arcs), X.shape[1], dtype=X.dtype)
    Hg, Dg = torch.zeros_like(Hx), torch.zeros_like(X)
    for t in range(1, rounds + 1):
        G = grads(problem, X)
        V = V + gamma * Dg + G - G_prev
        G_prev = G
        Hx, Dx = form.exchange(X, Hx, t, 1.0)
        Hg, Dg = form.exchange(V, Hg, t, 1.0, "tracker")
        X = X + gamma * Dx - eta * V
    return X, V


def prox_lead_arcs_form(topo, problem, spec, network, seed, eta, alpha, gd, rounds):
    form = ArcForm(topo, spec, network, seed)
    prox = lambda Z: F.softshrink(Z, problem.l1 * eta)  # noqa: E731
    X = problem.initial_point().expand(topo.n, -1).clone()
    X = prox(X - eta * grads(problem, X))
    d = torch.zeros_like(X)
    H = torch.zeros(len(form.arcs), X.shape[1], dtype=X.dtype)
    for t in range(1, rounds + 1):
        G = grads(problem, X)
        H, Dy = form.exchange(X - eta * G - eta * d, H, t, alpha)
        d = d - gd / (2 * eta) * Dy
        X = prox(X - eta * G - eta * d)
    return X, d


@pytest.mark.parametrize("network", ["none", "loss=0.3"])
@pytest.mark.parametrize("spec", ["topk:0.3", "qsgd:4bit"])
def test_beer_arcs_equals_its_matrix_form(spec, network):
    topo = topologies.build("erdos-renyi:p=0.4", N, seed=2)
    problem = least_squares()
    eng = engine("beer-arcs", topo, problem, spec, network)
    eng.run(8)
    X, V = beer_arcs_form(topo, problem, spec, network, 3, eng.algorithm.eta,
                          eng.algorithm.gamma, 8)
    torch.testing.assert_close(eng.block.x, X, rtol=0, atol=1e-12)
    torch.testing.assert_close(eng.block.state["v"], V, rtol=0, atol=1e-12)
    if network != "none":
        assert eng.record()["messages_lost_total"] > 10


@pytest.mark.parametrize("network", ["none", "loss=0.3"])
def test_prox_lead_arcs_equals_its_matrix_form(network):
    topo = topologies.build("erdos-renyi:p=0.4", N, seed=2)
    problem = lasso()
    eng = engine("prox-lead-arcs", topo, problem, "lead:2", network, alpha=0.5, gamma_dual=0.8)
    eng.run(8)
    X, d = prox_lead_arcs_form(topo, problem, "lead:2", network, 3, eng.algorithm.eta, 0.5, 0.8, 8)
    torch.testing.assert_close(eng.block.x, X, rtol=0, atol=1e-12)
    torch.testing.assert_close(eng.block.state["d"], d, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("plain", "spec", "rounds"), [
    ("beer", "none", 60), ("beer", "topk:0.2", 60), ("beer", "lead:2", 12),
    ("prox-lead", "lead:2", 12), ("prox-lead", "topk:0.2", 60),
])
def test_without_loss_it_is_the_plain_method(plain, spec, rounds):
    """Every arc of a node draws the node's numbers: its out-copies stay the plain method's
    copy, the iterates are the plain method's up to the order of the sums, the bits the same."""
    topo = topologies.build("ring", N)
    problem = lasso() if plain == "prox-lead" else least_squares()
    runs = []
    for name in (plain, plain + "-arcs"):
        eng = engine(name, topo, problem, spec)
        eng.run(rounds, log_every=rounds)
        runs.append((eng.block.x.clone(), eng.record()["bits_per_node"]))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=0, atol=1e-12)
    assert runs[0][1] == runs[1][1]


@pytest.mark.parametrize("network", ["loss=0.3", "loss=ge:p_gb=0.1,p_bg=0.3"])
def test_beer_arcs_keeps_the_tracker_sum_and_both_ends_agree(network):
    """``Σ_i v_i = Σ_i ∇f_i(x_i)`` of the gradients the last round took (``grad_prev``)."""
    topo = topologies.build("ring", 16)
    problem = least_squares(n=16)
    eng = engine("beer-arcs", topo, problem, "topk:0.3", network)
    eng.run(60)
    assert eng.record()["messages_lost_total"] > 100
    v, gp = eng.block.state["v"], eng.block.state["grad_prev"]
    assert float((v.sum(0) - gp.sum(0)).norm()) <= 1e-12 * float(gp.norm())
    for ch in eng.block.workspace["channels"]:
        arcs = ch.arcs
        row = {a: r for r, a in enumerate(arcs.schedule.arcs)}
        assert torch.equal(arcs.out[[row[a] for a in arcs.schedule.incoming]], arcs.inc)
