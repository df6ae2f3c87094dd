"""FedDyn, FedNova and the round's client selection (data size, power-of-choice, fair): each
against the float64 reference (tests/helpers/reference_federated.py), their reductions to
FedAvg, FedDyn's exact optimum, resume, and the refusals before round 1."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from gossip.algorithms import make_algorithm
from gossip.core.star import ClientSampler
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.algorithms.test_federated import engine, sampler_of, server_models
from tests.helpers.algorithm_setup import row_compressor
from tests.helpers.reference_federated import federated
from tests.helpers.star_problem import GRADS, PROBLEM, STAR, X0, N

LOSSES = [None] + [lambda y, i=i: PROBLEM.local_loss(i - 1, torch.from_numpy(y))
                   for i in range(1, N)]
STEPS = [1, 2, 3, 4, 5, 6, 7]


def check(name: str, rounds: int = 12, spec: str = "none", ref: dict | None = None, **hp) -> None:
    eng = engine(name, spec, **hp)
    ours = server_models(eng, rounds)
    kw = {k: hp[k] for k in ("local_steps", "eta", "server_lr", "alpha") if k in hp}
    if hp.get("selection") == "power":
        kw["power"] = (hp["clients_per_round"], LOSSES)
    theirs = federated(X0, GRADS, rounds, sampler_of(eng), **kw, **(ref or {}))
    for r, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0, err_msg=f"round {r}")
    assert np.abs(ours[-1] - ours[0]).max() > 1e-3  # the model moved: not a vacuous equality


# ---- each method against its rule -------------------------------------------------------------


def test_feddyn_matches_reference():
    check("feddyn", clients_per_round=3, local_steps=3, eta=0.05, alpha=0.3)


def test_compressed_feddyn_matches_reference():
    up, down = row_compressor("topk:0.5"), row_compressor("topk:0.5")
    check("feddyn", spec="topk:0.5", clients_per_round=3, local_steps=STEPS, eta=0.05,
          alpha=0.3, downlink_compressor="topk:0.5",
          ref={"compress": lambda v: up(0, v), "ef21": True,
               "down_compress": lambda v: down(0, v)})


def test_fednova_matches_reference():
    check("fednova", clients_per_round=4, local_steps=STEPS, eta=0.05, ref={"normalized": True})


def test_fednova_data_weighted_and_compressed_matches_reference():
    sizes = [20.0, 5.0, 40.0, 10.0, 20.0, 80.0, 15.0]
    comp = row_compressor("sign")
    check("fednova", spec="sign", clients_per_round=3, local_steps=STEPS, eta=0.05,
          aggregation="data", client_weights=sizes,
          ref={"normalized": True, "data_weights": sizes, "compress": lambda v: comp(0, v),
               "ef21": True})


# ---- reductions ------------------------------------------------------------------------------


def test_fednova_with_equal_steps_is_fedavg_and_differs_with_unequal_ones():
    hp = dict(clients_per_round=3, local_steps=4, eta=0.05)
    a = server_models(engine("fedavg", **hp), 15)
    b = server_models(engine("fednova", **hp), 15)
    for r, (u, v) in enumerate(zip(a, b, strict=True)):
        np.testing.assert_allclose(u, v, atol=1e-13, rtol=0, err_msg=f"round {r}")
    hp["local_steps"] = STEPS
    u = server_models(engine("fedavg", **hp), 15)[-1]
    v = server_models(engine("fednova", **hp), 15)[-1]
    assert np.abs(u - v).max() > 1e-3


def test_feddyn_with_alpha_zero_is_fedavg():
    hp = dict(clients_per_round=3, local_steps=4, eta=0.05, downlink_compressor="topk:0.5")
    a = server_models(engine("fedavg", "topk:0.5", **hp), 15)
    b = server_models(engine("feddyn", "topk:0.5", alpha=0.0, **hp), 15)
    for r, (u, v) in enumerate(zip(a, b, strict=True)):
        assert np.array_equal(u, v), r


def test_fednova_removes_the_objective_inconsistency_of_unequal_steps():
    """Full participation, K_i = 1..7, a decaying client step: FedAvg's iterates lean toward the
    clients of many steps (a fixed point of a reweighted objective, Wang et al.'s Theorem 1),
    FedNova's toward x* of the true one."""
    x_star = PROBLEM.solution().numpy()

    def dist(name: str) -> float:
        x = server_models(engine(name, local_steps=STEPS, eta=0.002), 400)[-1]
        return float(((x - x_star) ** 2).sum() / (x_star**2).sum())

    nova, avg = dist("fednova"), dist("fedavg")
    assert nova < 0.1 * avg, (nova, avg)


# ---- FedDyn's property: the exact optimum with inexact local solves -----------------------------


def test_feddyn_reaches_the_exact_optimum_where_fedavg_drifts():
    """Full participation, 10 local steps a round, constant steps: FedDyn's fixed point is x*
    (Δ_k = 0 for every k forces g_k = ∇f_k(x) and h = mean g_k = 0), FedAvg's is not."""
    x_star = PROBLEM.solution().numpy()
    dist = {}
    for name, hp in (("fedavg", {}), ("feddyn", {"alpha": 1.0})):
        x = server_models(engine(name, local_steps=10, eta=0.05, **hp), 300)[-1]
        dist[name] = float(((x - x_star) ** 2).sum() / (x_star**2).sum())
    assert dist["feddyn"] < 1e-20 < 1e-4 < dist["fedavg"], dist


# ---- client selection ---------------------------------------------------------------------------


def test_power_of_choice_matches_reference():
    check("fedavg", clients_per_round=2, local_steps=2, eta=0.05, selection="power",
          candidates=5)


@pytest.mark.parametrize("name,ref", [("scaffold", {"scaffold": True}),
                                      ("feddyn", {}), ("fednova", {"normalized": True})])
def test_power_of_choice_serves_every_federated_method(name, ref):
    down, up = row_compressor("topk:0.5"), row_compressor("topk:0.5")
    hp = {"alpha": 0.3} if name == "feddyn" else {}
    check(name, spec="topk:0.5", clients_per_round=2, local_steps=STEPS, eta=0.05,
          selection="power", candidates=4, downlink_compressor="topk:0.5",
          ref=ref | {"compress": lambda v: up(0, v), "ef21": True,
                     "down_compress": lambda v: down(0, v)}, **hp)


def test_power_of_choice_trains_the_clients_of_highest_loss():
    eng = engine("fedavg", clients_per_round=2, local_steps=1, eta=0.05, selection="power",
                 candidates=5)
    for t in range(1, 6):
        x = eng.nodes[0].x.clone()
        before = {i: eng.nodes[i].x.clone() for i in range(1, N)}
        eng.step()
        cands = sampler_of(eng)(t)
        loss = {i: PROBLEM.local_loss(i - 1, x) for i in cands}
        want = sorted(sorted(loss, key=lambda i: -loss[i])[:2])
        moved = [i for i in range(1, N) if not torch.equal(eng.nodes[i].x, before[i])]
        assert moved == want, (t, moved, want)
    rec = eng.record()  # candidates sent a loss (one value) and got a flag; the 2 their models
    assert rec["bits_up_per_client"] > 0


def test_fair_sampling_draws_the_least_recently_drawn():
    s = ClientSampler(3, 10, 3, "fair")
    rounds = [s.sample(t) for t in range(1, 13)]
    for a in range(0, 12, 4):  # ⌈10/3⌉ = 4 rounds cover every client (the 4th: 1 fresh + 2)
        assert set().union(*rounds[a:a + 4]) == set(range(1, 11)), rounds[a:a + 4]
    assert rounds[0] == ClientSampler(3, 10, 3, "uniform").sample(1)  # round 1: uniform
    assert ClientSampler(3, 10, 3, "fair").sample(9) == rounds[8]  # replayed from the keys
    assert s.sample(5) == rounds[4] and s.sample(12) == rounds[11]  # back and forth
    counts = np.bincount(np.concatenate(rounds), minlength=11)[1:]
    assert counts.max() - counts.min() <= 1
    off = [ClientSampler(3, 10, 3, "fair", availability=0.5).sample(t) for t in range(1, 30)]
    assert all(len(x) <= 3 for x in off)


def test_fair_and_weighted_sampling_match_reference():
    check("fedavg", clients_per_round=3, local_steps=2, eta=0.05, sampling="fair")
    check("feddyn", clients_per_round=3, local_steps=2, eta=0.05, alpha=0.3, sampling="weighted",
          client_weights=[1.0, 5.0, 1.0, 2.0, 8.0, 1.0, 3.0])


# ---- resume ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,hp", [
    ("feddyn", {"alpha": 0.3, "sampling": "fair", "selection": "power", "candidates": 5}),
    ("fednova", {"local_steps": STEPS, "sampling": "fair"}),
])
def test_resume_equals_uninterrupted_run(name, hp):
    hp = dict(clients_per_round=3, eta=0.05, downlink_compressor="qsgd:4bit") | hp
    whole = engine(name, "topk:0.5", **hp)
    whole.run(10, log_every=10)
    first = engine(name, "topk:0.5", **hp)
    first.run(4, log_every=4)
    buf = io.BytesIO()
    torch.save({"nodes": first.node_state_dicts(), "run": first.run_state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = engine(name, "topk:0.5", **hp)
    resumed.load_state_dicts(saved["nodes"], saved["run"])
    resumed.run(6, log_every=6)
    for i in range(N):
        assert torch.equal(resumed.nodes[i].x, whole.nodes[i].x), i
    assert resumed.record()["bits_up_per_client"] == whole.record()["bits_up_per_client"]


# ---- refused before round 1 --------------------------------------------------------------------


@pytest.mark.parametrize("name,hp,says", [
    ("feddyn", {"aggregation": "data", "client_weights": [1.0] * 7}, "feddyn averages its"),
    ("feddyn", {"alpha": -1.0}, "alpha"),
    ("fedavg", {"selection": "power", "clients_per_round": 3}, "needs candidates d"),
    ("fedavg", {"selection": "power", "clients_per_round": 3, "candidates": 2}, "picks"),
    ("fedavg", {"selection": "power", "clients_per_round": 3, "candidates": 9}, "at most 7"),
    ("fedavg", {"candidates": 3}, "give selection='power' too"),
    ("fedprox", {"selection": "best"}, "selection 'best' is not one of"),
])
def test_bad_selection_or_method_input_is_one_clear_error(name, hp, says):
    with pytest.raises(ConfigError, match=says):
        engine(name, **hp)


@pytest.mark.parametrize("name,hp", [("feddyn", {}), ("fednova", {}),
                                     ("fedavg", {"selection": "power", "clients_per_round": 2,
                                                 "candidates": 4})])
def test_lost_messages_are_refused(name, hp):
    """A server–client round needs every message (docs/network.md's refusals table)."""
    with pytest.raises(ConfigError, match="no defined meaning for a lost message"):
        Engine(make_algorithm(name, **hp), STAR, lambda i: torch.from_numpy(X0),
               network="loss=0.1",
               oracles=lambda i, gen: PROBLEM.oracle(i - 1, gen) if i else None)
