"""Late messages (``--network stale=``, gossip.network.stale): lag draws, FIFO per arc, the
meaning per family against float64 replays, push-sum's mass, CHOCO's copies, refusals."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

import topologies
from gossip import Engine, make_algorithm
from gossip.errors import ConfigError
from gossip.network import (
    GeometricLag,
    LagDraws,
    LossDraws,
    UniformLag,
    arc_keys,
    parse_network,
)
from gossip.network.stale import fifo_due

ARCS = arc_keys([(i, j) for i in range(40) for j in range(40) if i != j])


@pytest.mark.parametrize("spec", ["stale=-1", "stale=1.5", "stale=geom:0", "stale=geom:1.2",
                                  "stale=uniform:3,1", "stale=uniform:1", "stale=poisson:2",
                                  "stale=1;stale=2", "stale=arcs:0>0@1", "stale=arcs:0-1@1",
                                  "stale=arcs:*@1+*@2", "stale=arcs:0>1@1+0>1@2",
                                  "stale=arcs:0>1@arcs:1>2@1", "stale=arcs:0>1@-1"])
def test_bad_lags_give_one_error_line(spec):
    with pytest.raises(ConfigError) as err:
        parse_network(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec", ["stale=3", "stale=geom:0.25", "stale=uniform:0,4",
                                  "stale=arcs:2>3@geom:0.5+0>1@1", "stale=arcs:*@2+1>0@0"])
def test_lag_specs_round_trip(spec):
    net = parse_network(spec)
    assert parse_network(net.spec()) == net and net.late


def test_geometric_lags_within_binomial_bounds():
    model = parse_network("stale=geom:0.3").stale
    assert isinstance(model, GeometricLag)
    draws = LagDraws(model, 7, ARCS)
    lags = np.concatenate([draws.lags(t, 0) for t in range(1, 21)])
    n = lags.size
    for k in range(4):  # P(lag = k) = p (1 − p)^k
        p = 0.3 * 0.7**k
        assert abs(int((lags == k).sum()) - p * n) < 5 * math.sqrt(n * p * (1 - p)), k
    assert lags.min() == 0


def test_uniform_lags_within_binomial_bounds_and_phases_differ():
    model = parse_network("stale=uniform:1,4").stale
    assert isinstance(model, UniformLag)
    draws = LagDraws(model, 7, ARCS)
    lags = np.concatenate([draws.lags(t, 0) for t in range(1, 11)])
    assert set(lags.tolist()) == {1, 2, 3, 4}
    n = lags.size
    for k in (1, 2, 3, 4):
        assert abs(int((lags == k).sum()) - n / 4) < 5 * math.sqrt(n * 0.25 * 0.75), k
    assert not np.array_equal(draws.lags(3, 0), draws.lags(3, 1))  # keyed by phase too
    assert np.array_equal(draws.lags(3, 0), LagDraws(model, 7, ARCS).lags(3, 0))  # pure


def test_per_arc_lags_draw_from_each_arcs_model():
    model = parse_network("stale=arcs:0>1@geom:0.5+1>0@3+*@uniform:1,2").stale
    keys = arc_keys([(0, 1), (1, 0), (1, 2), (2, 1)])
    draws = LagDraws(model, 4, keys)
    lags = np.stack([draws.lags(t, 0) for t in range(1, 201)])
    assert (lags[:, 1] == 3).all() and set(lags[:, 2:].ravel().tolist()) == {1, 2}
    assert lags[:, 0].min() == 0 and abs(lags[:, 0].mean() - 1.0) < 0.35  # mean (1 − p) / p
    geom = LagDraws(parse_network("stale=geom:0.5").stale, 4, keys[:1])  # the arc's own stream
    assert np.array_equal(lags[:, 0], [geom.lags(t, 0)[0] for t in range(1, 201)])


def test_fifo_due():
    assert fifo_due(5, 0, 0) == 5
    assert fifo_due(5, 2, 9) == 9  # an earlier message on the arc is due later: wait for it
    assert fifo_due(5, 5, 9) == 10


def _ring_weights(topo, n):
    W = np.zeros((n, n))
    for i in range(n):
        v = topo.view(i)
        W[i, i] = v.self_weight
        for j, w in zip(v.in_neighbors, v.in_weights):
            W[i, j] = w
    return W


@pytest.mark.parametrize("spec", ["stale=2", "stale=geom:0.4", "stale=uniform:0,3",
                                  "stale=arcs:0>1@4+1>0@geom:0.3+*@uniform:0,1",
                                  "loss=0.3;stale=geom:0.5"])
def test_gossip_with_stale_values_equals_its_matrix_replay(spec):
    """x_i ← w_ii x_i + Σ_j w_ij x_j^(newest arrived), the weight of a neighbor nothing has
    arrived from yet moved to w_ii; lags from the keyed draws, FIFO per arc, a lost message never
    arrives (float64 numpy)."""
    n, T, seed = 6, 25, 5
    topo = topologies.build("ring", n)
    x0 = lambda i: torch.tensor([float(i), float(i * i), -1.0 * i], dtype=torch.float64)  # noqa: E731
    eng = Engine(make_algorithm("gossip"), topo, x0, network=spec, seed=seed)
    W = _ring_weights(topo, n)
    X = np.stack([x0(i).numpy() for i in range(n)])
    arcs = [(j, i) for i in range(n) for j in range(n) if W[i, j] and i != j]
    net = parse_network(spec)
    draws = LagDraws(net.stale, seed, arc_keys(arcs[::-1]))  # any order: keyed
    drops = LossDraws(net.loss, seed, arc_keys(arcs)) if net.loss else None
    due = dict.fromkeys(arcs, 0)
    queue = {a: [] for a in arcs}
    newest = dict.fromkeys(arcs)
    late = 0
    for t in range(1, T + 1):
        lags = dict(zip(arcs[::-1], draws.lags(t, 0).tolist()))
        lost = dict(zip(arcs, drops.lost(t, 0).tolist() if drops else [False] * len(arcs)))
        for a in arcs:
            if not lost[a]:
                due[a] = max(t + lags[a], due[a])
                late += due[a] > t
                queue[a].append((due[a], X[a[0]].copy()))
            while queue[a] and queue[a][0][0] <= t:
                newest[a] = queue[a].pop(0)[1]
        Y = np.zeros_like(X)
        for i in range(n):
            Y[i] = W[i, i] * X[i]
            for j in range(n):
                if (j, i) in newest:
                    Y[i] += W[i, j] * (X[i] if newest[(j, i)] is None else newest[(j, i)])
        X = Y
        eng.step()
        assert np.allclose(eng.block.x.numpy(), X, rtol=0, atol=1e-12), t
    assert late > 0 and int(eng.network.stale.late_total.sum()) == late


def test_fixed_lag_counts_every_message_late_and_records_it():
    topo = topologies.build("ring", 8)
    eng = Engine(make_algorithm("gossip"), topo, lambda i: torch.full((2,), float(i)),
                 network="stale=1")
    recs = eng.run(5)
    assert [r["messages_late"] for r in recs[1:]] == [16] * 5
    assert recs[-1]["messages_late_total"] == 80
    assert len(eng.network.stale.in_flight()) == 16  # round 5's messages, due in round 6


def test_messages_on_an_arc_keep_their_order():
    """Under geometric lags (where a later message may draw a shorter lag) every arc's held
    messages are in send order and each is due at max(sent + drawn lag, the previous due)."""
    seed, model = 3, parse_network("stale=geom:0.3").stale
    eng = Engine(make_algorithm("choco", gamma=0.3), topologies.build("ring", 6),
                 lambda i: torch.full((4,), float(i), dtype=torch.float64), compressor="topk:0.5",
                 network="stale=geom:0.3", seed=seed)
    seen = defaultdict(dict)  # arc -> sent round -> due
    overtaken = 0
    for _ in range(30):
        eng.step()
        for h in eng.network.stale.in_flight():
            seen[(h.sender, h.receiver)][h.sent] = h.due
    for (j, i), dues in seen.items():
        draws = LagDraws(model, seed, arc_keys([(j, i)]))
        sent = sorted(dues)
        assert [dues[s] for s in sent] == sorted(dues[s] for s in sent)
        for s in sent:
            drawn = s + int(draws.lags(s, 0)[0])
            assert dues[s] >= drawn
            overtaken += dues[s] > drawn  # held behind an earlier one
    assert overtaken > 0


def test_stale_zero_is_the_ideal_run():
    topo = topologies.build("ring", 8)
    x0 = lambda i: torch.arange(5, dtype=torch.float64) * i  # noqa: E731
    runs = []
    for net in (None, "stale=0", "stale=geom:1", "stale=uniform:0,0"):
        e = Engine(make_algorithm("choco", gamma=0.5), topo, x0, compressor="topk:0.4", network=net)
        assert e.network.stale is None
        e.run(10)
        runs.append(torch.stack([nd.x for nd in e.nodes.values()]))
    assert all(torch.equal(runs[0], r) for r in runs)


@pytest.mark.parametrize("graph, spec", [("directed-random:p=0.3", "stale=3"),
                                         ("directed-random:p=0.3", "stale=geom:0.3"),
                                         ("one-peer-exponential", "stale=geom:0.4"),
                                         ("directed-random:p=0.3", "loss=0.3;stale=geom:0.4")])
def test_push_sum_conserves_mass_in_flight_and_reaches_the_average(graph, spec):
    """Σ w and Σ s over the nodes plus the shares in flight (each with its send round's weight,
    also on a graph that changes every round, and with lost shares kept by their senders) stay
    n and Σ x⁰; push-sum ends at the average."""
    n = 8
    topo = topologies.build(graph, n, weights="push", seed=3)
    x0 = lambda i: torch.full((4,), float(i), dtype=torch.float64)  # noqa: E731
    e = Engine(make_algorithm("push-sum"), topo, x0, network=spec)
    for _ in range(40):
        e.step()
        flight = e.network.stale.in_flight()
        # a packed message: header, then ŝ_j (8-byte header + values), then w_j (8 bytes)
        w_flight = sum(h.weight * float(h.data[-8:].view(torch.float64)) for h in flight)
        s_flight = sum(h.weight * h.data[-8 - 32:-8].view(torch.float64) for h in flight)
        assert abs(float(e.block.state["w"].sum()) + w_flight - n) < 1e-12
        total = e.block.state["s"].sum(0) + s_flight
        assert torch.allclose(total, torch.full_like(total, 28.0), rtol=0, atol=1e-11)
    assert any(h for h in flight)
    e.run(400)
    assert torch.allclose(e.block.x, torch.full_like(e.block.x, 3.5), rtol=0, atol=1e-10)


def test_choco_copies_lag_behind_and_catch_up():
    """CHOCO's mixed copy s_i = w_ii x̂_i + Σ_j w_ij x̂_j as the increments arrived (kept as the
    gap s_i − x̂_i): with a fixed lag K it is exactly the neighbors' copies of K rounds ago; with
    geometric lags it is W x̂ less the increments in flight (so it equals W x̂ once they
    arrive)."""
    n, K = 6, 2
    topo = topologies.build("ring", n)
    W = torch.tensor(_ring_weights(topo, n))
    D = torch.diag(torch.diag(W))
    x0 = lambda i: torch.tensor([float(i), 1.0, -float(i)], dtype=torch.float64)  # noqa: E731
    e = Engine(make_algorithm("choco", gamma=0.4), topo, x0, compressor="topk:0.67",
               network=f"stale={K}")
    hist = [torch.zeros(n, 3, dtype=torch.float64)]
    for t in range(1, 16):
        e.step()
        hist.append(e.block.state["x_hat"].clone())
        old = hist[t - K] if t >= K else hist[0]
        want = D @ hist[t] + (W - D) @ old
        s = e.block.state["gap"] + e.block.state["x_hat"]
        assert torch.allclose(s, want, rtol=0, atol=1e-12), t
    g = Engine(make_algorithm("choco", gamma=0.4), topo, x0, compressor="none",
               network="stale=geom:0.3", seed=2)
    for _ in range(30):
        g.step()
        flight = torch.zeros(n, 3, dtype=torch.float64)
        for h in g.network.stale.in_flight():
            flight[h.receiver] += h.weight * h.data[8:].view(torch.float64)
        x_hat = g.block.state["x_hat"]
        s = g.block.state["gap"] + x_hat
        assert torch.allclose(s + flight, W @ x_hat, rtol=0, atol=1e-12)
    assert g.network.stale.late_total.sum() > 0


def test_refusals_name_the_algorithm_and_why():
    ring = topologies.build("ring", 8)
    zeros = lambda i: torch.zeros(4, dtype=torch.float64)  # noqa: E731
    cases = [
        (lambda: Engine(make_algorithm("choco-arcs", gamma=0.3),
                        topologies.build("one-peer-exponential", 8), zeros,
                        compressor="topk:0.5", network="stale=1"), "choco-arcs"),
        (lambda: Engine(make_algorithm("powergossip"), ring, lambda i: torch.zeros(16),
                        network="stale=1"), "powergossip"),
        (lambda: Engine(make_algorithm("push-sum"), topologies.build("ring", 8, weights="push"),
                        zeros, compressor="topk:0.5", network="stale=1"), "push-sum"),
        (lambda: Engine(make_algorithm("gossip"), ring, zeros, network="stale=1;delay=1"),
         "delay"),
        (lambda: Engine(make_algorithm("gossip"), ring, zeros, network="stale=5").run(5),
         "5 rounds"),
        (lambda: Engine(make_algorithm("gossip"), ring, zeros, network="stale=1").run(
            5, checkpointer=object()), "not checkpointed"),
        (lambda: Engine(make_algorithm("pairwise-gossip"), ring, zeros, network="stale=1"),
         "asynchronous"),
        (lambda: Engine(make_algorithm("gossip"), ring, zeros, network="stale=arcs:0>4@1"),
         "not an arc of"),
        (lambda: Engine(make_algorithm("gossip"), ring, zeros, network="stale=arcs:0>9@1"),
         "node 9 does not exist"),
    ]
    for build, word in cases:
        with pytest.raises(ConfigError) as err:
            build()
        assert "\n" not in str(err.value) and word in str(err.value), str(err.value)
    Engine(make_algorithm("gossip"), ring, zeros, network="stale=uniform:5,9").run(6)  # some arrive
