"""robust-push-sgd (RASGP, gossip/algorithms/robust_push_sgd.py): gradient-push over running
sums whose sleeping nodes catch up their gradient steps when they wake, with the paper's
diminishing step (docs/algorithms/robust-push-sgd.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip import Engine, make_algorithm, make_problem
from gossip.network.draws import ActivityDraws, LagDraws, LossDraws, arc_keys
from gossip.network.spec import parse_network
from tests.helpers.resume import stopped_and_resumed

N, D = 6, 3


def _problem(n: int = N, d: int = D):
    return make_problem("least-squares", n_nodes=n, dim=d, samples_per_node=12, seed=4,
                        heterogeneity=2.0, dtype=torch.float64)


def _engine(topo, problem, network=None, seed=0, **hp):
    x0 = problem.initial_point()
    return Engine(make_algorithm("robust-push-sgd", **hp), topo, lambda i: x0,
                  compressor="none", network=network, seed=seed,
                  oracles=lambda i, gen: problem.oracle(i, gen, "full", 2))


def _rate(eta: float, mu: float):
    return lambda t: min(eta, 1.0 / (mu * t)) if mu > 0 else eta


def _reference(topo, problem, rounds: int, network: str | None, seed: int, eta: float,
               mu: float) -> np.ndarray:
    """RASGP in float64 numpy, written from the rule of docs/algorithms/robust-push-sgd.md
    with the drops, lags and wake-ups drawn from the engine's keys: an active node steps by the
    sum of α(u) since its last active round at its model, pushes ``(s, w)`` into its running
    sum and sends it (lost, or handed over ``lag`` rounds later, unordered; an arc touching a
    sleeping node is silent), then applies ``c_ij (σ − ρ_ij)`` of the newest message past its
    counter; a sleeping node does nothing."""
    n = topo.n
    x0 = problem.initial_point().numpy()
    d = x0.size
    alpha = _rate(eta, mu)
    net = parse_network(network) if network else None
    arcs = sorted((j, i) for i in range(n) for j in topo.view(i).in_neighbors)
    keys = arc_keys(arcs)
    loss = LossDraws(net.loss, seed, keys) if net is not None and net.lossy else None
    lag = LagDraws(net.stale, seed, keys) if net is not None and net.late else None
    wake = ActivityDraws(net.active, seed, n) if net is not None and net.active else None
    c = {(j, i): topo.view(i).weight_of(j) for j, i in arcs}
    own = np.array([topo.view(i).self_weight for i in range(n)])
    z = np.concatenate([np.tile(x0, (n, 1)), np.ones((n, 1))], axis=1)
    woke = np.zeros(n, dtype=np.int64)
    sigma = np.zeros_like(z)
    rho = {a: np.zeros(d + 1) for a in arcs}
    kappa = dict.fromkeys(arcs, 0)
    queue: dict[tuple[int, int], list] = {a: [] for a in arcs}
    for t in range(1, rounds + 1):
        on = wake.active(t) if wake is not None else np.ones(n, dtype=bool)
        for i in np.flatnonzero(on):
            x = z[i, :d] / z[i, d]
            g = problem.grad_full(int(i), torch.from_numpy(x)).numpy()
            z[i, :d] -= sum(alpha(u) for u in range(woke[i] + 1, t + 1)) * g
            woke[i] = t
            sigma[i] += z[i]
        lost = loss.lost(t, 0) if loss is not None else np.zeros(len(arcs), bool)
        lags = lag.lags(t, 0) if lag is not None else np.zeros(len(arcs), np.int64)
        for a, (j, i) in enumerate(arcs):
            if not lost[a] and on[j] and on[i]:
                queue[(j, i)].append((t, t + int(lags[a]), sigma[j].copy()))
        got = np.zeros_like(z)
        for j, i in arcs:
            if not on[i]:
                continue
            due = [m for m in queue[(j, i)] if m[1] <= t]
            queue[(j, i)] = [m for m in queue[(j, i)] if m[1] > t]
            if due:
                sent, _, sig = max(due, key=lambda m: m[0])
                if sent > kappa[(j, i)]:
                    got[i] += c[(j, i)] * (sig - rho[(j, i)])
                    rho[(j, i)], kappa[(j, i)] = sig, sent
        z = np.where(on[:, None], own[:, None] * z + got, z)
    return z[:, :d] / z[:, d:]


@pytest.mark.parametrize("graph, network, mu", [
    ("directed-exponential", None, 0.3),
    ("directed-random:p=0.4", "loss=0.1;stale=geom:0.5", 0.3),
    ("ring", "loss=0.2;active=0.6", 0.0),
    ("directed-exponential", "active=markov:p_off=0.4,p_on=0.5", 0.3),
])
def test_equals_the_float64_recursion(graph, network, mu):
    """The engine's rounds are the rule (drops, lags and wake-ups from the same keys),
    sleeping nodes' catch-up steps included."""
    problem = _problem()
    topo = topologies.build(graph, N, weights="push", seed=3)
    eta = 0.2 / problem.smoothness().L
    e = _engine(topo, problem, network, seed=5, eta=eta, mu=mu)
    e.run(40)
    ref = _reference(topo, problem, 40, network, 5, eta, mu)
    assert np.abs(e.block.x.numpy() - ref).max() < 1e-12
    if network and "active" in network:  # some node slept, and caught up
        assert int(e.record()["node_rounds_active_total"]) < 40 * N


def test_without_faults_it_is_push_sum_sgd():
    """Awake every round and without faults: push-sum SGD (``sgp``) with the same step."""
    n = 8
    problem = _problem(n, 4)
    topo = topologies.build("directed-random:p=0.3", n, weights="push", seed=1)
    eta, mu = 0.2 / problem.smoothness().L, problem.smoothness().mu
    x0 = problem.initial_point()
    a = _engine(topo, problem, eta=eta, mu=mu)
    b = Engine(make_algorithm("push-sum", eta=_rate(eta, mu)), topo, lambda i: x0,
               compressor="none", oracles=lambda i, gen: problem.oracle(i, gen, "full", 2))
    a.run(40)
    b.run(40)
    assert torch.allclose(a.block.x, b.block.x, rtol=0, atol=1e-13)


def test_diminishing_step_goes_below_the_constant_steps_neighborhood():
    """Under message loss, the paper's step min(η, 1/(μt)) keeps approaching x* (its error
    falls as 1/t), where the constant η stays in a neighborhood of x* (heterogeneous data: no
    tracking; the distance moves with the losses, it does not fall)."""
    n = 8
    problem = _problem(n, 4)
    topo = topologies.build("exponential", n, weights="push")
    s = problem.smoothness()
    eta, x0, xs = 0.2 / s.L, problem.initial_point(), problem.solution()
    path = {}
    for mu in (0.0, s.mu):
        e = _engine(topo, problem, "loss=0.1", eta=eta, mu=mu)
        path[mu] = []
        for _ in range(3):
            e.run(60)
            path[mu].append(float((e.block.x - xs).norm(dim=1).max() / (x0 - xs).norm()))
    constant, diminishing = path[0.0], path[s.mu]
    assert diminishing[-1] < 0.5 * diminishing[0]  # still falling
    assert 2 * diminishing[-1] < min(constant)  # below the neighborhood the constant step keeps


def test_resume_equals_uninterrupted_with_sleeping_nodes():
    problem = _problem()
    topo = topologies.build("directed-random:p=0.4", N, weights="push", seed=3)
    straight, resumed = stopped_and_resumed(
        lambda: _engine(topo, problem, "loss=0.3;active=0.6", seed=2, mu=0.3), 30, 13)
    assert torch.equal(straight.block.x, resumed.block.x)
    for key, value in straight.block.state.items():
        assert torch.equal(value, resumed.block.state[key]), key
    for key, value in straight.block.arc_state.items():
        assert torch.equal(value, resumed.block.arc_state[key]), key
