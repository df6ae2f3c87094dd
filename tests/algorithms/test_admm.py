"""Decentralized ADMM and DLM: the per-node code equals the papers' matrix recursions, linear
convergence to the exact optimum with constant parameters, Σ α = 0, resume, lost messages and
configuration errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.problems import make_problem
from tests.helpers import reference_admm as refa
from tests.helpers.algorithm_setup import (
    HETERO,
    LASSO,
    PROBLEM,
    TOPO,
    X0,
    W,
    assert_same,
    distance,
    full_grad,
    oracles,
    run_engine,
    x0_fn,
)
from tests.helpers.resume import stopped_and_resumed

S = PROBLEM.smoothness()


def stacked(eng, key):
    return np.stack([eng.nodes[i].state[key].numpy() for i in sorted(eng.nodes)])


def test_admm_equals_matrix_form():
    c = 0.7
    ours, eng = run_engine(make_algorithm("admm", c=c), "none", 40, problem=PROBLEM)
    quads = [PROBLEM.local_quadratic(i) for i in range(PROBLEM.n_nodes)]
    assert_same(ours, refa.admm(X0(), W, quads, c, 40))
    # Σ_i α_i = 0: each edge adds opposite terms at its two ends
    np.testing.assert_allclose(stacked(eng, "alpha").sum(0), 0.0, atol=1e-12)


@pytest.mark.parametrize(("c", "rho"), [(0.5, S.L), (1.3, 0.5 * S.L)])
def test_dlm_equals_matrix_form(c, rho):
    ours, _ = run_engine(make_algorithm("dlm", c=c, rho=rho), "none", 40, problem=PROBLEM)
    assert_same(ours, refa.dlm(X0(), W, full_grad(PROBLEM), c, rho, 40))


def test_local_prox_solves_the_subproblem():
    """prox of a quadratic f_i: ∇f_i(x) + (x − v)/η = 0; a logistic problem refuses it."""
    v = torch.randn(PROBLEM.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x = PROBLEM.local_prox(3, v, 0.3)
    np.testing.assert_allclose((PROBLEM.grad_full(3, x) + (x - v) / 0.3).numpy(), 0, atol=1e-12)
    logistic = make_problem("logistic", n_nodes=4, dim=5, samples_per_node=10)
    with pytest.raises(ConfigError, match="dlm"):
        logistic.local_prox(0, torch.zeros(5), 0.3)


@pytest.mark.parametrize(("name", "rounds"), [("admm", 160), ("dlm", 400)])
def test_linear_convergence_to_the_exact_optimum(name, rounds):
    """Heterogeneous least squares on a ring, the suggested constant parameters: the exact
    optimum, at a linear rate (the error falls by a steady factor every quarter of the run)."""
    topo = topologies.build("ring", 8)
    hp = REGISTRY[name].suggest_hparams(HETERO)
    x0 = HETERO.initial_point()
    eng = Engine(make_algorithm(name, **hp), topo, lambda i: x0,
                 oracles=lambda i, gen: HETERO.oracle(i, gen), seed=1)
    errors = []
    for t in range(1, rounds + 1):
        eng.step()
        if t % (rounds // 4) == 0:
            errors.append(distance(eng, HETERO))
    assert errors[-1] < 1e-16
    ratios = [b / a for a, b in zip(errors, errors[1:])]
    assert all(r < 1e-2 for r in ratios), errors


@pytest.mark.parametrize(("name", "hp"), [("admm", {"c": 0.7}), ("dlm", {"c": 0.7, "rho": S.L})])
def test_checkpoint_resume_continues_the_same_run(name, hp):
    def engine():
        return Engine(make_algorithm(name, **hp), TOPO, x0_fn(), oracles=oracles(PROBLEM), seed=3)

    straight, resumed = stopped_and_resumed(engine, rounds=14, stop=7)
    for i in range(8):
        np.testing.assert_array_equal(resumed.nodes[i].x.numpy(), straight.nodes[i].x.numpy())


@pytest.mark.parametrize("name", ["admm", "dlm"])
def test_lost_messages_skip_the_edge_and_keep_the_optimum(name):
    """10 % loss: an edge either of whose messages is lost sits the round out at both ends, so
    Σ α = 0 stays and the run still reaches the exact optimum."""
    topo = topologies.build("ring", 8)
    hp = REGISTRY[name].suggest_hparams(HETERO)
    x0 = HETERO.initial_point()
    eng = Engine(make_algorithm(name, **hp), topo, lambda i: x0, network="loss=0.1",
                 oracles=lambda i, gen: HETERO.oracle(i, gen), seed=1)
    records = eng.run(400, log_every=400)
    assert records[-1]["messages_lost"] > 0
    np.testing.assert_allclose(stacked(eng, "alpha").sum(0), 0.0, atol=1e-11)
    assert distance(eng, HETERO) < 1e-16


def test_configuration_errors_name_the_fix():
    logistic = make_problem("logistic", n_nodes=8, dim=5, samples_per_node=10,
                            dtype=torch.float64)
    with pytest.raises(ConfigError, match="dlm"):
        Engine(make_algorithm("admm"), TOPO, lambda i: torch.zeros(5, dtype=torch.float64),
               oracles=oracles(logistic))
    with pytest.raises(ConfigError, match="prox-lead"):
        Engine(make_algorithm("admm"), TOPO, x0_fn(), oracles=oracles(LASSO))
    with pytest.raises(ConfigError, match="prox-lead"):
        Engine(make_algorithm("dlm"), TOPO, x0_fn(), oracles=oracles(LASSO))
    with pytest.raises(ConfigError, match="--compressor none"):
        Engine(make_algorithm("dlm"), TOPO, x0_fn(), compressor="lead:2", oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="estimator"):
        Engine(make_algorithm("admm"), TOPO, x0_fn(),
               oracles=lambda i, gen: PROBLEM.oracle(i, gen, "sgd", 2))
    with pytest.raises(ConfigError, match="symmetric"):
        Engine(make_algorithm("dlm"), topologies.build("directed-exponential", 8), x0_fn(),
               oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="c"):
        make_algorithm("admm", c=0.0)
    with pytest.raises(ConfigError, match="rho"):
        make_algorithm("dlm", rho=-1.0)
