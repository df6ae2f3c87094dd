"""The engine in process: invariants, rates, reductions, divergence, bit accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError, DivergenceError
from gossip.rng import generator, init_seed


def gaussian(d, seed=0, dtype=torch.float64):
    return lambda i: torch.randn(d, generator=generator(init_seed(seed, i)), dtype=dtype)


def stack(engine):
    return torch.stack([engine.nodes[i].x for i in range(engine.n)]).numpy()


def test_gossip_preserves_average_and_contracts_at_rho():
    topo = topologies.build("ring", 16)
    eng = Engine(make_algorithm("gossip"), topo, gaussian(50))
    x0 = stack(eng)
    recs = eng.run(60, log_every=1)
    np.testing.assert_allclose(stack(eng).mean(0), x0.mean(0), atol=1e-13)
    rho = topo.rho
    errs = np.array([r["consensus_error"] for r in recs])
    assert np.all(errs[1:] <= errs[:-1] * rho**2 * (1 + 1e-9))
    # asymptotically the per-round factor is rho^2 (the slowest mode dominates)
    assert errs[-1] / errs[-2] == pytest.approx(rho**2, rel=0.02)


def test_gossip_relaxed_step_matches_matrix_form():
    topo = topologies.build("erdos-renyi:p=0.4", 10, seed=1)
    W = topo.dense()
    gamma = 1.2
    eng = Engine(make_algorithm("gossip", gamma=gamma), topo, gaussian(7))
    X = stack(eng)
    for _ in range(50):
        eng.step()
        X = X + gamma * (W @ X - X)
    np.testing.assert_allclose(stack(eng), X, atol=1e-12)


def test_choco_identity_gamma_one_is_gossip_delayed_by_one_round():
    topo = topologies.build("torus", 16)
    W = topo.dense()
    eng = Engine(make_algorithm("choco", gamma=1.0), topo, gaussian(9))
    X0 = stack(eng)
    eng.step()
    np.testing.assert_allclose(stack(eng), X0, atol=1e-14)  # X^1 = X^0 (x̂ = 0 first)
    X = X0
    for _ in range(30):
        eng.step()
        X = W @ X
        np.testing.assert_allclose(stack(eng), X, atol=1e-12)


def test_choco_keeps_s_equal_to_weighted_public_copies():
    topo = topologies.build("erdos-renyi:p=0.4", 10, seed=2)
    W = topo.dense()
    eng = Engine(make_algorithm("choco", gamma=0.3), topo, gaussian(40), compressor="topk:0.2")
    xbar0 = stack(eng).mean(0)
    for _ in range(25):
        eng.step()
    x_hat = np.stack([eng.nodes[i].state["x_hat"].numpy() for i in range(10)])
    gap = np.stack([eng.nodes[i].state["gap"].numpy() for i in range(10)])
    np.testing.assert_allclose(gap, W @ x_hat - x_hat, atol=1e-12)  # s − x̂
    np.testing.assert_allclose(stack(eng).mean(0), xbar0, atol=1e-13)


@pytest.mark.slow
def test_choco_topk_ring25_converges_at_tuned_gamma_and_diverges_when_too_large():
    topo = topologies.build("ring", 25)
    eng = Engine(make_algorithm("choco", gamma=0.05), topo, gaussian(2000), compressor="topk:0.01")
    recs = eng.run(1000, log_every=100)
    rel = [r["consensus_error"] / recs[0]["consensus_error"] for r in recs]
    assert rel[-1] < 2e-2  # docs/experiments.md#consensus: 1.1e-2 at t = 1000
    assert all(b < a for a, b in zip(rel[1:], rel[2:]))  # monotone decrease past round 100
    bad = Engine(make_algorithm("choco", gamma=0.5), topo, gaussian(2000), compressor="topk:0.01")
    with pytest.raises(DivergenceError, match=r"round \d+") as info:
        bad.run(2000, log_every=10)
    assert info.value.round > 0


def test_bits_in_log_equal_bytes_handed_to_the_transport():
    topo = topologies.build("erdos-renyi:p=0.4", 9, seed=4)
    eng = Engine(make_algorithm("choco", gamma=0.3), topo, gaussian(101), compressor="sign")
    counted = {i: 0 for i in range(9)}
    original = eng.transport.start_rows

    def counting(rows, plan, seq, round_):
        # every message a receiver decodes: the sender's row, nbytes long (one per edge)
        for src, _, _ in plan.slots:
            for row in src.tolist():
                counted[plan.sender_of[row]] += rows.both()[row, : rows.nbytes].numel()
        return original(rows, plan, seq, round_)

    eng.transport.start_rows = counting
    recs = eng.run(12, log_every=4)
    bits = np.array([counted[i] * 8 for i in range(9)], dtype=float)
    assert recs[-1]["bits_per_node"] == pytest.approx(bits.mean(), rel=0, abs=0)
    assert recs[-1]["bits_per_node_max"] == bits.max()
    per_msg = eng.nodes[0].compressor.encode(torch.randn(101, dtype=torch.float64)).nbytes
    degrees = np.array([len(topo.view(i).out_neighbors) for i in range(9)])
    np.testing.assert_array_equal(bits, degrees * per_msg * 8 * 12)


def test_time_varying_and_directed_graphs_are_refused_by_choco():
    with pytest.raises(ConfigError, match="static topology"):
        Engine(make_algorithm("choco"), topologies.build("one-peer-exponential", 8), gaussian(4))
    with pytest.raises(ConfigError, match="symmetric"):
        Engine(make_algorithm("choco"), topologies.build("directed-exponential", 8), gaussian(4))


def test_one_peer_exponential_gossip_averages_exactly_in_log2_n_rounds():
    eng = Engine(make_algorithm("gossip"), topologies.build("one-peer-exponential", 16), gaussian(5))
    xbar = stack(eng).mean(0)
    eng.run(4, log_every=1)
    np.testing.assert_allclose(stack(eng), np.tile(xbar, (16, 1)), atol=1e-14)


@pytest.mark.parametrize(("spec", "n"), [("alternating-ring", 8), ("alternating-ring", 7),
                                         ("alternating-exp-ring", 8)])
def test_gossip_on_one_peer_schedules_is_their_matrix_product_and_reaches_the_average(spec, n):
    """Round t mixes with W(t): after T rounds the models are W(T)...W(1) x0, and they reach
    the average (each node sends one message per round)."""
    topo = topologies.build(spec, n)
    eng = Engine(make_algorithm("gossip"), topo, gaussian(6))
    x0 = stack(eng)
    eng.run(5, log_every=1)
    np.testing.assert_allclose(stack(eng), topo.product(5) @ x0, atol=1e-14)
    recs = eng.run(400, log_every=400)
    np.testing.assert_allclose(stack(eng), np.tile(x0.mean(0), (n, 1)), atol=1e-9)
    assert recs[-1]["consensus_error"] < 1e-18


USER_SCHEDULE = """
import networkx as nx

ROUNDS = []

def shifting(n, t):
    ROUNDS.append(t)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    shift = 1 + (t - 1) % (n - 1)
    g.add_edges_from((i, (i + shift) % n) for i in range(n))
    return g
"""


def test_a_users_function_of_n_and_t_drives_the_engines_rounds(tmp_path, monkeypatch):
    """``--topology module:f`` with ``f(n, t)``: round t of the engine mixes with f(n, t)'s W."""
    (tmp_path / "user_schedule_mod.py").write_text(USER_SCHEDULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_schedule_mod as module

    topo = topologies.build("user_schedule_mod:shifting", 7)
    eng = Engine(make_algorithm("gossip"), topo, gaussian(5))
    X = stack(eng)
    for t in range(1, 10):
        eng.step()
        W = topologies.Topology(module.shifting(7, t), require_connected=False).dense()
        X = W @ X
        np.testing.assert_allclose(stack(eng), X, atol=1e-13)
    assert set(module.ROUNDS) == set(range(1, 10))


def test_nan_in_a_model_stops_with_a_divergence_error_naming_node_and_round():
    topo = topologies.build("ring", 6)
    eng = Engine(make_algorithm("choco", gamma=0.2), topo, gaussian(8), compressor="topk:0.5")
    eng.run(3)
    eng.nodes[4].x[2] = math.nan
    with pytest.raises(DivergenceError, match=r"round 4: node 4"):
        eng.step()


def test_unknown_algorithm_and_bad_hparams_are_clear_errors():
    with pytest.raises(ConfigError, match="choose one of"):
        make_algorithm("chocolate")
    with pytest.raises(ConfigError, match="does not take"):
        make_algorithm("choco", learning_rate=0.1)
    with pytest.raises(ConfigError, match="gamma"):
        make_algorithm("choco", gamma=0.0)


def test_choco_gamma_above_one_warns_and_the_divergent_range_is_refused(caplog):
    """γ up to 2/(1 − λ_min(W)) runs (with a warning above 1): on a ring of 8 with Metropolis
    weights λ_min = −1/3, so the bound is 1.5; 1.2 reaches consensus with exact messages."""
    topo = topologies.build("ring", 8)
    with caplog.at_level("WARNING", logger="gossip.algorithms.choco"):
        eng = Engine(make_algorithm("choco", gamma=1.2), topo, gaussian(6))
    assert "above 1" in caplog.text
    start = eng.record()["consensus_error"]
    eng.run(100)
    assert eng.record()["consensus_error"] < 1e-12 * start
    with pytest.raises(ConfigError, match=r"2/\(1 − λ_min\(W\)\) = 1.5"):
        Engine(make_algorithm("choco", gamma=1.5), topo, gaussian(6))


def test_float32_runs_and_keeps_dtype():
    eng = Engine(make_algorithm("gossip"), topologies.build("ring", 4), gaussian(10),
                 dtype=torch.float32)
    eng.run(3)
    assert eng.nodes[0].x.dtype == torch.float32
