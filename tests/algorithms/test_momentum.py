"""DoCoM and MoTEF: per-node code equals the matrix form (full and sampled gradients),
tracking invariants, exact convergence with full gradients, configuration errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.rng import generator, node_seed
from tests.helpers import reference as ref
from tests.helpers import reference_tracking as reft
from tests.helpers.algorithm_setup import (
    PROBLEM,
    TOPO,
    X0,
    N,
    W,
    assert_same,
    full_grad,
    oracles,
    row_compressor,
    run_engine,
    x0_fn,
)

L = PROBLEM.smoothness().L


@pytest.mark.parametrize(("spec", "gamma", "rounds"), [("none", 1.0, 60), ("sign", 0.3, 60),
                                                       ("topk:0.25", 0.2, 20)])
def test_docom_full_gradient_equals_matrix_form(spec, gamma, rounds):
    eta = 0.2 / L
    ours, eng = run_engine(make_algorithm("docom", eta=eta, gamma=gamma, beta=0.3), spec, rounds,
                           problem=PROBLEM)
    assert_same(ours, reft.docom(X0(), W, full_grad(PROBLEM), eta, gamma, 0.3, rounds,
                                 row_compressor(spec)))
    y = np.stack([eng.nodes[i].state["y"].numpy() for i in range(N)])
    v = np.stack([eng.nodes[i].state["v"].numpy() for i in range(N)])
    np.testing.assert_allclose(y.mean(0), v.mean(0), atol=1e-12)  # mean(y) = mean(v)


def test_docom_sampled_gradients_use_one_sample_at_both_points():
    """The STORM estimator: the per-node run equals the matrix form fed the same mini-batches."""
    eta, beta, rounds = 0.1 / L, 0.2, 30
    sgd = lambda i, gen: PROBLEM.oracle(i, gen, "sgd", 2)  # noqa: E731
    eng = Engine(make_algorithm("docom", eta=eta, gamma=0.5, beta=beta), TOPO, x0_fn(),
                 compressor="sign", oracles=sgd, seed=4)
    ours = [np.stack([eng.nodes[i].x.numpy().copy() for i in range(N)])]
    for _ in range(rounds):
        eng.step()
        ours.append(np.stack([eng.nodes[i].x.numpy().copy() for i in range(N)]))
    # the reference draws from oracles seeded like the engine's nodes
    mirror = [sgd(i, generator(node_seed(4, i), "cpu")) for i in range(N)]

    def init_grad(X):
        return np.stack([mirror[i].grad(torch.from_numpy(X[i])).numpy() for i in range(N)])

    def grad_pair(X, X_prev):
        G, G_old = [], []
        for i in range(N):
            idx = mirror[i].sample()
            G.append(mirror[i].grad_at(torch.from_numpy(X[i]), idx).numpy())
            G_old.append(mirror[i].grad_at(torch.from_numpy(X_prev[i]), idx).numpy())
        return np.stack(G), np.stack(G_old)

    assert_same(ours, reft.docom(X0(), W, init_grad, eta, 0.5, beta, rounds, row_compressor("sign"),
                                 grad_pair=grad_pair))


@pytest.mark.parametrize(("spec", "rounds"), [("none", 60), ("topk:0.25", 20)])
def test_motef_equals_matrix_form_and_lam_one_is_beer(spec, rounds):
    eta = 0.2 / L
    ours, eng = run_engine(make_algorithm("motef", eta=eta, gamma=0.4, lam=0.7), spec, rounds,
                           problem=PROBLEM)
    assert_same(ours, reft.motef(X0(), W, full_grad(PROBLEM), eta, 0.4, 0.7, rounds, row_compressor(spec)))
    v = np.stack([eng.nodes[i].state["v"].numpy() for i in range(N)])
    m = np.stack([eng.nodes[i].state["grad_prev"].numpy() for i in range(N)])
    np.testing.assert_allclose(v.mean(0), m.mean(0), atol=1e-12)  # mean(v) = mean(m)
    ours, _ = run_engine(make_algorithm("motef", eta=eta, gamma=0.4, lam=1.0), spec, rounds,
                         problem=PROBLEM)
    assert_same(ours, ref.beer(X0(), W, full_grad(PROBLEM), eta, 0.4, rounds, row_compressor(spec)))


@pytest.mark.parametrize(("name", "spec", "rounds"), [("docom", "lead:2", 450), ("motef", "lead:2", 450)])
def test_full_gradient_runs_reach_the_exact_optimum(name, spec, rounds):
    from tests.helpers.algorithm_setup import HETERO, distance

    x0 = HETERO.initial_point()
    eta = 0.2 / HETERO.smoothness().L
    eng = Engine(make_algorithm(name, eta=eta), topologies.build("ring", 8), lambda i: x0,
                 compressor=spec, oracles=lambda i, gen: HETERO.oracle(i, gen), seed=1)
    for _ in range(rounds):
        eng.step()
    assert distance(eng, HETERO) < 1e-9


def test_configuration_errors():
    with pytest.raises(ConfigError, match="--estimator sgd"):
        Engine(make_algorithm("docom"), TOPO, x0_fn(),
               oracles=lambda i, gen: PROBLEM.oracle(i, gen, "saga", 1))
    push = topologies.build("directed-random", N, weights="push")
    for name in ("docom", "motef"):
        with pytest.raises(ConfigError, match="doubly stochastic"):
            Engine(make_algorithm(name), push, x0_fn(), oracles=oracles(PROBLEM))
