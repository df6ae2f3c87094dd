"""LoDAdaC (docs/algorithms/lodadac.md): the engine equals the float64 matrix form of the
paper's Algorithm 1 for every second-moment rule; its reductions (CHOCO-SGD; exact gossip of the
half step); a communication step keeps the network average; rounds between exchanges send
nothing; a resumed run equals the uninterrupted one."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.checkpoint import Checkpointer
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.layout import Layout
from tests.helpers import reference_adaptive as ref
from tests.helpers.reference_adaptive import QuadraticOracle, quadratic_problem, run_engine

N, D = 6, 11
SCALES = [0.2, 0.5, 1, 2, 5, 3]


def common_start(seed: int = 1) -> torch.Tensor:
    """(N, D) rows all equal to one random x⁰ (the paper's start)."""
    x = torch.randn(D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.expand(N, D).clone()


def engine(hp: dict, compressor: str = "topk:4", layout: Layout | None = None, seed: int = 1,
           topology: str = "ring", data_seed: int = 7) -> Engine:
    data, _ = quadratic_problem(N, D, seed=data_seed, scales=SCALES)
    x0 = common_start()
    return Engine(make_algorithm("lodadac", **hp), topologies.build(topology, N), lambda i: x0[i],
                  compressor=compressor, oracles=lambda i, gen: QuadraticOracle(data, i),
                  layout=layout, seed=seed)


def models(eng: Engine) -> torch.Tensor:
    return torch.stack([eng.nodes[i].x for i in range(N)])


@pytest.mark.parametrize("rule", ["none", "adam", "amsgrad", "adagrad"])
@pytest.mark.parametrize("local_steps", [1, 3])
def test_equals_the_matrix_form(rule, local_steps):
    """Top-4 of 11 entries, 17 rounds: with K = 3 five exchanges and two local steps after."""
    rounds = 17
    topo = topologies.build("erdos-renyi:p=0.5", N, seed=2)
    W = torch.tensor(topo.dense(), dtype=torch.float64)
    data, grads = quadratic_problem(N, D, seed=7, scales=SCALES)
    x0 = common_start()
    hp = {"eta": 0.02, "gamma": 0.4, "local_steps": local_steps, "rule": rule, "delta": 0.1,
          "beta1": 0.0 if rule == "none" and local_steps == 1 else 0.9}
    _, X = run_engine(make_algorithm("lodadac", **hp), topo, x0, data, rounds, compressor="topk:4")
    want = ref.lodadac(x0, grads, rounds, W, compress=ref.topk(4), **hp)
    torch.testing.assert_close(X, want, rtol=1e-12, atol=1e-12)
    assert float((X - x0).abs().max()) > 0.1  # it moved
    assert float((X - X.mean(0)).abs().max()) > 1e-3  # and the nodes differ: the copies matter


def test_adam_mini_takes_one_second_moment_per_tensor():
    """Adam-mini's u is one value per tensor of the layout (here a 2x3 matrix and a 5-vector)."""
    rounds, parts = 13, [slice(0, 6), slice(6, 11)]
    hp = {"eta": 0.02, "gamma": 0.5, "local_steps": 2, "rule": "adam-mini", "delta": 0.1}
    eng = engine(hp, compressor="none", layout=Layout([(2, 3), (5,)]))
    eng.run(rounds, log_every=rounds)
    _, grads = quadratic_problem(N, D, seed=7, scales=SCALES)
    W = torch.tensor(topologies.build("ring", N).dense(), dtype=torch.float64)
    want = ref.lodadac(common_start(), grads, rounds, W, parts=parts, **hp)
    torch.testing.assert_close(models(eng), want, rtol=1e-12, atol=1e-12)
    u = eng.nodes[0].state["u"]
    assert all(len(set(u[p].tolist())) == 1 for p in parts) and u[0] != u[6]


def test_reduces_to_choco_sgd():
    """K = 1, u ≡ 0, β1 = 0, δ = 1: CHOCO-SGD (Koloskova et al. ICML'19, Algorithm 2, written
    node by node as there), to rounding: the channel keeps y − x̂ by increments, the paper form
    sums w_ij (x̂_j − x̂_i). The local step itself is x − η g bit for bit."""
    rounds, eta, gamma = 25, 0.05, 0.3
    hp = {"eta": eta, "gamma": gamma, "local_steps": 1, "rule": "none", "beta1": 0.0, "delta": 1.0}
    eng = engine(hp, topology="erdos-renyi:p=0.5")
    eng.run(rounds, log_every=rounds)
    topo = topologies.build("erdos-renyi:p=0.5", N)
    W = torch.tensor(topo.dense(), dtype=torch.float64)
    data, grads = quadratic_problem(N, D, seed=7, scales=SCALES)
    want = ref.choco_sgd(common_start(), grads, rounds, W, eta=eta, gamma=gamma, compress=ref.topk(4))
    torch.testing.assert_close(models(eng), want, rtol=1e-12, atol=1e-12)
    assert float((models(eng) - common_start()).abs().max()) > 0.1

    one = engine({**hp, "local_steps": 2})  # one round without exchange: the local step alone
    one.step()
    x0 = common_start()
    assert torch.equal(models(one), x0 - eta * grads(1, x0))


def test_identity_and_gamma_one_is_exact_gossip_of_the_half_step():
    """K = 1, Q = identity, γ = 1: x̂ = x^{t+½} after every exchange, so x^{t+1} = W x^{t+½}."""
    rounds, eta, delta, b1, b2 = 15, 0.02, 0.1, 0.9, 0.999
    eng = engine({"eta": eta, "gamma": 1.0, "local_steps": 1, "rule": "adam", "delta": delta},
                 compressor="none")
    eng.run(rounds, log_every=rounds)
    W = torch.tensor(topologies.build("ring", N).dense(), dtype=torch.float64)
    _, grads = quadratic_problem(N, D, seed=7, scales=SCALES)
    X = common_start()
    M, U = torch.zeros_like(X), torch.zeros_like(X)
    for t in range(1, rounds + 1):
        G = grads(t, X)
        M = b1 * M + (1 - b1) * G
        X = W @ (X - eta * M / (torch.sqrt(U) + delta))
        U = b2 * U + (1 - b2) * G * G
    torch.testing.assert_close(models(eng), X, rtol=1e-12, atol=1e-12)
    x_hat = torch.stack([eng.nodes[i].state["x_hat"] for i in range(N)])
    torch.testing.assert_close(W @ x_hat, models(eng), rtol=1e-12, atol=1e-12)


def test_an_exchange_keeps_the_network_average_and_other_rounds_send_nothing():
    """mean_i x^{t+1} = mean_i x^{t+½} at every exchange (W doubly stochastic, any compressor),
    while the nodes themselves move; rounds between exchanges send no byte."""
    eta, delta, K = 0.03, 0.1, 3
    eng = engine({"eta": eta, "gamma": 0.6, "local_steps": K, "rule": "amsgrad", "delta": delta},
                 compressor="topk:3")
    exchanges = 0
    for t in range(1, 16):
        X, U = models(eng).clone(), torch.stack([eng.nodes[i].state["u"] for i in range(N)]).clone()
        sent = eng.transport.bytes_sent.get(0, 0)
        eng.step()
        M = torch.stack([eng.nodes[i].state["m"] for i in range(N)])
        half = X - eta * M / (torch.sqrt(U) + delta)  # x^{t+½} from the step's own m and old u
        after = models(eng)
        if t % K:
            assert eng.transport.bytes_sent.get(0, 0) == sent
            torch.testing.assert_close(after, half, rtol=1e-14, atol=1e-14)
        else:
            exchanges += 1
            assert eng.transport.bytes_sent.get(0, 0) > sent
            assert float((after - half).abs().max()) > 1e-4  # the consensus step moved them
            torch.testing.assert_close(after.mean(0), half.mean(0), rtol=1e-13, atol=1e-13)
    assert exchanges == 5


@pytest.mark.parametrize(("rule", "spec"), [("amsgrad", "topk:0.4"), ("adagrad", "randk:0.4"),
                                            ("adam-mini", "qsgd:4bit:biased")])
def test_resume_equals_uninterrupted(tmp_path, rule, spec):
    """A checkpoint after round 5 (mid-period, K = 3) and 5 more rounds: the same bits as 10
    rounds in one go (moments, copies, the random streams of randk and qsgd)."""
    hp = {"eta": 0.02, "gamma": 0.5, "local_steps": 3, "rule": rule, "delta": 0.1}
    layout = Layout([(2, 3), (5,)])
    full = engine(hp, spec, layout)
    for _ in range(10):
        full.step()
    first = engine(hp, spec, layout)
    ck = Checkpointer(tmp_path, identity={"run": "lodadac"}, every=5)
    for _ in range(5):
        first.step()
    ck.save(first)
    resumed = engine(hp, spec, layout)
    assert ck.restore(resumed) == 5
    for _ in range(5):
        resumed.step()
    for i in range(N):
        assert torch.equal(full.nodes[i].x, resumed.nodes[i].x)
        for key, value in full.nodes[i].state.items():
            assert torch.equal(value, resumed.nodes[i].state[key]), key
    assert float((models(full) - common_start()).abs().max()) > 0.1


def test_zero_start_copies_take_any_starting_models():
    """start='zero' (x̂⁰ = 0, y⁰ = 0) runs nodes that start apart and still keeps the average;
    the paper's start refuses them."""
    data, _ = quadratic_problem(N, D, seed=7, scales=SCALES)
    x0 = torch.randn(N, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    topo = topologies.build("ring", N)
    hp = {"eta": 0.0, "gamma": 0.5, "local_steps": 1, "rule": "none", "delta": 1.0}
    with pytest.raises(ConfigError, match="start them equal, or pass start='zero'"):
        Engine(make_algorithm("lodadac", **hp), topo, lambda i: x0[i], compressor="topk:4",
               oracles=lambda i, gen: QuadraticOracle(data, i))
    eng = Engine(make_algorithm("lodadac", start="zero", **hp), topo, lambda i: x0[i],
                 compressor="topk:4", oracles=lambda i, gen: QuadraticOracle(data, i))
    eng.run(200, log_every=200)
    X = models(eng)
    torch.testing.assert_close(X.mean(0), x0.mean(0), rtol=1e-12, atol=1e-12)
    assert float((X - X.mean(0)).abs().max()) < 1e-6 * float((x0 - x0.mean(0)).abs().max())


@pytest.mark.parametrize(("hp", "match"), [
    ({"local_steps": 0}, "local_steps = 0 must be an integer >= 1"),
    ({"local_steps": 2.5}, "local_steps = 2.5 must be an integer >= 1"),
    ({"rule": "rmsprop"}, "rule = 'rmsprop' is not one of none, adam, amsgrad, adagrad, adam-mini"),
    ({"gamma": 1.5}, "gamma = 1.5 is outside"),
    ({"delta": 0.0}, "delta = 0.0 is outside"),
    ({"beta1": 1.0}, "beta1 = 1.0 must be in"),
    ({"start": "mean"}, "start = 'mean' is not 'common'"),
])
def test_bad_hyper_parameters_are_refused(hp, match):
    with pytest.raises(ConfigError, match=match):
        make_algorithm("lodadac", **hp)


def test_runs_under_lost_messages():
    """on_loss "drop", as CHOCO: a lost q_j never reaches the receiver's copy of x̂_j (that copy
    drifts from the sender's own), and the run still trains, within 3x the lossless distance."""
    from tests.helpers.algorithm_setup import HETERO, distance

    ring = topologies.build("ring", 8)
    x0 = HETERO.initial_point()
    hp = make_algorithm("lodadac").suggest_hparams(HETERO, "full", ring)
    assert set(hp) == {"eta", "delta"}

    def run(network):
        eng = Engine(make_algorithm("lodadac", local_steps=1, **hp), ring, lambda i: x0,
                     network=network, seed=1, compressor="topk:0.4",
                     oracles=lambda i, gen: HETERO.oracle(i, gen))
        for _ in range(300):
            eng.step()
        return eng

    ideal, lossy = run(None), run("loss=0.1")
    assert lossy.network.delivery.lost_total.sum() > 0
    assert distance(lossy, HETERO) < 3 * distance(ideal, HETERO)
