"""Running sums (gossip/core/running.py) and the methods built on them: robust-push-sum and
robust-push-tracking, exact under lost and late messages together (docs/network.md, "Running
sums")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip import Engine, make_algorithm, make_problem
from gossip.errors import ConfigError
from gossip.network.draws import LagDraws, LossDraws, arc_keys
from gossip.network.spec import parse_network
from tests.helpers.resume import stopped_and_resumed

FAULTS = "loss=0.1;stale=geom:0.5"


def _x0(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _consensus(topo, X0, network=None, seed=0, **hp):
    return Engine(make_algorithm("robust-push-sum", **hp), topo, lambda i: X0[i].clone(),
                  compressor="none", network=network, seed=seed)


def _reference(topo, X0: np.ndarray, rounds: int, network: str | None, seed: int) -> np.ndarray:
    """The running-sum recursion in float64 numpy, written from the rule (module doc of
    gossip/core/running.py), with the drops and lags drawn from the same keys as the engine's:
    ``σ_j += (s_j, w_j)``; each message not lost is handed over ``lag`` rounds later (not in
    order); the receiver applies ``c_ij (σ − ρ_ij)`` of the newest one past its counter."""
    n, d = X0.shape
    net = parse_network(network) if network else None
    arcs = sorted((j, i) for i in range(n) for j in topo.view(i).in_neighbors)
    keys = arc_keys(arcs)
    loss = LossDraws(net.loss, seed, keys) if net is not None and net.lossy else None
    lag = LagDraws(net.stale, seed, keys) if net is not None and net.late else None
    c = {(j, i): topo.view(i).weight_of(j) for j, i in arcs}
    own = np.array([topo.view(i).self_weight for i in range(n)])
    z = np.concatenate([X0, np.ones((n, 1))], axis=1)
    sigma = np.zeros_like(z)
    rho = {a: np.zeros(d + 1) for a in arcs}
    kappa = dict.fromkeys(arcs, 0)
    queue: dict[tuple[int, int], list] = {a: [] for a in arcs}
    for t in range(1, rounds + 1):
        sigma = sigma + z
        lost = loss.lost(t, 0) if loss is not None else np.zeros(len(arcs), bool)
        lags = lag.lags(t, 0) if lag is not None else np.zeros(len(arcs), np.int64)
        for a, (j, i) in enumerate(arcs):
            if not lost[a]:
                queue[(j, i)].append((t, t + int(lags[a]), sigma[j].copy()))
        got = np.zeros_like(z)
        for j, i in sorted(arcs, key=lambda a: (a[1], a[0])):
            due = [m for m in queue[(j, i)] if m[1] <= t]
            queue[(j, i)] = [m for m in queue[(j, i)] if m[1] > t]
            if due:
                sent, _, sig = max(due, key=lambda m: m[0])
                if sent > kappa[(j, i)]:
                    got[i] += c[(j, i)] * (sig - rho[(j, i)])
                    rho[(j, i)], kappa[(j, i)] = sig, sent
        z = own[:, None] * z + got
    return z[:, :d] / z[:, d:]


@pytest.mark.parametrize("graph, network", [("directed-exponential", None),
                                            ("ring", "loss=0.2"),
                                            ("directed-random:p=0.3", FAULTS),
                                            ("exponential", "loss=0.3;stale=uniform:0,4")])
def test_equals_the_float64_recursion(graph, network):
    """The engine's rounds are the running-sum recursion (drops and lags from the same keys)."""
    n, d = 8, 5
    topo = topologies.build(graph, n, weights="push", seed=3)
    X0 = _x0(n, d)
    e = _consensus(topo, X0, network, seed=5)
    e.run(60)
    ref = _reference(topo, X0.numpy(), 60, network, 5)
    assert np.abs(e.block.x.numpy() - ref).max() < 1e-12


def test_without_faults_it_is_push_sum():
    n = 16
    topo = topologies.build("directed-random:p=0.3", n, weights="push", seed=1)
    X0 = _x0(n, 7)
    a = _consensus(topo, X0)
    b = Engine(make_algorithm("push-sum"), topo, lambda i: X0[i].clone(), compressor="none")
    a.run(40)
    b.run(40)
    assert torch.allclose(a.block.x, b.block.x, rtol=0, atol=1e-13)
    assert float(a.block.state["rps.superseded"].sum()) == 0


def test_running_sum_invariant_on_every_arc():
    """After every round, on every arc (j, i): ρ_ij is exactly σ_j as it was when the message
    with counter κ_ij was sent (what was received), and ``σ_j + carry_j − ρ_ij`` is everything
    j pushed since (in flight, or lost and superseded); so Σ s and Σ w plus what is in flight
    stay Σ x⁰ and n. Late messages overtake each other and older ones are ignored."""
    n, d = 8, 4
    topo = topologies.build("directed-random:p=0.4", n, weights="push", seed=2)
    X0 = _x0(n, d, 1)
    e = _consensus(topo, X0, "loss=0.2;stale=uniform:0,4", seed=7)
    rs = e.block.workspace["sums"]
    history = {0: torch.zeros(n, d + 1, dtype=torch.float64)}
    pushed = torch.zeros(n, d + 1, dtype=torch.float64)
    for t in range(1, 80):
        z = torch.cat([e.block.state["s"], e.block.state["w"]], dim=1)
        pushed += z
        e.step()
        history[t] = rs.sigma + rs.carry
        assert torch.allclose(rs.sigma + rs.carry, pushed, rtol=1e-15, atol=1e-13)
        for k, (j, _) in enumerate(rs.route.incoming):
            sent = int(rs.count[k])
            assert torch.equal(rs.rho[k], history[sent][j]) if sent else not rs.rho[k].any()
        flight = rs.in_flight().sum(0)
        total = torch.cat([e.block.state["s"], e.block.state["w"]], dim=1).sum(0) + flight
        expect = torch.cat([X0.sum(0), torch.tensor([float(n)], dtype=torch.float64)])
        assert torch.allclose(total, expect, rtol=0, atol=1e-12)
    assert float(e.block.state["rps.superseded"].sum()) > 0  # reordered, and ignored
    assert float(rs.in_flight().abs().sum()) > 0


@pytest.mark.parametrize("graph", ["directed-exponential", "exponential"])
def test_exact_average_under_loss_and_lags(graph):
    n = 16
    topo = topologies.build(graph, n, weights="push")
    X0 = _x0(n, 10)
    e = _consensus(topo, X0, FAULTS)
    recs = e.run(400, log_every=400)
    assert (e.block.x - X0.mean(0)).abs().max() < 1e-12
    end = recs[-1]
    assert end["messages_lost_total"] > 0 and end["messages_late_total"] > 0
    assert end["superseded"] > 0


def test_exact_average_with_sleeping_nodes():
    """An inactive node's arcs are silent (as lost): its running sums and in-arc registers are
    put back with its other rows, and the average stays exact."""
    n = 8
    X0 = _x0(n, 5, 2)
    e = _consensus(topologies.build("directed-exponential", n, weights="push"), X0,
                   "loss=0.1;active=0.7", seed=1)
    e.run(300)
    assert (e.block.x - X0.mean(0)).abs().max() < 1e-12


def test_resume_equals_uninterrupted_under_loss():
    n = 8
    topo = topologies.build("directed-random:p=0.3", n, weights="push", seed=3)
    X0 = _x0(n, 5)
    straight, resumed = stopped_and_resumed(lambda: _consensus(topo, X0, "loss=0.3", seed=2), 30, 13)
    assert torch.equal(straight.block.x, resumed.block.x)
    for key, value in straight.block.arc_state.items():
        assert torch.equal(value, resumed.block.arc_state[key]), key
    for key, value in straight.block.state.items():
        assert torch.equal(value, resumed.block.state[key]), key


@pytest.mark.parametrize("column, value", [(5, 7.0), (5, 0.5), (2, float("nan"))])
def test_a_bad_message_is_refused_naming_its_sender(monkeypatch, column, value):
    """A counter no sender writes (from the future, not an integer) or a value that is not
    finite stops the run at the receiver, naming the sender."""
    from gossip.core.running import RunningSums
    from gossip.errors import NodeError

    send = RunningSums.send

    def forged(self, z):
        rows = send(self, z)
        if self.block.round == 3:
            rows.mine().view(torch.float64)[2, column] = value  # node 2's message
        return rows

    monkeypatch.setattr(RunningSums, "send", forged)
    topo = topologies.build("directed-exponential", 8, weights="push")
    e = _consensus(topo, _x0(8, 4))
    e.run(2)
    with pytest.raises(NodeError) as err:
        e.run(1)
    assert err.value.sender == 2 and err.value.receiver in topo.view(2).out_neighbors


def test_refusals():
    topo = topologies.build("ring", 8, weights="push")
    X0 = _x0(8, 5)
    with pytest.raises(ConfigError, match="compressor"):
        Engine(make_algorithm("robust-push-sum"), topo, lambda i: X0[i], compressor="topk:0.5")
    with pytest.raises(ConfigError):
        Engine(make_algorithm("robust-push-sum"), topologies.build("one-peer-exponential", 8,
                                                                   weights="push"),
               lambda i: X0[i], compressor="none").run(1)
    with pytest.raises(ConfigError, match="noise"):
        Engine(make_algorithm("robust-push-sum"), topo, lambda i: X0[i], compressor="none",
               network="loss=0.1;noise=var:0.1").run(1)


# -- gradient tracking over running sums -------------------------------------------------------
def _least_squares(n: int, d: int = 5):
    problem = make_problem("least-squares", n_nodes=n, dim=d, samples_per_node=12, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    return problem, problem.initial_point(), problem.solution()


def _tracking(name, topo, problem, x0, network=None, eta_l=0.2, seed=0):
    eta = eta_l / problem.smoothness().L
    return Engine(make_algorithm(name, eta=eta), topo, lambda i: x0, compressor="none",
                  network=network, seed=seed,
                  oracles=lambda i, gen: problem.oracle(i, gen, "full", 2))


def _distance(e, x0, xs) -> float:
    return float((e.block.x - xs).norm(dim=1).max() / (x0 - xs).norm())


def test_tracking_reaches_the_exact_optimum_under_loss_lags_and_a_straggler():
    n = 8
    problem, x0, xs = _least_squares(n)
    topo = topologies.build("directed-exponential", n, weights="push")
    e = _tracking("robust-push-tracking", topo, problem, x0, FAULTS + ";slow=nodes:0x5")
    u = e.block.state
    for _ in range(40):  # Σ y plus the tracker in flight is Σ ∇f_i(x_i) at every round
        e.step()
        rs = e.block.workspace["sums"]
        d = x0.numel()
        flight = rs.in_flight().sum(0)[d : 2 * d]
        assert torch.allclose(u["y"].sum(0) + flight, u["g"].sum(0), rtol=0, atol=1e-11)
    recs = e.run(900, log_every=900)
    assert _distance(e, x0, xs) <= 1e-10
    assert recs[-1]["messages_lost_total"] > 0 and recs[-1]["messages_late_total"] > 0
    assert recs[-1]["time_virtual_s"] > 0


def test_tracking_without_faults_keeps_push_dignings_rate():
    """Without faults it is Push-DIGing: on a doubly stochastic graph its rate is DIGing's to
    within 2x (rounds to a relative distance of 1e-8)."""
    n = 16
    problem, x0, xs = _least_squares(n)

    def rounds_to(name, weights):
        e = _tracking(name, topologies.build("exponential", n, weights=weights), problem, x0)
        for t in range(1, 3000):
            e.step()
            if _distance(e, x0, xs) < 1e-8:
                return t
        raise AssertionError(name)

    robust, diging = rounds_to("robust-push-tracking", "push"), rounds_to("diging", "metropolis")
    assert robust <= 2 * diging and diging <= 2 * robust
