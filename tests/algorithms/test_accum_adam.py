"""AccumAdam / AccumAdamW (Decent-DP's decentralized Adam, docs/algorithms/accum-adam.md):
the engine equals the float64 matrix form, on static and time-varying graphs; with one round
per window and equal nodes it is torch's Adam / AdamW; it sends what D-PSGD sends."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.errors import ConfigError
from tests.helpers import reference_adaptive as ref
from tests.helpers.reference_adaptive import quadratic_problem, run_engine

CASES = [
    ("accum-adam", {"eta": 0.02}),
    ("accum-adam", {"eta": 0.02, "weight_decay": 0.05, "accum_iter": 3}),
    ("accum-adam", {"eta": 0.02, "weight_decay": 0.0, "accum_iter": 1, "gamma": 0.7}),
    ("accum-adamw", {"eta": 0.02}),
    ("accum-adamw", {"eta": 0.03, "weight_decay": 0.3, "accum_iter": 5, "beta1": 0.5,
                     "beta2": 0.9, "eps": 1e-3}),
]


def _reference_hp(name: str, hp: dict) -> dict:
    cls = type(make_algorithm(name))
    return {"weight_decay": cls.default_weight_decay, **hp, "decoupled": cls.decoupled}


@pytest.mark.parametrize(("name", "hp"), CASES)
def test_equals_the_matrix_form(name, hp):
    n, d, rounds = 6, 11, 17  # 17 rounds: complete windows and a partial one
    topo = topologies.build("erdos-renyi:p=0.5", n, seed=2)
    W = torch.tensor(topo.dense(), dtype=torch.float64)
    data, grads = quadratic_problem(n, d, seed=7, scales=[0.2, 0.5, 1, 2, 5, 3])
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, X = run_engine(make_algorithm(name, **hp), topo, x0, data, rounds)
    want = ref.accum_adam(x0, grads, rounds, W, **_reference_hp(name, hp))
    torch.testing.assert_close(X, want, rtol=1e-11, atol=1e-11)
    assert float((X - x0).abs().max()) > 0.1  # it moved


def test_equals_the_matrix_form_on_a_time_varying_graph():
    """Decent-DP's graphs change every step (one peer a step): W_t of round t."""
    n, d, rounds, hp = 8, 9, 12, {"eta": 0.02, "weight_decay": 0.1, "accum_iter": 3}
    topo = topologies.build("one-peer-exponential", n)
    data, grads = quadratic_problem(n, d, seed=5)
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    _, X = run_engine(make_algorithm("accum-adamw", **hp), topo, x0, data, rounds)
    want, state = x0, None
    for t in range(1, rounds + 1):  # one round of the reference at a time, with W_t
        want, state = _reference_round(want, grads, t, topo.at_round(t), state, **hp)
    torch.testing.assert_close(X, want, rtol=1e-11, atol=1e-11)


def _reference_round(X, grads, t, topo_t, state, *, eta, weight_decay, accum_iter):
    """Round t of :func:`reference_adaptive.accum_adam` (AdamW) with the graph of round t."""
    import math

    W = torch.tensor(topo_t.dense(), dtype=torch.float64)
    M, V, B = state if state is not None else (torch.zeros_like(X),) * 3
    b1, b2, eps, s = 0.9, 0.999, 1e-8, accum_iter
    G = grads(t, X)
    Y = (1 - eta * weight_decay) * (W @ X)
    B = B + G / s
    k = -(-t // s)
    Mt, Vt = b1 * M + (1 - b1) * G, b2 * V + (1 - b2) * G * G
    X = Y - eta / (1 - b1**k) * Mt / (torch.sqrt(Vt) / math.sqrt(1 - b2**k) + eps)
    if t % s == 0:
        M, V, B = b1 * M + (1 - b1) * B, b2 * V + (1 - b2) * B * B, torch.zeros_like(B)
    return X, (M, V, B)


@pytest.mark.parametrize(("name", "torch_optimizer", "wd"),
                         [("accum-adam", torch.optim.Adam, 0.05), ("accum-adamw", torch.optim.AdamW, 0.2)])
def test_one_round_windows_on_equal_nodes_is_torch_adam(name, torch_optimizer, wd):
    """accum_iter = 1 moves the moments every round from the round's gradient: Adam (AdamW),
    and nodes with the same data and start stay equal under mixing, whatever the graph."""
    n, d, rounds = 5, 8, 20
    (A, b, s), _ = quadratic_problem(n, d, seed=4)
    A[:], b[:] = A[0].clone(), b[0].clone()
    x0 = torch.randn(d, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    _, X = run_engine(make_algorithm(name, eta=0.05, weight_decay=wd, accum_iter=1),
                      topologies.build("ring", n), x0.expand(n, d).clone(), (A, b, s), rounds)
    p = torch.nn.Parameter(x0.clone())
    opt = torch_optimizer([p], lr=0.05, weight_decay=wd)
    for _ in range(rounds):
        p.grad = A[0].T @ (A[0] @ p.detach() - b[0])
        opt.step()
    torch.testing.assert_close(X, p.detach().expand(n, d), rtol=1e-12, atol=1e-12)


def test_sends_what_dpsgd_sends():
    """The model, exact, once a round to every neighbor: D-PSGD's messages."""
    n, d, rounds = 6, 13, 7
    data, _ = quadratic_problem(n, d, seed=1)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    topo = topologies.build("ring", n)
    ours, _ = run_engine(make_algorithm("accum-adam"), topo, x0, data, rounds)
    theirs, _ = run_engine(make_algorithm("dpsgd", eta=0.01), topo, x0, data, rounds)
    assert ours.transport.bytes_sent == theirs.transport.bytes_sent
    assert 2 * rounds * d * 8 <= ours.transport.bytes_sent[0] <= 2 * rounds * (d * 8 + 64)


@pytest.mark.parametrize(("hp", "match"), [
    ({"accum_iter": 0}, "accum_iter = 0 must be an integer >= 1"),
    ({"accum_iter": 2.5}, "accum_iter = 2.5 must be an integer >= 1"),
    ({"weight_decay": -0.1}, "weight_decay = -0.1 is outside"),
    ({"beta2": 1.0}, "beta2 = 1.0 must be in"),
])
def test_bad_hyper_parameters_are_refused(hp, match):
    with pytest.raises(ConfigError, match=match):
        make_algorithm("accum-adam", **hp)


def test_a_lossy_compressor_is_refused():
    data, _ = quadratic_problem(4, 5)
    with pytest.raises(ConfigError, match="accum-adamw mixes exact models, as Decent-DP: use "
                                          r"--compressor none \(got 'topk:0.5'\)"):
        run_engine(make_algorithm("accum-adamw"), topologies.build("ring", 4),
                   torch.zeros(4, 5, dtype=torch.float64), data, 1, compressor="topk:0.5")


def test_defaults_are_decent_dps():
    adam, adamw = make_algorithm("accum-adam"), make_algorithm("accum-adamw")
    assert adam.hparams() == {"eta": 1e-3, "gamma": 1.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                              "weight_decay": 1 / 32768, "accum_iter": 4}
    assert adamw.hparams() == {**adam.hparams(), "weight_decay": 0.1}


def test_one_round_windows_are_dpsgd_with_a_torch_adam_in_training():
    """In the trainer (digits MLP, float64, 4 nodes on a ring, different batches): accum-adam
    with accum_iter = 1 and no decay is D-PSGD whose nodes step with ``torch.optim.Adam``."""
    from gossip.training import DecentralizedTrainer, digits
    from tests.helpers import wrap_runs

    train, _ = digits()

    def run(algorithm, optimizer):
        trainer = DecentralizedTrainer(
            wrap_runs.model(dtype=torch.float64), train, topology=topologies.build("ring", 4),
            algorithm=algorithm, compressor="none", optimizer=optimizer,
            batch_size=wrap_runs.BATCH, seed=0, dtype=torch.float64)
        trainer.fit(rounds=8, log_every=8)
        return trainer.engine.block.x.clone()

    ours = run(make_algorithm("accum-adam", eta=0.01, accum_iter=1, weight_decay=0.0), None)
    theirs = run(make_algorithm("dpsgd"), lambda p: torch.optim.Adam(p, lr=0.01))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    start = torch.cat([p.detach().reshape(-1)
                       for p in wrap_runs.model(dtype=torch.float64).parameters()])
    assert float((ours - start).abs().max()) > 0.01  # it trained
