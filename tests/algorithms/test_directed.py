"""Directed graphs: push-sum (exact and quantized) and CPP equal their matrix forms; push-sum
weights and mass are conserved; quantized push-sum reaches the exact average; CPP converges
linearly with a quantizer; configuration errors."""

from __future__ import annotations

import numpy as np
import pytest

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.helpers import reference_tracking as reft
from tests.helpers.algorithm_setup import PROBLEM, X0, assert_same, full_grad, oracles, row_compressor, x0_fn

N = 8
DIRECTED = topologies.build("directed-random:p=0.2", N, weights="push", seed=1)
C = DIRECTED.dense()
L = PROBLEM.smoothness().L


def run(alg, spec, rounds, topo=DIRECTED, problem=None):
    eng = Engine(alg, topo, x0_fn(), compressor=spec, oracles=oracles(problem) if problem else None)
    out = [np.stack([eng.nodes[i].x.numpy().copy() for i in range(N)])]
    for _ in range(rounds):
        eng.step()
        out.append(np.stack([eng.nodes[i].x.numpy().copy() for i in range(N)]))
    return out, eng


def test_topology_is_column_stochastic_and_irregular():
    np.testing.assert_allclose(C.sum(0), 1.0, atol=1e-15)
    assert np.abs(C.sum(1) - 1.0).max() > 0.1  # not doubly stochastic: the weights matter
    assert DIRECTED.stochastic == "column"


@pytest.mark.parametrize(("spec", "gamma", "rounds"), [("none", 1.0, 60), ("sign", 0.5, 60),
                                                       ("topk:0.25", 0.5, 20)])
def test_push_sum_consensus_equals_matrix_form(spec, gamma, rounds):
    ours, eng = run(make_algorithm("push-sum", gamma=gamma), spec, rounds)
    theirs = reft.push_sum(X0(), C, rounds, row_compressor(spec), gamma, exact=spec == "none")
    assert_same(ours, theirs)
    w = np.array([float(eng.nodes[i].state["w"]) for i in range(N)])
    s = np.stack([eng.nodes[i].state["s"].numpy() for i in range(N)])
    assert abs(w.sum() - N) < 1e-12  # the weights' sum is conserved
    np.testing.assert_allclose(s.sum(0), X0().sum(0), atol=1e-12)  # so is the mass


def test_push_sum_with_gradients_equals_matrix_form():
    eta = 0.5 / L
    ours, _ = run(make_algorithm("push-sum", eta=eta, gamma=0.5), "sign", 40, problem=PROBLEM)
    theirs = reft.push_sum(X0(), C, 40, row_compressor("sign"), 0.5, full_grad(PROBLEM), eta)
    assert_same(ours, theirs)


def test_exact_push_sum_on_time_varying_directed_graph():
    topo = topologies.build("one-peer-exponential", N)
    ours, _ = run(make_algorithm("push-sum"), "none", 12, topo=topo)
    theirs = reft.push_sum(X0(), lambda t: topo.at_round(t).dense(), 12, row_compressor("none"),
                           exact=True)
    assert_same(ours, theirs)
    np.testing.assert_allclose(ours[-1], np.tile(X0().mean(0), (N, 1)), atol=1e-12)  # n = 2^k


@pytest.mark.parametrize("topo", [DIRECTED, topologies.build("one-peer-exponential", N)],
                         ids=["directed-random", "one-peer-exponential"])
def test_quantized_push_sum_reaches_the_exact_average(topo):
    """Static graph: one public copy per node; time-varying: one copy per arc. Both conserve the
    mass exactly and reach the average of the initial values."""
    _, eng = run(make_algorithm("push-sum", gamma=1.0), "lead:2", 300, topo=topo)
    x = np.stack([eng.nodes[i].x.numpy() for i in range(N)])
    s = np.stack([eng.nodes[i].state["s"].numpy() for i in range(N)])
    np.testing.assert_allclose(s.sum(0), X0().sum(0), atol=1e-12)
    assert np.abs(x - X0().mean(0)).max() < 1e-12


@pytest.mark.parametrize(("spec", "gamma", "rounds"), [("none", 1.0, 60), ("sign", 0.3, 60),
                                                       ("topk:0.25", 0.2, 20)])
def test_cpp_equals_matrix_form(spec, gamma, rounds):
    eta = 0.1 / L
    ours, eng = run(make_algorithm("cpp", eta=eta, gamma=gamma, alpha=gamma), spec, rounds,
                    problem=PROBLEM)
    theirs = reft.cgt(X0(), C, full_grad(PROBLEM), eta, gamma, gamma, rounds, row_compressor(spec),
                      R=reft.pull_matrix(C), C=C)
    assert_same(ours, theirs)
    y = np.stack([eng.nodes[i].state["y"].numpy() for i in range(N)])
    g = np.stack([eng.nodes[i].state["g"].numpy() for i in range(N)])
    np.testing.assert_allclose(y.sum(0), g.sum(0), atol=1e-11)  # Σ y = Σ ∇f(x)


def test_configuration_errors():
    with pytest.raises(ConfigError, match="--weights push"):
        Engine(make_algorithm("push-sum"), topologies.build("directed-random", N, weights="pull"),
               x0_fn())
    with pytest.raises(ConfigError, match="--weights push"):
        Engine(make_algorithm("cpp"), topologies.build("directed-random", N, weights="pull"), x0_fn(),
               oracles=oracles(PROBLEM))


def test_quantized_push_sum_optimizes_like_exact_push_sum():
    """Gradient steps at the de-biased point: 2-bit messages end where exact ones do (a constant
    step stops at a neighborhood of x*; a decaying one keeps approaching it)."""
    from tests.helpers.algorithm_setup import HETERO

    x0, x_star = HETERO.initial_point(), HETERO.solution()

    def final_distance(spec, eta):
        eng = Engine(make_algorithm("push-sum", eta=eta), DIRECTED, lambda i: x0, compressor=spec,
                     oracles=lambda i, gen: HETERO.oracle(i, gen), seed=1)
        for _ in range(300):
            eng.step()
        return float(((eng.mean_model() - x_star) ** 2).sum() / (x_star**2).sum())

    eta = 0.5 / HETERO.smoothness().L
    exact, quantized = final_distance("none", eta), final_distance("lead:2", eta)
    assert abs(quantized - exact) < 1e-3 * exact
    decaying = final_distance("lead:2", lambda t: 2 * eta / t ** 0.5)  # t = 1, 2, …
    assert decaying < exact
