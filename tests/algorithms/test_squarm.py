"""SQuARM-SGD (docs/algorithms/squarm-sgd.md): the engine equals the float64 matrix form with
momentum, local steps and the trigger; β = 0, H = 1 and no trigger is CHOCO-SGD bit for bit;
an unreachable threshold sends nothing (independent local momentum SGD); the skips are
counted; resume equals the uninterrupted run."""

from __future__ import annotations

import io

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.helpers import reference_adaptive as ref
from tests.helpers.reference_adaptive import QuadraticOracle, quadratic_problem, run_engine

N, D = 6, 11


def _problem(seed=7):
    data, grads = quadratic_problem(N, D, seed=seed, scales=[0.2, 0.5, 1, 2, 1.5, 3])
    x0 = torch.randn(N, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return data, grads, x0


@pytest.mark.parametrize("hp", [
    {"beta": 0.9, "local_steps": 3, "threshold": 10000.0},
    {"beta": 0.5, "local_steps": 1, "threshold": 100.0, "threshold_step": 300.0, "threshold_every": 4},
    {"beta": 0.0, "local_steps": 2, "threshold": 0.0},
])
def test_equals_the_matrix_form(hp):
    """top-k (deterministic), so the reference reproduces every message; 17 rounds."""
    data, grads, x0 = _problem()
    topo = topologies.build("erdos-renyi:p=0.5", N, seed=2)
    W = torch.tensor(topo.dense(), dtype=torch.float64)
    eta, gamma, rounds = 0.02, 0.4, 17
    eng, X = run_engine(make_algorithm("squarm-sgd", eta=eta, gamma=gamma, **hp), topo, x0, data,
                        rounds, compressor="topk:4")
    want, sends, skips = ref.squarm(x0, grads, rounds, W, eta=eta, gamma=gamma,
                                    compress=ref.topk(4), **hp)
    torch.testing.assert_close(X, want, rtol=1e-11, atol=1e-11)
    rec = eng.record()
    assert (rec["sends"], rec["sends_skipped"]) == (sends, skips)
    assert rec["skip_rate"] == (skips / (sends + skips))
    if hp["threshold"] > 0:
        assert 0 < skips < sends + skips  # the trigger both fired and held back


@pytest.mark.parametrize("compressor", ["topk:0.3", "randk:0.5+qsgd:3:biased", "qsgd:4"])
def test_no_momentum_one_step_no_trigger_is_choco_bit_for_bit(compressor):
    data, _, x0 = _problem(seed=3)
    topo = topologies.build("ring", N)
    ours, X = run_engine(make_algorithm("squarm-sgd", eta=0.03, gamma=0.3, beta=0.0,
                                        local_steps=1, threshold=0.0), topo, x0, data, 12, compressor)
    theirs, Y = run_engine(make_algorithm("choco", eta=0.03, gamma=0.3), topo, x0, data, 12, compressor)
    assert torch.equal(X, Y)
    assert ours.transport.bytes_sent == theirs.transport.bytes_sent


def test_an_unreachable_threshold_sends_no_model():
    """No copy moves, so the consensus step adds nothing: every node runs its own Nesterov SGD;
    only the flag bytes travel (one per arc per synchronisation)."""
    data, grads, x0 = _problem(seed=5)
    topo = topologies.build("ring", N)
    rounds, H = 12, 3
    eng, X = run_engine(make_algorithm("squarm-sgd", eta=0.02, gamma=0.5, local_steps=H,
                                       threshold=1e30), topo, x0, data, rounds, "topk:0.5")
    want, V = x0.clone(), torch.zeros_like(x0)
    for t in range(1, rounds + 1):
        G = grads(t, want)
        V = 0.9 * V + G
        want = want - 0.02 * (G + 0.9 * V)
    torch.testing.assert_close(X, want, rtol=1e-12, atol=1e-12)
    assert all(b == 2 * rounds // H for b in eng.transport.bytes_sent.values())  # 2 arcs, 1 byte
    assert eng.record()["skip_rate"] == 1.0


def test_local_steps_divide_the_messages():
    data, _, x0 = _problem()
    topo = topologies.build("ring", N)
    every, _ = run_engine(make_algorithm("squarm-sgd", eta=0.02, local_steps=1, threshold=0.0),
                          topo, x0, data, 12, "topk:0.5")
    fourth, _ = run_engine(make_algorithm("squarm-sgd", eta=0.02, local_steps=4, threshold=0.0),
                           topo, x0, data, 12, "topk:0.5")
    assert {i: 4 * b for i, b in fourth.transport.bytes_sent.items()} == every.transport.bytes_sent


def _engine(hp):
    data, _, x0 = _problem(seed=9)
    return Engine(make_algorithm("squarm-sgd", **hp), topologies.build("ring", N), lambda i: x0[i],
                  compressor="randk:0.5+qsgd:4:biased", seed=3,
                  oracles=lambda i, gen: QuadraticOracle(data, i))


def test_resume_equals_uninterrupted_run():
    hp = {"eta": 0.02, "gamma": 0.4, "local_steps": 2, "threshold": 1000.0, "threshold_step": 500.0,
          "threshold_every": 3}
    whole = _engine(hp)
    whole.run(13, log_every=13)
    first = _engine(hp)
    first.run(5, log_every=5)
    buf = io.BytesIO()
    torch.save({"nodes": first.node_state_dicts(), "run": first.run_state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = _engine(hp)
    resumed.load_state_dicts(saved["nodes"], saved["run"])
    resumed.run(8, log_every=8)
    for i in range(N):
        assert torch.equal(resumed.nodes[i].x, whole.nodes[i].x), i
    a, b = resumed.record(), whole.record()
    assert 0 < a["sends_skipped"] == b["sends_skipped"] and a["sends"] == b["sends"]
    assert a["bits_per_node"] == b["bits_per_node"]


@pytest.mark.parametrize(("hp", "match"), [
    ({"beta": 1.0}, "beta = 1.0"),
    ({"local_steps": 0}, "local_steps = 0: a whole number >= 1"),
    ({"threshold_every": -1}, "threshold_every = -1: a whole number >= 0"),
    ({"threshold": -1.0}, "threshold = -1.0"),
])
def test_bad_hyper_parameters_are_refused(hp, match):
    with pytest.raises(ConfigError, match=match):
        make_algorithm("squarm-sgd", **hp)
