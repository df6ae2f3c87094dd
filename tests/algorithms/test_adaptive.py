"""Adaptive methods equal their dense references: 0/1 Adam, Signum vote, Adasum (all-reduce),
DADAM, tracked AMSGrad and DES-LOC (gossip on any graph)."""

from __future__ import annotations

import math

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.algorithms.adasum import adasum_pair_rows
from gossip.compress import make as make_compressor
from gossip.errors import ConfigError
from gossip.layout import Layout
from tests.helpers import reference_adaptive as ref
from tests.helpers.reference_adaptive import QuadraticOracle, quadratic_problem, run_engine


def _close(a, b, tol=1e-11):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_zero_one_adam_equals_reference_and_sends_only_on_its_schedule():
    n, d, rounds = 4, 29, 24
    data, grads = quadratic_problem(n, d, seed=3)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    hp = dict(eta=0.03, var_freeze_step=8, var_update_scaler=2, local_step_scaler=2,
              local_step_clipper=4)
    eng, X = run_engine(make_algorithm("zero-one-adam", **hp), topologies.build("complete", n),
                        x0, data, rounds)
    _close(X, ref.zero_one_adam(x0, grads, rounds, **hp))
    assert float((X - X[0]).abs().max()) == 0.0  # round 24 is a sync round
    # the schedule: T_v = 1, 2, 4, 6, 8 (interval 1, 1, 2, 2, 4 after 2 refreshes each), the
    # other phase-A rounds 1-bit; phase B syncs at the multiples of 1, 1, 2, 2, 4, 4, 4, …
    fp_pad, unit = -(-d // n) * n, n * math.lcm(n, 8)
    fp_bytes = 2 * (n - 1) * (fp_pad // n) * 8
    bit_bytes = 2 * (n - 1) * ((-(-d // unit) * unit) // n // 8 + 8)
    refresh = [1, 2, 4, 6, 8]
    phase_b, interval, counter, syncs = range(9, rounds + 1), 1, 0, 0
    for t in phase_b:
        syncs += t % interval == 0
        counter += 1
        if counter == 2:
            counter, interval = 0, min(4, 2 * interval)
    expected = len(refresh) * fp_bytes + (8 - len(refresh) + syncs) * bit_bytes
    assert eng.transport.bytes_sent[0] == expected
    assert syncs < len(phase_b)  # local steps really skipped rounds


@pytest.mark.parametrize(("n", "byzantine"), [(4, ()), (5, (1,)), (6, (0, 3))])
def test_signum_vote_equals_reference(n, byzantine):
    d, rounds = 21, 9
    data, grads = quadratic_problem(n, d, seed=n)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    hp = dict(eta=0.01, beta=0.5, weight_decay=0.1, byzantine=byzantine)
    eng, X = run_engine(make_algorithm("signum", **hp), topologies.build("complete", n), x0,
                        data, rounds)
    _close(X, ref.signum_vote(x0, grads, rounds, **hp))
    chunk = (-(-d // (n * math.lcm(n, 8))) * n * math.lcm(n, 8)) // n
    up, down = chunk // 8, chunk // 8 * (2 if n % 2 == 0 else 1)
    assert eng.transport.bytes_sent[0] == rounds * (n - 1) * (up + down)


def test_signum_tie_gives_zero():
    """Two nodes with opposite gradients: every coordinate ties, nobody moves."""
    data, _ = quadratic_problem(2, 6, seed=1)
    A, b, s = data
    data = (A, b, torch.tensor([1.0, -1.0], dtype=torch.float64))
    A[1], b[1] = A[0], b[0]
    x0 = torch.ones(2, 6, dtype=torch.float64)
    _, X = run_engine(make_algorithm("signum", eta=0.1), topologies.build("complete", 2), x0,
                      data, 3)
    assert torch.equal(X, x0)


def test_adasum_pair_properties():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 1, 30, generator=gen, dtype=torch.float64)
    out = torch.empty_like(a)
    _close(adasum_pair_rows(a, a, out).clone(), a)
    b_perp = b - (a @ b.T) / (a @ a.T) * a
    _close(adasum_pair_rows(a, b_perp, out).clone(), a + b_perp)
    _close(adasum_pair_rows(a, b, out).clone(), adasum_pair_rows(b, a, torch.empty_like(a)))


@pytest.mark.parametrize("local", ["adam", "sgd"])
def test_adasum_equals_reference(local):
    from gossip.engine import Engine

    n, shapes, rounds = 4, [(3, 4), (7,)], 6
    d = 19
    data, grads = quadratic_problem(n, d, seed=5)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    eng = Engine(make_algorithm("adasum", eta=0.05, local=local), topologies.build("complete", n),
                 lambda i: x0[i], layout=Layout(shapes), seed=1,
                 oracles=lambda i, gen: QuadraticOracle(data, i))
    eng.run(rounds, log_every=rounds)
    X = torch.stack([eng.nodes[i].x for i in range(n)])
    _close(X, ref.adasum(x0, grads, rounds, eta=0.05, sizes=[12, 7], local=local))
    # log2(4) = 2 full vectors a round, to the partner only
    assert eng.transport.bytes_sent[0] == rounds * 2 * d * 8


def test_adasum_needs_a_power_of_two():
    data, _ = quadratic_problem(6, 4)
    with pytest.raises(ConfigError, match="power-of-two node count, got 6; use 4 or 8"):
        run_engine(make_algorithm("adasum"), topologies.build("complete", 6),
                   torch.zeros(6, 4, dtype=torch.float64), data, 1)


GOSSIP_CASES = [
    ("dadam", {"eta": 0.02}, ref.dadam),
    ("dadam", {"eta": 0.02, "gossip_steps": 3}, ref.dadam),
    ("tracked-amsgrad", {"eta": 0.02}, ref.tracked_amsgrad),
    ("tracked-amsgrad", {"eta": 0.02, "gossip_steps": 2}, ref.tracked_amsgrad),
    ("desloc", {"eta": 0.02, "period_x": 2, "period_m": 3, "period_v": 5}, ref.desloc),
    ("desloc", {"eta": 0.02, "period_x": 3, "period_m": 0, "period_v": 0, "gossip_steps": 2,
                "clip": 0.0}, ref.desloc),
    ("desloc", {"eta": 0.02, "period_x": 2, "period_m": 4, "period_v": 0, "clip": 0.5}, ref.desloc),
]


@pytest.mark.parametrize(("name", "hp", "reference"), GOSSIP_CASES)
def test_gossip_adaptive_equals_reference(name, hp, reference):
    n, d, rounds = 6, 11, 15
    topo = topologies.build("erdos-renyi:p=0.5", n, seed=2)
    W = torch.tensor(topo.dense(), dtype=torch.float64)
    data, grads = quadratic_problem(n, d, seed=7)
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, X = run_engine(make_algorithm(name, **hp), topo, x0, data, rounds)
    _close(X, reference(x0, grads, rounds, W, **hp))


def test_tracker_mean_equals_mean_of_vhat_every_round():
    n, d = 6, 9
    topo = topologies.build("ring", n)
    W = torch.tensor(topo.dense(), dtype=torch.float64)
    _, grads = quadratic_problem(n, d, seed=4, scales=[0.2, 0.5, 1, 2, 5, 3])
    gaps = []
    ref.tracked_amsgrad(torch.zeros(n, d, dtype=torch.float64), grads, 40, W, eta=0.01,
                        track=lambda t, U, V: gaps.append(float((U.mean(0) - V.mean(0)).abs().max()
                                                                / V.abs().max())))
    assert max(gaps) < 1e-13
    # and the engine's u is the reference's
    from gossip.engine import Engine

    data, grads = quadratic_problem(n, d, seed=4, scales=[0.2, 0.5, 1, 2, 5, 3])
    eng = Engine(make_algorithm("tracked-amsgrad", eta=0.01), topo,
                 lambda i: torch.zeros(d, dtype=torch.float64),
                 oracles=lambda i, gen: QuadraticOracle(data, i), seed=0)
    eng.run(40, log_every=40)
    U = torch.stack([eng.nodes[i].state["u"] for i in range(n)])
    Vh = torch.stack([eng.nodes[i].state["v_max"] for i in range(n)])
    assert float((U.mean(0) - Vh.mean(0)).abs().max() / Vh.abs().max()) < 1e-13


def test_gossip_adaptive_refuse_compressors():
    data, _ = quadratic_problem(4, 5)
    with pytest.raises(ConfigError, match="dadam mixes exact models: use --compressor none"):
        run_engine(make_algorithm("dadam"), topologies.build("ring", 4),
                   torch.zeros(4, 5, dtype=torch.float64), data, 1, compressor="topk:0.5")


@pytest.mark.parametrize(("spec", "gamma"), [("topk:4", 0.3), ("none", 1.0)])
def test_choco_amsgrad_equals_reference_and_keeps_the_tracker_mean(spec, gamma):
    from gossip.engine import Engine

    n, d, rounds = 6, 11, 25
    topo = topologies.build("ring", n)
    W = torch.tensor(topo.dense(), dtype=torch.float64)
    data, grads = quadratic_problem(n, d, seed=8, scales=[0.2, 0.5, 1, 2, 5, 3])
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    eng = Engine(make_algorithm("choco-amsgrad", eta=0.02, gamma=gamma), topo, lambda i: x0[i],
                 compressor=spec, oracles=lambda i, gen: QuadraticOracle(data, i), seed=0)
    eng.run(rounds, log_every=rounds)
    X = torch.stack([eng.nodes[i].x for i in range(n)])
    compress = ref.topk(4) if spec != "none" else (lambda v: v.clone())
    gaps = []
    _close(X, ref.choco_amsgrad(x0, grads, rounds, W, eta=0.02, gamma=gamma, compress=compress,
                                track=lambda t, U, V: gaps.append(float((U.mean(0) - V.mean(0)).abs().max()))))
    U = torch.stack([eng.nodes[i].state["u"] for i in range(n)])
    Vh = torch.stack([eng.nodes[i].state["v_max"] for i in range(n)])
    assert float((U.mean(0) - Vh.mean(0)).abs().max() / Vh.abs().max()) < 1e-12
    assert max(gaps) < 1e-12
    # one message a round to each of 2 ring neighbors: a 24-byte header and two payloads
    payload = make_compressor(spec).max_nbytes(x0[0])
    assert eng.transport.bytes_sent[0] == rounds * 2 * (24 + 2 * payload)
