"""K-GT and decentralized Scaffnew (local training with a correction): the per-node code equals
the matrix form, K = 1 is gradient tracking (NEXT form), p = 1 is exact diffusion, the exact
optimum with a constant step, resume, lost messages and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.algorithms.local_tracking import COIN
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.rng import Stream
from tests.helpers import reference_tracking as reft
from tests.helpers.algorithm_setup import (
    HETERO,
    PROBLEM,
    TOPO,
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


def coins(seed: int, p: float, rounds: int) -> list[bool]:
    """The shared coin of rounds 1..rounds, drawn as the method draws it."""
    s = Stream(seed, [0], COIN)
    out = []
    for t in range(1, rounds + 1):
        s.begin_round(t)
        out.append(float(s.uniform(1, dtype=torch.float64)[0, 0]) < p)
    return out


def stacked(eng, key):
    return np.stack([eng.nodes[i].state[key].numpy() for i in sorted(eng.nodes)])


@pytest.mark.parametrize(("K", "eta_s"), [(3, 1.0), (4, 0.7)])
def test_kgt_equals_matrix_form(K, eta_s):
    eta = 0.1 / L
    ours, eng = run_engine(make_algorithm("k-gt", eta=eta, local_steps=K, eta_s=eta_s), "none", 30,
                           problem=PROBLEM)
    assert_same(ours, reft.kgt(X0(), W, full_grad(PROBLEM), eta, eta_s, K, 30))
    np.testing.assert_allclose(stacked(eng, "kgt.c").sum(0), 0.0, atol=1e-12)  # Σ c = 0
    assert stacked(eng, "kgt.exchanges").tolist() == [30 // K] * 8


def test_kgt_with_one_local_step_is_next_gradient_tracking():
    """K = 1: x ← W(x − ηy), y ← Wy + Δ∇f with η = η_c η_s (NEXT's adapt-then-combine x), which
    is not DIGing's x ← Wx − ηy."""
    eta, eta_s = 0.2 / L, 0.5
    ours, _ = run_engine(make_algorithm("k-gt", eta=eta, local_steps=1, eta_s=eta_s), "none", 40,
                         problem=PROBLEM)
    assert_same(ours, reft.gt_next(X0(), W, full_grad(PROBLEM), eta * eta_s, 40))
    diging, _ = run_engine(make_algorithm("diging", eta=eta * eta_s), "none", 40, problem=PROBLEM)
    assert np.abs(ours[5] - diging[5]).max() > 1e-6


@pytest.mark.parametrize(("p", "tau"), [(0.3, 0.5), (0.6, 1.0)])
def test_scaffnew_equals_matrix_form(p, tau):
    eta, rounds = 0.5 / L, 40
    ours, eng = run_engine(make_algorithm("scaffnew", eta=eta, p=p, tau=tau), "none", rounds,
                           problem=PROBLEM, seed=5)
    heads = coins(5, p, rounds)
    assert 0 < sum(heads) < rounds  # rounds with and without messages
    assert_same(ours, reft.scaffnew(X0(), W, full_grad(PROBLEM), eta, p, tau, heads, rounds))
    np.testing.assert_allclose(stacked(eng, "scaffnew.h").sum(0), 0.0, atol=1e-12)  # Σ h = 0
    assert stacked(eng, "scaffnew.exchanges").tolist() == [sum(heads)] * 8


def test_scaffnew_with_p_one_is_exact_diffusion():
    eta = 0.5 / L
    ours, _ = run_engine(make_algorithm("scaffnew", eta=eta, p=1.0, tau=0.5), "none", 40,
                         problem=PROBLEM)
    assert_same(ours, reft.exact_diffusion(X0(), W, full_grad(PROBLEM), eta, 40))


def run_hetero(name, rounds, network=None, seed=1, **hp):
    topo = topologies.build("ring", 8)
    x0 = HETERO.initial_point()
    eng = Engine(make_algorithm(name, **hp), topo, lambda i: x0, compressor="none",
                 network=network, oracles=lambda i, gen: HETERO.oracle(i, gen), seed=seed)
    for _ in range(rounds):
        eng.step()
    return eng


@pytest.mark.parametrize(("name", "hp", "rounds"), [
    ("k-gt", {"local_steps": 5, "eta": 0.2}, 1500),
    ("scaffnew", {"p": 0.3, "eta": 1.0}, 1000),
])
def test_exact_optimum_with_a_constant_step(name, hp, rounds):
    """Heterogeneous least squares on a ring, constant step, communicating every K-th round /
    with probability p: the exact optimum (to rounding), not a neighborhood of it."""
    eta = hp["eta"] / HETERO.smoothness().L
    eng = run_hetero(name, rounds, **(hp | {"eta": eta}))
    assert distance(eng, HETERO) < 1e-12


@pytest.mark.parametrize(("name", "hp"), [
    ("k-gt", {"local_steps": 4}),
    ("scaffnew", {"p": 0.3}),
])
def test_resume_equals_uninterrupted(name, hp):
    """Saved after 7 rounds (inside a K-GT period; the coin keyed by the round), loaded into a
    fresh engine: the same iterates as the uninterrupted run, bit for bit."""
    def engine():
        return Engine(make_algorithm(name, eta=0.2 / L, **hp), TOPO, x0_fn(), compressor="none",
                      oracles=oracles(PROBLEM), seed=3)

    straight, resumed = stopped_and_resumed(engine, rounds=15, stop=7)
    for i in range(8):
        np.testing.assert_array_equal(resumed.nodes[i].x.numpy(), straight.nodes[i].x.numpy())


@pytest.mark.parametrize(("name", "hp", "key", "rounds"), [
    ("k-gt", {"local_steps": 5, "eta": 0.2}, "kgt.c", 2500),
    ("scaffnew", {"p": 0.3, "eta": 1.0}, "scaffnew.h", 1500),
])
def test_lost_messages_drop_the_edge_and_keep_the_exact_optimum(name, hp, key, rounds):
    """Under 20 % loss an edge either of whose messages is lost sits the exchange out at both
    ends: Σ c (Σ h) stays 0 and the run still reaches x*."""
    eta = hp["eta"] / HETERO.smoothness().L
    eng = run_hetero(name, rounds, network="loss=0.2", **(hp | {"eta": eta}))
    np.testing.assert_allclose(stacked(eng, key).sum(0), 0.0, atol=1e-11)
    assert distance(eng, HETERO) < 1e-10  # slower than without loss, still exact
    lossless = run_hetero(name, 30, **(hp | {"eta": eta}))
    lossy = run_hetero(name, 30, network="loss=0.2", **(hp | {"eta": eta}))
    assert not np.array_equal(stacked(lossless, key), stacked(lossy, key))  # loss did act


def test_refusals_name_the_fix():
    with pytest.raises(ConfigError, match="--compressor none"):
        Engine(make_algorithm("k-gt"), TOPO, x0_fn(), compressor="topk:0.1", oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="--compressor none"):
        Engine(make_algorithm("scaffnew"), TOPO, x0_fn(), compressor="lead:2", oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="local_steps"):
        make_algorithm("k-gt", local_steps=0)
    with pytest.raises(ConfigError, match="p = 0"):
        make_algorithm("scaffnew", p=0.0)
    with pytest.raises(ConfigError, match="tau"):
        make_algorithm("scaffnew", tau=1.5)
