"""Gradient tracking (DIGing, C-GT, EXTRA): per-node code equals the matrix form, invariants,
linear convergence to the exact optimum, and configuration errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.core.channel import arcs_over_schedule
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.problems import make_problem
from tests.helpers import reference_tracking as reft
from tests.helpers.algorithm_setup import (
    HETERO,
    PROBLEM,
    TOPO,
    X0,
    W,
    assert_same,
    distance,
    full_grad,
    oracles,
    row_compressor,
    run_engine,
    x0_fn,
)
from tests.helpers.resume import stopped_and_resumed

L = PROBLEM.smoothness().L


def stacked(eng, key):
    return np.stack([eng.nodes[i].state[key].numpy() for i in sorted(eng.nodes)])


@pytest.mark.parametrize(("spec", "gamma", "alpha", "ef", "rounds"), [
    ("none", 1.0, 1.0, False, 60),
    ("sign", 0.3, 0.5, False, 60),
    ("sign", 0.3, None, True, 60),
    ("topk:0.25", 0.2, 0.2, False, 20),
    ("topk:0.25", 0.2, None, True, 20),
    ("sign", 0.3, 0.0, False, 30),
])
def test_cgt_equals_matrix_form(spec, gamma, alpha, ef, rounds):
    """The error-feedback form is the stream whose copies move by the whole message (α = 1)."""
    eta = 0.2 / L
    alg = make_algorithm("c-gt", eta=eta, gamma=gamma, alpha=alpha, error_feedback=ef)
    ours, eng = run_engine(alg, spec, rounds, problem=PROBLEM)
    theirs = reft.cgt(X0(), W, full_grad(PROBLEM), eta, gamma, 1.0 if ef else alpha, rounds,
                      row_compressor(spec))
    assert_same(ours, theirs)
    # tracking invariant: mean(y) = mean(g) (W doubly stochastic)
    np.testing.assert_allclose(stacked(eng, "y").mean(0), stacked(eng, "g").mean(0), atol=1e-12)
    if ef or alpha > 0:  # the gaps are (W − I) times the copies, exactly
        for key in ("sx", "sy"):
            h = stacked(eng, f"{key}.h")
            gap = stacked(eng, f"{key}.gap")
            np.testing.assert_allclose(gap, W @ h - h, atol=1e-12)


def test_diging_is_cgt_uncompressed_and_runs_on_time_varying_graphs():
    eta = 0.2 / L
    ours, _ = run_engine(make_algorithm("diging", eta=eta), "none", 60, problem=PROBLEM)
    theirs = reft.cgt(X0(), W, full_grad(PROBLEM), eta, 1.0, 1.0, 60, row_compressor("none"))
    assert_same(ours, theirs)
    # one-peer exponential: x ← W(t) x − ηy, y ← W(t) y + Δg with a different W every round
    topo = topologies.build("one-peer-exponential", 8)
    eng = Engine(make_algorithm("diging", eta=eta), topo, x0_fn(), oracles=oracles(PROBLEM))
    X, grad = X0(), full_grad(PROBLEM)
    G = grad(X)
    Y = G.copy()
    for t in range(1, 25):
        Wt = topo.at_round(t).dense()
        X, Y_old = Wt @ X - eta * Y, Y
        Gn = grad(X)
        Y = Wt @ Y_old + Gn - G
        G = Gn
        eng.step()
    np.testing.assert_allclose(np.stack([eng.nodes[i].x.numpy() for i in range(8)]), X, atol=1e-10)


def test_extra_equals_matrix_form():
    eta = 0.5 / L
    ours, _ = run_engine(make_algorithm("extra", eta=eta), "none", 60, problem=PROBLEM)
    assert_same(ours, reft.extra(X0(), W, full_grad(PROBLEM), eta, 60))


@pytest.mark.parametrize(("name", "spec", "hp", "rounds"), [
    pytest.param("c-gt", "topk:0.1", {"error_feedback": True}, 1000, marks=pytest.mark.slow),
    ("extra", "none", {}, 500),
])
def test_linear_convergence_to_the_exact_optimum(name, spec, hp, rounds):
    """Heterogeneous least squares on a ring: the exact optimum, not DGD's biased point (C-GT with
    2-bit quantization and DIGing: through optimize.py in tests/scripts/test_tracking_cli.py)."""
    topo = topologies.build("ring", 8)
    eta = REGISTRY[name].suggest_hparams(HETERO)["eta"]
    x0 = HETERO.initial_point()
    eng = Engine(make_algorithm(name, eta=eta, **hp), topo, lambda i: x0, compressor=spec,
                 oracles=lambda i, gen: HETERO.oracle(i, gen), seed=1)
    for _ in range(rounds):
        eng.step()
    assert distance(eng, HETERO) < 1e-9


def test_configuration_errors_name_the_fix():
    directed = topologies.build("directed-random:p=0.2", 8, weights="push", seed=1)
    with pytest.raises(ConfigError, match="cpp"):
        Engine(make_algorithm("c-gt"), directed, x0_fn(), oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="--compressor none"):
        Engine(make_algorithm("diging"), TOPO, x0_fn(), compressor="topk:0.1", oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="--compressor none"):
        Engine(make_algorithm("extra"), TOPO, x0_fn(), compressor="lead:2", oracles=oracles(PROBLEM))
    one_peer = topologies.build("one-peer-exponential", 8)
    with pytest.raises(ConfigError, match="per-arc copies"):
        Engine(make_algorithm("cpp"), one_peer, x0_fn(), compressor="lead:2", oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="drop one of the two"):
        make_algorithm("c-gt", error_feedback=True, alpha=0.5)
    with pytest.raises(ConfigError, match="symmetric"):
        Engine(make_algorithm("extra"), topologies.build("directed-exponential", 8), x0_fn(),
               oracles=oracles(PROBLEM))
    with pytest.raises(ConfigError, match="alpha"):
        make_algorithm("c-gt", alpha=1.5)


@pytest.mark.slow
def test_cgt_on_a_time_varying_graph_keeps_one_copy_per_arc():
    """One-peer exponential: uncompressed it is DIGing with W(t); compressed, Σ y = Σ g exactly and
    it still reaches the exact optimum (one compressed message per round)."""
    one_peer = topologies.build("one-peer-exponential", 8)
    eta = 0.2 / L

    def run(name, spec, rounds, problem=PROBLEM, x0=None, **hp):
        eng = Engine(make_algorithm(name, eta=eta, **hp), one_peer, x0 or x0_fn(), compressor=spec,
                     oracles=oracles(problem), seed=2)
        for _ in range(rounds):
            eng.step()
        return eng

    a, b = run("c-gt", "none", 40), run("diging", "none", 40)
    for i in range(8):
        np.testing.assert_allclose(a.nodes[i].x.numpy(), b.nodes[i].x.numpy(), atol=1e-12)
    eng = run("c-gt", "topk:0.25", 30)
    np.testing.assert_allclose(stacked(eng, "y").sum(0), stacked(eng, "g").sum(0), atol=1e-11)
    assert len(eng.nodes[0].state["sx.out"]) == 3  # log2(8) arcs out of node 0 over a period
    x0 = HETERO.initial_point()
    eng = run("c-gt", "lead:2", 600, problem=HETERO, x0=lambda i: x0)
    assert distance(eng, HETERO) < 1e-10


@pytest.mark.parametrize(("name", "spec", "topo_spec", "weights"), [
    ("c-gt", "lead:2", "ring", "metropolis"),
    ("c-gt", "topk:0.25", "one-peer-exponential", "metropolis"),
    ("c-gt", "lead:2", "matchings", "metropolis"),
    ("push-sum", "lead:2", "directed-random", "push"),
    ("push-sum", "lead:2", "one-peer-exponential", "push"),
    ("cpp", "lead:2", "directed-random", "push"),
    ("c-ecl", "randk:0.3", "ring", "metropolis"),
    ("docom", "sign", "ring", "metropolis"),
])
def test_checkpoint_resume_continues_the_same_run(name, spec, topo_spec, weights):
    """State saved (weights_only) after 7 rounds and loaded into a fresh engine gives the same
    iterates as an uninterrupted run: copies, per-arc and per-edge states are all saved."""

    topo = topologies.build(topo_spec, 8, weights=weights, seed=1)

    def engine():
        return Engine(make_algorithm(name, eta=0.1 / L), topo, x0_fn(), compressor=spec,
                      oracles=oracles(PROBLEM), seed=3)

    straight, resumed = stopped_and_resumed(engine, rounds=14, stop=7)
    for i in range(8):
        np.testing.assert_array_equal(resumed.nodes[i].x.numpy(), straight.nodes[i].x.numpy())


def test_one_algorithm_object_runs_two_engines():
    """Stream helpers live outside node.state, per node: an algorithm shared by two engines
    (stepped in turn) gives each the run it gives alone."""
    eta = 0.2 / L
    shared = make_algorithm("c-gt", eta=eta)
    a = Engine(shared, TOPO, x0_fn(), compressor="topk:0.25", oracles=oracles(PROBLEM), seed=1)
    b = Engine(shared, TOPO, x0_fn(), compressor="topk:0.25", oracles=oracles(PROBLEM), seed=1)
    alone = Engine(make_algorithm("c-gt", eta=eta), TOPO, x0_fn(), compressor="topk:0.25",
                   oracles=oracles(PROBLEM), seed=1)
    for _ in range(10):
        a.step()
        b.step()
        alone.step()
    for i in alone.nodes:
        assert torch.equal(a.nodes[i].x, alone.nodes[i].x) and torch.equal(b.nodes[i].x, alone.nodes[i].x)


@pytest.mark.parametrize(("alg", "spec", "topo_spec", "weights"), [
    ("c-gt", "topk:0.25", "one-peer-exponential", "metropolis"),
    ("push-sum", "sign", "one-peer-exponential", "metropolis"),
    ("c-gt", "sign", "matchings", "metropolis"),
])
def test_per_arc_copies_run_as_blocks(alg, spec, topo_spec, weights):
    """Per-arc copies send one message per current arc (a per-arc block phase); each node's
    copies are the [k, d] rows of the schedule's arcs, and Σ_i D_i = 0 keeps Σ y = Σ g (C-GT)
    and Σ s (push-sum, consensus) whatever the compressor."""
    n = 4
    topo = topologies.build(topo_spec, n, weights=weights, seed=3)
    problem = make_problem("least-squares", n_nodes=n, dim=6, samples_per_node=5, seed=4,
                           dtype=torch.float64)
    eng = Engine(make_algorithm(alg), topo, lambda i: problem.initial_point() + i, compressor=spec,
                 oracles=(lambda i, gen: problem.oracle(i, gen, "full", 2)) if alg == "c-gt" else None)
    assert eng.block is not None
    name = "sx" if alg == "c-gt" else "ss"
    s0 = stacked(eng, "s").sum(0) if alg == "push-sum" else None
    eng.run(9)
    for i, nd in eng.nodes.items():
        outs, ins = arcs_over_schedule(topo, i)
        assert nd.state[name + ".out"].shape == (len(outs), 6)
        assert nd.state[name + ".in"].shape == (len(ins), 6)
    if alg == "c-gt":
        np.testing.assert_allclose(stacked(eng, "y").sum(0), stacked(eng, "g").sum(0), atol=1e-11)
    else:
        np.testing.assert_allclose(stacked(eng, "s").sum(0), s0, atol=1e-11)
    for i, nd in eng.nodes.items():  # every in-copy c_ji equals the sender's out-copy o_ji
        outs, ins = arcs_over_schedule(topo, i)
        for j, c in zip(ins, nd.state[name + ".in"]):
            k = arcs_over_schedule(topo, j)[0].index(i)
            assert torch.equal(c, eng.nodes[j].state[name + ".out"][k])


