"""Adapt-then-combine methods (atc-dgd, atc-diging, next): per-node code equals the matrix form,
the trackers reach the exact optimum with a constant step (where DIGing's step limit is lower),
ATC-DGD keeps DGD's O(η) bias, resume equals the uninterrupted run, and lost messages."""

from __future__ import annotations

import numpy as np
import pytest

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.helpers import reference_tracking as reft
from tests.helpers.algorithm_setup import (
    HETERO,
    PROBLEM,
    X0,
    W,
    assert_same,
    distance,
    full_grad,
    oracles,
    run_engine,
    x0_fn,
)
from tests.helpers.resume import stopped_and_resumed

L = PROBLEM.smoothness().L
TRACKERS = (("atc-diging", "atc"), ("next", "cta"))


def stacked(eng, key):
    return np.stack([eng.nodes[i].state[key].numpy() for i in sorted(eng.nodes)])


def test_atc_dgd_equals_matrix_form():
    for eta, gamma in ((0.2 / L, 1.0), (0.1 / L, 0.7)):
        ours, _ = run_engine(make_algorithm("atc-dgd", eta=eta, gamma=gamma), "none", 40,
                             problem=PROBLEM)
        assert_same(ours, reft.atc_dgd(X0(), W, full_grad(PROBLEM), eta, 40, gamma))


@pytest.mark.parametrize(("name", "tracker"), TRACKERS)
def test_trackers_equal_matrix_form(name, tracker):
    """x ← W(x − ηy); y ← W(y + Δg) (ATC-DIGing) or W y + Δg (NEXT); Σ y = Σ ∇f(x)."""
    eta = 0.3 / L
    ys = {}
    ours, eng = run_engine(make_algorithm(name, eta=eta), "none", 60, problem=PROBLEM)
    theirs = reft.atc_tracking(X0(), W, full_grad(PROBLEM), eta, 60, tracker,
                               trace=lambda t, s: ys.__setitem__(t, s["Y"]))
    assert_same(ours, theirs)
    y = stacked(eng, "y")
    if tracker == "cta":  # a round ends NEXT's tracker with W y; + ∇f(x_new) − g opens the next
        np.testing.assert_allclose(y + full_grad(PROBLEM)(ours[-1]) - stacked(eng, "g"), ys[60],
                                   atol=1e-10)
    else:  # ATC-DIGing's round 60 ends with y⁵⁹ (round 61 opens with its correction and mix)
        np.testing.assert_allclose(y, ys[59], atol=1e-10)
    np.testing.assert_allclose(stacked(eng, "y").sum(0), stacked(eng, "g").sum(0), atol=1e-11)


def test_the_orders_differ():
    """The three trackers are different methods (the same start, different iterates)."""
    eta = 0.3 / L
    runs = {n: run_engine(make_algorithm(n, eta=eta), "none", 5, problem=PROBLEM)[0][-1]
            for n in ("diging", "atc-diging", "next")}
    assert not np.allclose(runs["diging"], runs["next"])
    assert not np.allclose(runs["atc-diging"], runs["next"])


@pytest.mark.parametrize(("name", "tracker"), TRACKERS)
def test_time_varying_graph_matrix_form(name, tracker):
    """On matchings (a different symmetric W every round) the recursion uses W(t)."""
    topo = topologies.build("matchings", 8)
    eta = 0.2 / L
    eng = Engine(make_algorithm(name, eta=eta), topo, x0_fn(), oracles=oracles(PROBLEM))
    theirs = reft.atc_tracking(X0(), lambda t: topo.at_round(t).dense(), full_grad(PROBLEM), eta,
                               20, tracker)
    for _ in range(20):
        eng.step()
    np.testing.assert_allclose(np.stack([eng.nodes[i].x.numpy() for i in range(8)]), theirs[-1],
                               atol=1e-10)


def run_to(name, rounds, eta, topo=None, network=None, seed=1):
    x0 = HETERO.initial_point()
    eng = Engine(make_algorithm(name, eta=eta), topo or topologies.build("ring", 8),
                 lambda i: x0, oracles=lambda i, gen: HETERO.oracle(i, gen), network=network,
                 seed=seed)
    for _ in range(rounds):
        eng.step()
    return eng


@pytest.mark.parametrize("name", ["atc-diging", "next"])
def test_linear_convergence_to_the_exact_optimum(name):
    """Heterogeneous least squares on a ring, constant step 0.5/L: the exact optimum,
    linearly (measured: 4e-9 after 150 rounds, 6e-17 after 300)."""
    eng = run_to(name, 150, 0.5 / HETERO.smoothness().L)
    mid = distance(eng, HETERO)
    for _ in range(150):
        eng.step()
    end = distance(eng, HETERO)
    assert end < 1e-14 and end < 1e-5 * mid  # still contracting by a fixed factor


def test_atc_trackers_take_a_step_diging_cannot():
    """The paper's point (Nedić et al. 2017): ATC tolerates larger steps. At 1.5/L on the
    8-ring DIGing diverges while both ATC trackers reach the optimum."""
    eta = 1.5 / HETERO.smoothness().L
    assert not distance(run_to("diging", 300, eta), HETERO) < 1.0
    for name in ("atc-diging", "next"):
        assert distance(run_to(name, 300, eta), HETERO) < 1e-10


def test_atc_dgd_stops_at_a_step_sized_bias():
    """ATC-DGD is DGD: a constant step leaves it O(η) from x* on heterogeneous data; halving
    the step about halves the distance (squared: quarters it), and a tracker removes it."""
    L_h = HETERO.smoothness().L
    far, near = (distance(run_to("atc-dgd", 1500, c / L_h), HETERO) for c in (0.4, 0.2))
    assert 1e-6 < near < far
    assert 2.0 < far / near < 8.0


@pytest.mark.parametrize("name", ["atc-dgd", "atc-diging", "next"])
def test_checkpoint_resume_continues_the_same_run(name):
    topo = topologies.build("ring", 8)

    def engine():
        return Engine(make_algorithm(name, eta=0.1 / L), topo, x0_fn(), oracles=oracles(PROBLEM),
                      seed=3)

    straight, resumed = stopped_and_resumed(engine, rounds=14, stop=7)
    for i in range(8):
        np.testing.assert_array_equal(resumed.nodes[i].x.numpy(), straight.nodes[i].x.numpy())


@pytest.mark.parametrize("name", ["atc-diging", "next"])
def test_lost_messages_drop_the_edge_and_keep_the_exact_optimum(name):
    """Under 10 % loss an edge sits out a phase at both ends: each W_t stays doubly stochastic,
    Σ y = Σ ∇f holds and the run still reaches x*."""
    eng = run_to(name, 600, 0.5 / HETERO.smoothness().L, network="loss=0.1")
    np.testing.assert_allclose(stacked(eng, "y").sum(0), stacked(eng, "g").sum(0), atol=1e-10)
    assert distance(eng, HETERO) < 1e-9


def test_lost_messages_are_refused_on_a_directed_graph():
    """An edge has no reverse on a directed graph: the loss policy refuses it, naming why."""
    directed = topologies.build("directed-exponential", 8)
    with pytest.raises(ConfigError, match="edge"):
        Engine(make_algorithm("next"), directed, x0_fn(), oracles=oracles(PROBLEM),
               network="loss=0.1").step()


def test_atc_dgd_renormalizes_a_lost_message():
    """Like D-PSGD: a lost neighbor's weight goes to the receiver's own term, so the mix stays
    an average and the run stays in DGD's neighborhood of x*."""
    eta = 0.2 / HETERO.smoothness().L
    lossless = distance(run_to("atc-dgd", 800, eta), HETERO)
    lossy = distance(run_to("atc-dgd", 800, eta, network="loss=0.1"), HETERO)
    assert lossy < 10 * lossless
