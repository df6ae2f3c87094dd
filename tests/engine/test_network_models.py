"""A noisy channel (``--network noise=``) and synchronous partial activation (``active=``):
spec forms, the noise's place and statistics, noisy gossip's random-walk average, ``active=1``
equal to the plain run, inactive nodes unchanged and uncalled, the activity laws, refusals.
(MPI equals in process: the noise/active scenarios of tests/helpers/mpi_network_scenarios.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import topologies
from gossip import Engine, make_algorithm
from gossip.errors import ConfigError
from gossip.network import ActivityDraws, NoiseDraws, arc_keys, parse_network
from gossip.network.activity import NodeAsleep
from gossip.problems import make_problem


@pytest.mark.parametrize("spec", ["noise=0.01", "noise=var:2.5e-05", "noise=std:0.1",
                                  "active=0.5", "active=bernoulli:1",
                                  "active=markov:p_off=0.2,p_on=0.3", "active=poisson:0.7",
                                  "active=cyclic:4", "loss=0.1;noise=std:0.01;active=cyclic:2"])
def test_specs_round_trip(spec):
    net = parse_network(spec)
    assert parse_network(net.spec()) == net


def test_noise_variance_from_either_form():
    assert parse_network("noise=std:0.1").noise.var == pytest.approx(0.01, rel=1e-15)
    assert parse_network("noise=0.04").noise.std == pytest.approx(0.2, rel=1e-15)


@pytest.mark.parametrize("spec", ["noise=-1", "noise=nan", "noise=foo:1", "noise=std:x",
                                  "active=0", "active=1.5", "active=cyclic:0", "active=cyclic:1.5",
                                  "active=markov:p_off=0.1", "active=markov:p_off=0.1,p_on=0",
                                  "active=markov:p_off=2,p_on=0.1", "active=poisson:0",
                                  "active=sometimes:1"])
def test_bad_specs_give_one_error_line(spec):
    with pytest.raises(ConfigError) as err:
        parse_network(spec)
    assert "\n" not in str(err.value)


# -- noise --------------------------------------------------------------------------------------
def _gossip(network: str, n: int = 8, d: int = 4000, seed: int = 5, topo: str = "ring",
            alg: str = "gossip", compressor: str = "none") -> Engine:
    graph = topologies.build(topo, n, weights="metropolis", seed=1)
    gen = torch.Generator().manual_seed(9)
    x0 = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return Engine(make_algorithm(alg), graph, lambda i: x0[i], compressor=compressor,
                  seed=seed, network=network)


def test_noise_is_on_each_received_message_with_its_weight():
    """One gossip round with noise minus the same round without: row i differs by exactly
    γ Σ_j w_ij σ z_ji, z_ji the keyed normals of arc j → i (round 1, phase 0)."""
    sigma, n, d = 0.3, 8, 4000
    clean, noisy = _gossip("none"), _gossip(f"noise=std:{sigma}")
    clean.step()
    noisy.step()
    gamma = noisy.hparams.get("gamma", 1.0)
    graph = noisy.topology
    expect = torch.zeros(n, d, dtype=torch.float64)
    for i in range(n):
        view = graph.view(i)
        for j, w in zip(view.in_neighbors, view.in_weights):
            z = NoiseDraws(5, arc_keys([(j, i)])).normals(1, 0, d)[0]
            expect[i] += gamma * w * sigma * z
    diff = noisy.block.x - clean.block.x
    assert torch.allclose(diff, expect, rtol=0, atol=1e-12)
    # the delivered message's noise: mean 0, variance σ² (d values per arc, 16 arcs)
    z = NoiseDraws(5, arc_keys([(j, i) for i in range(n) for j in graph.view(i).in_neighbors]))
    noise = sigma * z.normals(1, 0, d)
    m = noise.numel()
    assert abs(float(noise.mean())) < 5 * sigma / math.sqrt(m)
    assert float(noise.var()) == pytest.approx(sigma**2, rel=5 * math.sqrt(2 / m))
    assert noisy.record()["bits_per_node"] == clean.record()["bits_per_node"]  # bits unchanged


def test_noise_draws_depend_on_round_phase_and_arc():
    draws = NoiseDraws(1, arc_keys([(0, 1), (1, 0)]))
    a, b, c = draws.normals(3, 0, 50), draws.normals(3, 1, 50), draws.normals(4, 0, 50)
    assert not torch.equal(a[0], a[1]) and not torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a, NoiseDraws(1, arc_keys([(0, 1), (1, 0)])).normals(3, 0, 50))
    assert torch.equal(a[1:], NoiseDraws(1, arc_keys([(1, 0)])).normals(3, 0, 50))


def test_noisy_gossip_average_drifts_like_a_random_walk():
    """x̄ moves by (γ/n) Σ_i Σ_j w_ij σ z_ji each round: independent steps of variance
    γ² σ² Σ_ij w_ij² / n² per coordinate, so after T rounds var(x̄_T − x̄_0) = T times that,
    while the nodes stay close (the consensus error does not grow with T)."""
    sigma, n, d = 0.1, 8, 4000
    eng = _gossip(f"noise=std:{sigma}", n=n, d=d)
    gamma = eng.hparams.get("gamma", 1.0)
    W = eng.topology.W
    per_round = gamma**2 * sigma**2 * sum(float(W[i, j]) ** 2 for i in range(n) for j in range(n)
                                           if i != j) / n**2
    x0 = eng.mean_model().clone()
    drift = {}
    for t in range(1, 41):
        eng.step()
        if t in (10, 40):
            drift[t] = float((eng.mean_model() - x0).var())
    for t, v in drift.items():
        assert v == pytest.approx(t * per_round, rel=0.12), t
    spread = float((eng.block.x - eng.mean_model()).pow(2).mean())
    assert spread < 10 * sigma**2  # bounded: the mixing pulls the noise in


def test_noisy_choco_copies_take_the_noise_and_arcs_form_decodes_it_too():
    for alg, comp in (("choco", "topk:0.5"), ("choco-arcs", "topk:0.5")):
        a, b = _gossip("none", alg=alg, compressor=comp), _gossip("noise=var:0.01", alg=alg,
                                                                compressor=comp)
        for _ in range(3):
            a.step()
            b.step()
        assert not torch.equal(a.block.x, b.block.x), alg
        assert float((a.block.x - b.block.x).abs().max()) < 1.0, alg


# -- partial activation ------------------------------------------------------------------------
class Counting:
    """An oracle that counts its gradients (and passes everything else through)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def grad(self, *args):
        self.calls += 1
        return self.inner.grad(*args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _lsq(alg: str, network: str, n: int = 8, compressor: str = "none", seed: int = 2,
         topo: str = "ring", counting: dict | None = None, **hp) -> Engine:
    problem = make_problem("least-squares", n_nodes=n, dim=10, samples_per_node=12, seed=4,
                           heterogeneity=1.0, dtype=torch.float64)
    graph = topologies.build(topo, n, weights="metropolis", seed=1)
    x0 = problem.initial_point()

    def oracle(i, gen):
        o = Counting(problem.oracle(i, gen, "full", 2))
        if counting is not None:
            counting[i] = o
        return o

    hp = {"eta": 0.2 / problem.smoothness().L} | hp
    return Engine(make_algorithm(alg, **hp), graph, lambda i: x0 + 0.01 * i, compressor=compressor,
                  seed=seed, network=network, oracles=oracle)


@pytest.mark.parametrize("alg,comp", [("dpsgd", "none"), ("choco", "topk:0.3"), ("lead", "lead:2"),
                                      ("extra", "none"), ("lead-arcs", "topk:0.3")])
def test_active_one_is_the_plain_run_bit_for_bit(alg, comp):
    a, b = _lsq(alg, "none", compressor=comp), _lsq(alg, "active=1", compressor=comp)
    ra, rb = a.run(15, log_every=5), b.run(15, log_every=5)
    assert torch.equal(a.block.x, b.block.x)
    for x, y in zip(ra, rb):
        assert y["nodes_active"] == 8
        for k in ("consensus_error", "bits_per_node"):
            assert x[k] == y[k]


@pytest.mark.parametrize("alg,comp,spec", [("dpsgd", "none", "active=0.5"),
                                           ("choco", "topk:0.3", "active=markov:p_off=0.4,p_on=0.4"),
                                           ("lead-arcs", "topk:0.3", "active=cyclic:3;loss=0.2"),
                                           ("extra", "none", "active=poisson:0.5")])
def test_inactive_nodes_keep_their_model_and_state_and_do_not_compute(alg, comp, spec):
    calls: dict = {}
    eng = _lsq(alg, spec, compressor=comp, counting=calls)
    draws = ActivityDraws(parse_network(spec).active, 2, 8)
    slept = 0
    for t in range(1, 13):
        before_x = eng.block.x.clone()
        before_state = {k: v.clone() for k, v in eng.block.state.items()
                        if isinstance(v, torch.Tensor)}
        before_calls = {i: o.calls for i, o in calls.items()}
        eng.step()
        active = draws.active(t)
        assert eng.record()["nodes_active"] == int(active.sum())
        for i in range(8):
            if active[i]:
                assert calls[i].calls > before_calls[i], (t, i)
                continue
            slept += 1
            assert calls[i].calls == before_calls[i], (t, i)
            assert torch.equal(eng.block.x[i], before_x[i]), (t, i)
            for k, v in before_state.items():
                assert torch.equal(eng.block.state[k][i], v[i]), (t, i, k)
        assert eng.block.active_rows is None  # every oracle back after the round
        assert all(isinstance(nd.oracle, Counting) for nd in eng.block.nodes)
    assert slept > 0


def test_inactive_nodes_send_no_bits():
    a, b = _lsq("dpsgd", "none"), _lsq("dpsgd", "active=0.5")
    ra, rb = a.run(20, log_every=20)[-1], b.run(20, log_every=20)[-1]
    draws = ActivityDraws(parse_network("active=0.5").active, 2, 8)
    # on a ring an arc moves when both of its ends are active: bits scale with those arcs
    both = sum(int(m[i] and m[(i + 1) % 8]) for m in (draws.active(t) for t in range(1, 21))
               for i in range(8))
    assert rb["bits_per_node"] == pytest.approx(ra["bits_per_node"] * both / (8 * 20), rel=1e-12)
    assert rb["messages_lost_total"] == 0  # a silent arc is not a lost message


def test_push_sum_keeps_its_mass_under_partial_activation():
    n, d = 8, 6
    graph = topologies.build("directed-random:p=0.4", n, weights="push", seed=3)
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    eng = Engine(make_algorithm("push-sum"), graph, lambda i: x0[i], seed=1,
                 network="active=markov:p_off=0.3,p_on=0.5")
    eng.run(200, log_every=200)
    assert torch.allclose(eng.block.x, x0.mean(0).expand(n, d), rtol=0, atol=1e-10)


def test_markov_activity_reaches_its_stationary_law_and_transitions():
    model = parse_network("active=markov:p_off=0.2,p_on=0.3").active
    draws = ActivityDraws(model, 3, 4000)
    states = np.stack([draws.active(t) for t in range(0, 61)])
    n = states[1:].size
    assert abs(states[1:].mean() - 0.6) < 5 * math.sqrt(0.24 / n) * 3  # correlated rounds
    on, nxt = states[:-1], states[1:]
    off_rate = (on & ~nxt).sum() / on.sum()
    on_rate = (~on & nxt).sum() / (~on).sum()
    assert off_rate == pytest.approx(0.2, abs=0.01) and on_rate == pytest.approx(0.3, abs=0.01)
    fresh = ActivityDraws(model, 3, 4000)  # a resumed run asks round 40 first: replayed
    assert np.array_equal(fresh.active(40), states[40])


@pytest.mark.parametrize("spec,rate", [("active=0.3", 0.3), ("active=poisson:0.5", 1 - math.exp(-0.5)),
                                       ("active=cyclic:4", 0.25)])
def test_activity_frequencies(spec, rate):
    draws = ActivityDraws(parse_network(spec).active, 8, 2000)
    states = np.stack([draws.active(t) for t in range(1, 41)])
    assert abs(states.mean() - rate) < 5 * math.sqrt(rate * (1 - rate) / states.size)
    if spec.startswith("active=cyclic"):
        assert (states.sum(0) == 10).all()  # each node once every 4 rounds


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("alg,spec,why", [
    ("ecd", "active=0.5", "no meaning for a lost message"),
    ("dpsgd", "active=0.5;stale=1", "not combined with stale="),
    ("dpsgd", "noise=0.1;stale=1", "not combined with stale="),
    ("dpsgd", "active=0.5;compute=exp:1", "the virtual clock counts sleeping nodes"),
])
def test_refused_before_any_message(alg, spec, why):
    with pytest.raises(ConfigError):
        _lsq(alg, spec).step()


def test_refused_with_overlap():
    problem = make_problem("least-squares", n_nodes=4, dim=5, samples_per_node=5, seed=1,
                           dtype=torch.float64)
    with pytest.raises(ConfigError):
        Engine(make_algorithm("dpsgd", eta=0.01), topologies.build("ring", 4), lambda i:
               problem.initial_point(), oracles=lambda i, g: problem.oracle(i, g, "full", 2),
               network="active=0.5", overlap=True)


def test_asynchronous_algorithms_refuse_noise_and_activity():
    for spec in ("noise=0.1", "active=0.5"):
        with pytest.raises(ConfigError):
            Engine(make_algorithm("ad-psgd"), topologies.build("ring", 4),
                   lambda i: torch.zeros(3, dtype=torch.float64), network=spec)


def test_noise_refused_for_raw_message_rows():
    """PowerGossip sends its sketches as raw rows: no decoded values to add noise to."""
    graph = topologies.build("ring", 4, weights="metropolis")
    from gossip.layout import Layout
    eng = Engine(make_algorithm("powergossip"), graph, lambda i: torch.ones(20, dtype=torch.float64),
                 layout=Layout([(4, 5)]), network="noise=0.1")
    with pytest.raises(ConfigError):
        eng.step()


def test_an_inactive_nodes_oracle_refuses_direct_calls():
    eng = _lsq("dpsgd", "active=cyclic:2")
    eng.network.prepare_round(1)
    asleep = [nd for nd in eng.block.nodes if nd.id % 2 == 1]
    with pytest.raises(NodeAsleep):
        asleep[0].oracle.grad(eng.block.x[1], torch.empty_like(eng.block.x[1]))
    assert getattr(asleep[0].oracle, "apply_step", None) is None
    eng.network.activity.end(eng.block)
    assert isinstance(asleep[0].oracle, Counting)


# -- noise on a federated round ------------------------------------------------------------------
class _ZeroGradient:
    """A client whose gradient is 0: its local steps leave the model it received as it is."""

    def grad(self, x, out=None):
        return torch.zeros_like(x) if out is None else out.zero_()


def test_noise_on_a_federated_round_is_on_each_arc_of_the_star():
    """docs/network.md (noise=): receiver i's copy of sender j's message is its decoded values
    plus σ z_ji, z_ji keyed by (seed, arc j → i, round, phase). On a FedAvg round (every client
    sampled, exact messages): each client's received model is the server's plus the noise of
    arc 0 → i (phase 0), and with zero gradients the server's model moves by the mean of the
    uplink noises of arcs i → 0 (phase 1), times server_lr = 1; the bits are the noiseless run's."""
    from tests.helpers.star_problem import STAR, X0, D, N

    sigma, seed = 0.1, 5

    def fedavg(network: str) -> Engine:
        return Engine(make_algorithm("fedavg", clients_per_round=N - 1, local_steps=1, eta=0.1),
                      STAR, lambda i: torch.from_numpy(X0), network=network, seed=seed,
                      oracles=lambda i, gen: _ZeroGradient() if i else None)

    clean, noisy = fedavg("none"), fedavg(f"noise=std:{sigma}")
    clean.step()
    noisy.step()

    def z(src: int, dst: int, phase: int) -> torch.Tensor:
        return sigma * NoiseDraws(seed, arc_keys([(src, dst)])).normals(1, phase, D)[0]

    down = noisy.block.workspace["down"] - clean.block.workspace["down"]
    assert torch.equal(down[0], torch.zeros(D, dtype=torch.float64))  # the server's own row
    for i in range(1, N):
        assert torch.allclose(down[i, :D], z(0, i, 0), rtol=0, atol=1e-15)
    uplink = sum(z(i, 0, 1) for i in range(1, N)) / (N - 1)
    assert torch.allclose(noisy.block.x[0] - clean.block.x[0], uplink, rtol=0, atol=1e-14)
    assert torch.equal(clean.block.x[0], torch.from_numpy(X0))  # without noise it stays put
    assert noisy.record()["bits_per_node"] == clean.record()["bits_per_node"]
