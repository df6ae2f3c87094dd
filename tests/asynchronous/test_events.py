"""Asynchronous algorithms in virtual time (gossip/network/events.py): each against a float64
matrix-form replay of its own event trace, the invariants their papers rest on (pairwise
gossip keeps the sum, push-sum the mass), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError, ContractError
from tests.helpers.algorithm_setup import HETERO, TOPO, X0, N, oracles, x0_fn

RING = topologies.build("ring", 16)


def _ring_x0(seed=0, d=20):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(16, d, generator=g, dtype=torch.float64)
    return X, (lambda i: X[i])


def _engine(name, topo=TOPO, x0=None, problem=None, trace=True, **kw):
    hp = {k: kw.pop(k) for k in ("eta", "gamma") if k in kw}
    eng = Engine(make_algorithm(name, **hp), topo, x0 or x0_fn(), oracles=oracles(problem) if problem else None,
                 **kw)
    if trace:
        eng.network.events.trace = []
    return eng


def test_pairwise_gossip_keeps_the_sum_and_reaches_the_average():
    X, x0 = _ring_x0()
    eng = _engine("pairwise-gossip", RING, x0)
    recs = eng.run(300, log_every=100)
    assert recs[-1]["activations"] == 300 * 16
    assert recs[-1]["consensus_error"] < 1e-15 * recs[0]["consensus_error"]
    np.testing.assert_allclose(eng.block.x.sum(0).numpy(), X.sum(0).numpy(), atol=1e-12)
    np.testing.assert_allclose(eng.block.x.numpy(), X.mean(0).expand(16, -1).numpy(), atol=1e-9)
    # every wake of a node that found a partner is one exchange, both ways heard
    wakes = [e for e in eng.network.events.trace if e[0] == "wake"]
    pairs = [e for e in eng.network.events.trace if e[0] == "exchange"]
    assert len(wakes) == len(pairs) == 4800 and all(e[4] and e[5] for e in pairs)


def test_pairwise_gossip_replays_its_trace_and_clocks_are_poisson():
    X, x0 = _ring_x0(1)
    eng = _engine("pairwise-gossip", RING, x0)
    eng.run(50, log_every=50)
    Y = X.numpy().copy()
    for e in eng.network.events.trace:
        if e[0] == "exchange":
            _, _, i, j, _, _ = e
            Y[i] = Y[j] = (Y[i] + Y[j]) / 2
    np.testing.assert_array_equal(eng.block.x.numpy(), Y)
    # Poisson clocks of rate 1: after 800 activations the virtual time is about 800/16 = 50
    times = [e[1] for e in eng.network.events.trace if e[0] == "wake"]
    assert times == sorted(times)
    assert 45 < times[-1] < 55
    partners = [e[3] for e in eng.network.events.trace if e[0] == "exchange" and e[2] == 0]
    assert set(partners) == {1, 15}


def test_same_seed_same_events_other_seed_other_events():
    _, x0 = _ring_x0()
    a, b, c = (_engine("pairwise-gossip", RING, x0, seed=s) for s in (3, 3, 4))
    for e in (a, b, c):
        e.run(5, log_every=5)
    assert a.network.events.trace == b.network.events.trace
    assert a.network.events.trace != c.network.events.trace
    assert torch.equal(a.block.x, b.block.x)


def test_async_choco_exact_messages_is_pairwise_gossip():
    _, x0 = _ring_x0(2)
    pw = _engine("pairwise-gossip", RING, x0)
    ch = _engine("async-choco", RING, x0, gamma=1.0)
    pw.run(40, log_every=40)
    ch.run(40, log_every=40)
    assert [e[:4] for e in pw.network.events.trace] == [e[:4] for e in ch.network.events.trace]
    np.testing.assert_allclose(ch.block.x.numpy(), pw.block.x.numpy(), atol=1e-12)


@pytest.mark.parametrize(("spec", "gamma"), [("topk:0.25", 0.6), ("randk:0.3", 0.4), ("qsgd:4", 0.6)])
def test_async_choco_compressed_keeps_the_sum_and_converges(spec, gamma):
    X, x0 = _ring_x0(3)
    eng = _engine("async-choco", RING, x0, gamma=gamma, compressor=spec)
    recs = eng.run(400, log_every=400)
    np.testing.assert_allclose(eng.block.x.sum(0).numpy(), X.sum(0).numpy(), atol=1e-11)
    assert recs[-1]["consensus_error"] < 1e-8 * recs[0]["consensus_error"]
    exact = _engine("pairwise-gossip", RING, x0)
    exact.run(400, log_every=400)
    assert recs[-1]["bits_per_node"] < 0.6 * exact.record()["bits_per_node"]


def _activations(trace):
    """The trace as (wake, what followed it until the next wake) pairs."""
    out = []
    for e in trace:
        if e[0] == "wake":
            out.append((e, []))
        elif out:
            out[-1][1].append(e)
    return out


def _replay_ad_psgd(trace, X, grad, eta):
    Y = X.copy()
    G = np.stack([grad(i, Y[i]) for i in range(len(Y))])
    for (_, _, i), after in _activations(trace):
        for _, _, _, j, j_heard, i_heard in (e for e in after if e[0] == "exchange"):
            mean = (Y[i] + Y[j]) / 2
            if i_heard:
                Y[i] = mean
            if j_heard:
                Y[j] = mean
        Y[i] -= eta * G[i]
        G[i] = grad(i, Y[i])
    return Y


def _grad(problem):
    return lambda i, v: problem.grad_full(i, torch.from_numpy(np.ascontiguousarray(v))).numpy()


def test_ad_psgd_replays_its_trace_in_matrix_form():
    eng = _engine("ad-psgd", problem=HETERO, x0=x0_fn(shape=(40,)), eta=0.02)
    eng.run(30, log_every=30)
    X = np.stack([x0_fn(shape=(40,))(i).numpy() for i in range(8)])
    Y = _replay_ad_psgd(eng.network.events.trace, X, _grad(HETERO), 0.02)
    np.testing.assert_allclose(eng.block.x.numpy(), Y, atol=1e-12, rtol=0)


def test_ad_psgd_converges_near_the_optimum():
    eng = _engine("ad-psgd", problem=HETERO, x0=x0_fn(shape=(40,)), eta=0.01, trace=False)
    recs = eng.run(600, log_every=600)
    x_star = HETERO.solution()
    gap = float(((eng.mean_model() - x_star) ** 2).sum() / (x_star**2).sum())
    assert gap < 0.05, gap
    assert recs[-1]["consensus_error"] < 1e-2 * recs[0]["consensus_error"]


def test_async_sgp_replays_its_trace_and_keeps_the_mass():
    topo = topologies.build("directed-exponential", 8)
    eng = _engine("async-sgp", topo, problem=HETERO, x0=x0_fn(shape=(40,)), eta=0.01)
    eng.run(20, log_every=20)
    X = np.stack([x0_fn(shape=(40,))(i).numpy() for i in range(8)])
    grad = _grad(HETERO)
    S, w = X.copy(), np.ones(8)
    G = np.stack([grad(i, X[i]) for i in range(8)])
    flight, applied = [], np.zeros_like(X[0])

    def arrive(e):
        _, _, i, j = e
        k = next(n for n, f in enumerate(flight) if f[:2] == (i, j))  # arcs are FIFO: no delay
        _, _, s, ww = flight.pop(k)
        S[j] += s
        w[j] += ww

    for (_, _, i), after in _activations(eng.network.events.trace):
        S[i] -= 0.01 * G[i]
        applied += 0.01 * G[i]
        for e in after:  # activate's post, then the arrivals up to the next wake
            if e[0] == "post":
                S[i] /= 2
                w[i] /= 2
                flight.append((i, e[3], S[i].copy(), w[i]))
        G[i] = grad(i, S[i] / w[i])  # the next step starts at the end of the activation
        for e in after:
            if e[0] == "arrive":
                arrive(e)
    np.testing.assert_allclose(eng.block.state["w"].numpy(), w, atol=1e-15)
    np.testing.assert_allclose(eng.block.state["s"].numpy(), S, atol=1e-12)
    # mass: what the nodes hold plus what is in flight is x⁰'s minus the steps applied
    total = S.sum(0) + sum(f[2] for f in flight)
    np.testing.assert_allclose(total, X.sum(0) - applied, atol=1e-11)
    assert abs(w.sum() + sum(f[3] for f in flight) - 8) < 1e-13


def test_async_sgp_averages_on_a_directed_graph():
    topo = topologies.build("directed-exponential", 8)
    X = X0()
    eng = _engine("async-sgp", topo, trace=False)
    recs = eng.run(200, log_every=200)
    assert recs[-1]["consensus_error"] < 1e-12 * recs[0]["consensus_error"]
    np.testing.assert_allclose(eng.block.x.numpy(), np.broadcast_to(X.mean(0), X.shape), atol=1e-9)


def test_gossip_learning_merges_and_steps():
    eng = _engine("gossip-learning", problem=HETERO, x0=x0_fn(shape=(40,)), eta=0.01)
    recs = eng.run(800, log_every=800)
    posts = sum(1 for e in eng.network.events.trace if e[0] == "post")
    arrivals = sum(1 for e in eng.network.events.trace if e[0] == "arrive")
    assert posts == arrivals == 800 * 8  # no delay model: every post has arrived
    x_star = HETERO.solution()
    gap = float(((eng.mean_model() - x_star) ** 2).sum() / (x_star**2).sum())
    assert gap < 0.1, gap
    assert recs[-1]["bits_per_node"] == 800 * 40 * 8 * 8


@pytest.mark.parametrize(("name", "kw", "needle"), [
    ("pairwise-gossip", {"compressor": "topk:0.5"}, "async-choco"),
    ("ad-psgd", {"compressor": "sign", "oracles": oracles(HETERO)}, "--compressor none"),
    ("ad-psgd", {}, "needs gradients"),
    ("pairwise-gossip", {"topology": "directed-exponential"}, "directed"),
])
def test_refusals_are_one_line(name, kw, needle):
    topo = topologies.build(kw.pop("topology", "ring"), 8)
    with pytest.raises(ConfigError, match=needle) as info:
        Engine(make_algorithm(name), topo, x0_fn(shape=(40,)), **kw)
    assert "\n" not in str(info.value)


def test_asynchronous_runs_have_no_rounds_to_begin():
    """(Their checkpoints: tests/asynchronous/test_checkpoint_async.py.)"""
    eng = _engine("pairwise-gossip")
    with pytest.raises(ContractError, match="asynchronous"):
        eng.begin_round()
    with pytest.raises(ContractError, match="events"):
        next(make_algorithm("pairwise-gossip").step(eng.block))
    assert N == 8


def test_churn_away_nodes_do_nothing_and_fresh_ones_restart_with_agreeing_copies():
    X, x0 = _ring_x0(4)
    eng = _engine("async-choco", RING, x0, gamma=0.6, compressor="topk:0.5",
                  network="churn=at:2@3-9+7@5-inf,fresh")
    recs = eng.run(300, log_every=300)
    trace = eng.network.events.trace
    assert not [e for e in trace if e[0] == "wake" and e[2] == 2 and 3 <= e[1] < 9]
    assert not [e for e in trace if e[0] == "wake" and e[2] == 7 and e[1] >= 5]
    assert not [e for e in trace if e[0] == "exchange" and 7 in e[2:4] and e[1] >= 5]
    assert recs[-1]["rejoins"] == 1  # node 2 came back fresh; node 7 never did
    arc, out, inn = eng.block.workspace["arc"], eng.block.arc_state["x_hat_out"], eng.block.arc_state["x_hat_in"]
    for (i, j), e in arc.items():  # i's copy of arc i→j is what j holds of it
        assert torch.equal(out[e], inn[arc[(j, i)]]), (i, j)
    # the fifteen that stay (a path now) agree; node 7 left for good with its own model
    rest = [r for r in range(16) if r != 7]
    spread = eng.block.x[rest] - eng.block.x[rest].mean(0)
    assert float((spread**2).sum()) < 1e-4 * float(((X - X.mean(0)) ** 2).sum())


def test_fresh_rejoin_restarts_from_the_initial_model():
    X, x0 = _ring_x0(5)
    eng = _engine("pairwise-gossip", RING, x0, network="churn=at:3@2-4,fresh")
    eng.run(2, log_every=2)  # to virtual time ≈ 2: node 3 still here
    while eng.network.events.now < 4.5:
        eng.step()
    wakes = [e[1] for e in eng.network.events.trace if e[0] == "wake" and e[2] == 3 and e[1] >= 4]
    first = wakes[0]
    # replay: node 3's model right after its return is x⁰_3, then its exchanges from there on
    Y = X.numpy().copy()
    for e in eng.network.events.trace:
        if e[0] == "wake" and e[2] == 3 and e[1] == first:
            Y[3] = X[3].numpy()
        if e[0] == "exchange":
            _, _, i, j, _, _ = e
            Y[i] = Y[j] = (Y[i] + Y[j]) / 2
    np.testing.assert_array_equal(eng.block.x.numpy(), Y)


def test_a_delay_is_refused_where_it_means_nothing_or_nothing_would_arrive():
    with pytest.raises(ConfigError, match="atomic events") as info:
        _engine("ad-psgd", problem=HETERO, x0=x0_fn(shape=(40,)), network="delay=exp:0.5")
    assert "\n" not in str(info.value)
    eng = _engine("gossip-learning", x0=x0_fn(shape=(40,)), network="delay=uniform:30,40")
    with pytest.raises(ConfigError, match=r"at least 30 s, but the run ends at about 20 s") as info:
        eng.run(20)
    assert eng.network.events.activations == 0 and "\n" not in str(info.value)
    recs = eng.run(31, log_every=31)  # long enough: the first posts arrive
    assert recs[-1]["time_virtual_s"] > 30


def test_an_exchange_is_answered_by_receive_once():
    """The peer's ``receive`` must reply to an exchange's request, once: one that does not is
    stopped naming both ends, a second reply (or a reply to a post) is refused."""
    from gossip.core.activation import Message
    from gossip.core.algorithm import Asynchronous
    from gossip.core.requirements import Graph, Requirements

    class Silent(Asynchronous):
        name = "silent-peer"
        contact = "exchange"
        requires = Requirements(graph=Graph(symmetric=True), compressor="identity")

        def activate(self, block, event):
            event.exchange(block.x[event.row])

        def message_like(self, block, row):
            return (block.x[row],)

        def receive(self, block, message):
            pass

    X, x0 = _ring_x0()
    eng = Engine(Silent(), RING, x0)
    with pytest.raises(ContractError, match=r"silent-peer.receive did not reply to node \d+"):
        eng.run(1, log_every=1)
    msg = Message(1, 2, 0, None, 0.0, 0.0, answer=lambda parts: True)
    assert msg.reply(torch.zeros(1))
    with pytest.raises(ContractError, match="node 2 replied to a message from node 1"):
        msg.reply(torch.zeros(1))
