"""Timing models (gossip.network's grammar, gossip.network.timing's keyed draws): parsing, refusals,
distributions, purity, stragglers, churn."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import topologies
from gossip.errors import ConfigError
from gossip.network import Exponential, LogNormal, Uniform, parse_network
from gossip.network.timing import BLOCK, Timing, _normals, _uniforms
from gossip.rng import Stream

SPECS = ["delay=0.01", "delay=fixed:0.5", "compute=exp:1;slow=0.125x5", "slow=nodes:3+0x5",
         "delay=uniform:1,2.5;compute=lognormal:1,0.5;loss=0.1",
         "churn=at:3@10-20+1@1e-3-inf,fresh", "churn=rate:0.01,mean_away:5",
         "loss=ge:p_gb=0.1,p_bg=0.4;delay=exp:0.001;churn=at:0@1-2+0@3-4"]


@pytest.mark.parametrize("spec", SPECS)
def test_specs_round_trip(spec):
    net = parse_network(spec)
    assert net.timed
    assert parse_network(net.spec()) == net
    assert parse_network(net.spec()).spec() == net.spec()


def test_canonical_forms():
    assert parse_network("slow=nodes:3+0x5;delay=2").spec() == "delay=fixed:2;slow=nodes:0+3x5"
    assert parse_network("delay=0.1234567891").delay.seconds == 0.1234567891  # exact
    assert parse_network(parse_network("loss=0.1234567891").spec()).loss.p == 0.1234567891
    assert not parse_network("loss=0.1").timed and not parse_network("none").timed


@pytest.mark.parametrize("spec", [
    "delay=-1", "delay=nan", "delay=inf", "delay=exp:-2", "delay=uniform:2,1", "delay=uniform:1",
    "delay=gamma:1", "compute=lognormal:1", "compute=lognormal:1,-0.5", "delay=1;delay=2",
    "slow=0x5", "slow=1.5x5", "slow=0.1x0.5", "slow=0.1xinf", "slow=0.1", "slow=nodes:1+1x2",
    "slow=nodes:ax2", "churn=rate:0.1", "churn=rate:-1,mean_away:2", "churn=at:3@5-2",
    "churn=at:3@1-5+3@4-6", "churn=at:x@1-2", "churn=foo", "churn=at:1@-1-2", "jitter=1"])
def test_bad_specs_give_one_error_line(spec):
    with pytest.raises(ConfigError) as err:
        parse_network(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec,n,topo,words", [
    ("churn=at:8@1-2", 8, None, "does not exist"),
    ("slow=nodes:9x2", 8, None, "does not exist"),
    ("churn=at:0@1-3+1@2-4", 2, None, "every node is away at time 2"),
    ("churn=at:2@5-inf+6@1-inf", 8, "ring", "disconnected for good"),
])
def test_churn_schedule_checks(spec, n, topo, words):
    net = parse_network(spec)
    with pytest.raises(ConfigError, match=words) as err:
        net.check(n, topologies.build(topo, n) if topo else None)
    assert "\n" not in str(err.value)


def test_churn_checks_that_pass():
    ring = topologies.build("ring", 8)
    parse_network("churn=at:2@5-9").check(8, ring)  # disconnected for a while only
    parse_network("churn=at:2@5-inf").check(8, ring)  # a ring less one node: a path
    parse_network("churn=at:2@5-inf+6@1-inf").check(8, topologies.build("complete", 8))
    parse_network("churn=at:0@1-3+1@3-4").check(2)  # never both away
    parse_network("churn=rate:1,mean_away:100").check(2)  # nothing to check


@pytest.mark.parametrize("spec, fragment", [
    ("compute=lognormal:1,1e6", "SIGMA of at most 37.6"), ("compute=lognormal:1,40", "37.6"),
    ("compute=exp:1e307", "compute=exp:1e+307"), ("compute=2;slow=0.5x1e308", "slow factor"),
    ("delay=exp:5e306", "delay=exp"),
])
def test_draws_past_the_largest_float_are_refused(spec, fragment):
    """A distribution whose draws or mean overflow is one ConfigError naming it, before any
    draw (no numpy overflow warning, no infinite times)."""
    with pytest.raises(ConfigError, match="past the largest float") as exc:
        Timing(parse_network(spec), 0, 4)
    assert fragment in str(exc.value)


def test_a_wide_lognormal_within_range_draws_without_warnings():
    with np.errstate(all="raise"):  # an overflow in any draw would raise here
        timing = Timing(parse_network("compute=lognormal:1,37.5"), 0, 4)
        draws = [timing.compute_s(i, k) for i in range(4) for k in range(1, 2000)]
    assert all(math.isfinite(d) for d in draws)


def test_block_draws_equal_streams():
    rows = [5, 7 << 32 | 2]
    s = Stream(11, rows, "network.delay")
    s.begin_round(3)
    assert np.array_equal(_uniforms(11, "network.delay", rows, 3),
                          s.uniform(BLOCK, dtype=torch.float64).numpy())
    s.begin_round(3)
    assert np.allclose(_normals(11, "network.delay", rows, 3), s.normal(BLOCK, dtype=torch.float64).numpy(),
                       rtol=1e-14, atol=0)
    assert np.array_equal(_uniforms(11, "network.delay", rows[1:], 3)[0],
                          _uniforms(11, "network.delay", rows, 3)[1])


@pytest.mark.parametrize("dist", ["exp:2", "uniform:1,3", "lognormal:0.5,0.8"])
def test_duration_means_within_bounds(dist):
    timing = Timing(parse_network(f"compute={dist};delay={dist}"), 3, 20)
    model = timing.network.compute
    c = np.array([timing.compute_s(i, k) for i in range(20) for k in range(1, 501)])
    d = np.array([timing.delay_s(i, (i + 1) % 20, k) for i in range(20) for k in range(1, 501)])
    mean = {Exponential: lambda m: m.mean, Uniform: lambda m: m.mean, LogNormal: lambda m: m.mean}
    mu = mean[type(model)](model)
    var = {Exponential: mu**2, Uniform: ((getattr(model, "hi", 0) - getattr(model, "lo", 0)) ** 2) / 12,
           LogNormal: (math.exp(getattr(model, "sigma", 0) ** 2) - 1) * mu**2}[type(model)]
    for v in (c, d):
        assert (v >= 0).all()
        assert abs(v.mean() - mu) < 5 * math.sqrt(var / v.size)


def test_event_loss_frequency_within_binomial_bounds():
    for spec, rate in (("loss=0.2", 0.2), ("loss=ge:p_gb=0.05,p_bg=0.45,loss_bad=0.8", 0.08)):
        timing = Timing(parse_network(spec), 5, 30)
        k = sum(timing.lost(i, j, m) for i in range(30) for j in range(30) if i != j
                for m in range(1, 41))
        n = 30 * 29 * 40
        inflate = 1.0 if spec == "loss=0.2" else (1 + 0.5) / (1 - 0.5) * 2  # chain correlation
        assert abs(k - rate * n) < 5 * math.sqrt(n * rate * (1 - rate) * inflate), spec


def test_draws_are_pure():
    net = parse_network("compute=lognormal:1,0.5;delay=exp:0.1;loss=ge:p_gb=0.1,p_bg=0.3;"
                        "churn=rate:0.05,mean_away:3;slow=0.25x4")
    a, b = Timing(net, 9, 16), Timing(net, 9, 16)
    ks = [1, 700, 3, 255, 256, 1000, 2]
    first = [(a.compute_s(i, k), a.delay_s(i, j, k), a.lost(i, j, k))
             for i, j in [(0, 1), (5, 3), (15, 0)] for k in ks]
    again = [(b.compute_s(i, k), b.delay_s(i, j, k), b.lost(i, j, k))
             for i, j in [(15, 0), (5, 3), (0, 1)] for k in reversed(ks)]
    assert sorted(first) == sorted(again)
    assert a.lost(0, 1, 5000) == Timing(net, 9, 16).lost(0, 1, 5000)  # a chain replayed from 0
    # vectorized (a clock on every node) == scalar (one node)
    for k in (300, 301, 30):  # a pair of draws first, then the cached block
        assert np.array_equal(a.compute_all(k), [b.compute_s(i, k) for i in range(16)])
    keys = [1 << 32 | 2, 7 << 32 | 3]
    assert np.array_equal(a.delay_arcs(keys, 9), [b.delay_s(1, 2, 9), b.delay_s(7, 3, 9)])
    assert a.away(4, 100.0) == b.away(4, 50.0) + [iv for iv in b.away(4, 100.0) if iv[0] >= 50.0]
    assert all(a.present(4, t) == Timing(net, 9, 16).present(4, t) for t in np.linspace(0, 99, 50))
    assert Timing(net, 10, 16).compute_s(0, 1) != a.compute_s(0, 1)


def test_slow_nodes():
    t = Timing(parse_network("slow=0.125x5"), 1, 30)
    assert len(t.slow_nodes) == 4 and t.slow_nodes == Timing(parse_network("slow=0.125x5"), 1, 30).slow_nodes
    assert len(Timing(parse_network("slow=0.1x2"), 1, 30).slow_nodes) == 3
    assert t.slow_nodes != Timing(parse_network("slow=0.125x5"), 2, 30).slow_nodes
    fast = [i for i in range(30) if i not in t.slow_nodes][0]
    assert t.compute_s(t.slow_nodes[0], 3) == 5.0 and t.compute_s(fast, 3) == 1.0
    e = Timing(parse_network("compute=exp:1;slow=nodes:2x3"), 1, 4)
    plain = Timing(parse_network("compute=exp:1"), 1, 4)
    assert e.slow_nodes == [2] and e.compute_s(2, 7) == 3 * plain.compute_s(2, 7)
    assert e.compute_s(1, 7) == plain.compute_s(1, 7)


def test_defaults_and_churn_intervals():
    t = Timing(parse_network("churn=at:1@2-5+1@7-inf,fresh"), 0, 3)
    assert t.compute_s(0, 1) == 1.0 and t.delay_s(0, 1, 1) == 0.0 and not t.lost(0, 1, 1)
    assert t.fresh and t.away(1) == [(2.0, 5.0), (7.0, math.inf)] and t.away(0) == []
    assert [t.present(1, x) for x in (0, 2, 4.9, 5, 6.9, 7, 1e9)] == [True, False, False, True, True,
                                                                     False, False]
    assert [t.next_change(1, x) for x in (0, 3, 5, 8)] == [2.0, 5.0, 7.0, math.inf]
    r = Timing(parse_network("churn=rate:0.5,mean_away:2"), 4, 3)
    iv = r.away(0, 2000.0)
    ups = [b2[0] - b1[1] for b1, b2 in zip(iv, iv[1:])]
    aways = [b - a for a, b in iv]
    assert all(x > 0 for x in ups + aways) and not r.fresh
    assert abs(np.mean(ups) - 2) < 5 * 2 / math.sqrt(len(ups))
    assert abs(np.mean(aways) - 2) < 5 * 2 / math.sqrt(len(aways))
    with pytest.raises(ConfigError):
        r.away(0)
    with pytest.raises(ConfigError):
        Timing(parse_network("churn=at:3@1-2"), 0, 3)


def test_scalar_draws_are_fast():
    t = Timing(parse_network("compute=exp:1;delay=lognormal:0.1,0.5;loss=0.1"), 3, 16)
    calls = 20000
    tic = time.perf_counter()
    for k in range(1, calls + 1):
        i = k & 15
        t.compute_s(i, k)
        t.delay_s(i, (i + 1) & 15, k)
        t.lost(i, (i + 1) & 15, k)
    per_call = (time.perf_counter() - tic) / (3 * calls)
    assert per_call < 20e-6  # ~0.5 us measured; generous for a busy machine


def _path_engine(network, rounds=3):
    from gossip import Engine, make_algorithm

    topo = topologies.build("path", 4)
    e = Engine(make_algorithm("gossip"), topo, lambda i: torch.full((3,), float(i), dtype=torch.float64),
               network=network)
    times = [e.record()["time_virtual_s"]]
    for _ in range(rounds):
        e.step()
        times.append(e.record()["time_virtual_s"])
    return times


def test_sync_clock_by_hand_on_a_path():
    # 0 - 1 - 2 - 3, compute 1 s (node 3: 5x slow), delay 0.5 s
    times = _path_engine("compute=1;delay=0.5;slow=nodes:3x5")
    f = [0.0, 0.0, 0.0, 0.0]
    c = [1.0, 1.0, 1.0, 5.0]
    want = [0.0]
    for _ in range(3):
        done = [f[i] + c[i] for i in range(4)]
        f = [max([done[i]] + [done[j] + 0.5 for j in (i - 1, i + 1) if 0 <= j < 4]) for i in range(4)]
        want.append(max(f))
    # by hand: F(1) = (1.5, 1.5, 5.5, 5), F(2) = (3, 7, 10.5, 10), F(3) = (4.5, 11, 15.5, 15)
    assert want == [0.0, 5.5, 10.5, 15.5]
    assert times == want


def test_sync_clock_lost_messages_delay_nobody():
    lossless = _path_engine("compute=1;delay=100", rounds=1)
    assert lossless == [0.0, 101.0]
    assert _path_engine("compute=1;delay=100;loss=1", rounds=1) == [0.0, 1.0]


def test_sync_clock_refuses_churn_and_replays():
    from gossip import Engine, make_algorithm
    from gossip.network.clock import SyncClock

    with pytest.raises(ConfigError, match="churn is modeled for asynchronous") as err:
        Engine(make_algorithm("gossip"), topologies.build("ring", 4), lambda i: torch.zeros(2),
               network="churn=at:1@1-2")
    assert "\n" not in str(err.value)
    net = parse_network("compute=exp:1;delay=lognormal:0.1,1;slow=0.25x3;loss=0.2")
    topo = topologies.build("one-peer-exponential", 8)
    a = SyncClock(Timing(net, 2, 8), topo)
    f10 = a.advance(10).copy()
    f5 = a.advance(5).copy()  # back in time: replayed from round 0
    assert np.array_equal(a.advance(10), f10) and (f5 < f10).all()
    assert np.array_equal(SyncClock(Timing(net, 2, 8), topo).advance(5), f5)


def test_asynchronous_runs_meet_the_timing_models():
    """An event run (gossip/network/events.py) under delay, stragglers, loss and rate churn: a
    node away never wakes, and the same seed gives the same records."""
    from gossip import Engine, make_algorithm

    net = "delay=exp:0.1;compute=exp:1;slow=0.25x3;loss=0.1;churn=rate:0.05,mean_away:2"
    x0 = lambda i: torch.full((3,), float(i), dtype=torch.float64)  # noqa: E731
    runs = []
    for _ in range(2):
        e = Engine(make_algorithm("async-sgp"), topologies.build("ring", 8), x0, network=net, seed=4)
        e.network.events.trace = []
        runs.append((e.run(20, log_every=10), e))
    (a, ea), (b, _) = runs
    assert a == [{**r, "time_s": x["time_s"], "compute_s": x["compute_s"], "comm_s": x["comm_s"]}
                 for r, x in zip(b, a)]
    assert a[-1]["messages_lost_total"] > 0
    timing = ea.network.events.timing
    wakes = [(t, i) for kind, t, i, *_ in ea.network.events.trace if kind == "wake"]
    assert wakes and all(timing.present(i, t) for t, i in wakes)
    assert any(not timing.present(i, t) for i in range(8) for t in np.linspace(0, a[-1]["time_virtual_s"], 200))
    with pytest.raises(ConfigError, match="does not exist"):
        Engine(make_algorithm("async-sgp"), topologies.build("ring", 8), x0, network="churn=at:9@1-2")
