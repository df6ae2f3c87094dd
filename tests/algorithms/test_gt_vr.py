"""GT-SAGA and GT-SARAH (gossip/algorithms/gt_vr.py): the papers' recursions with the same
samples, exact linear convergence of GT-SAGA, GT-SARAH's vanishing gradient, resume (the SAGA
table is state), lost messages, the sample counts and the refusals. MPI = in-process: the
``gt-saga`` and ``gt-sarah`` scenarios of tests/helpers/mpi_tracking_scenarios.py."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.algorithms.gt_vr import draw_samples
from gossip.checkpoint import Checkpointer
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.problems import make_problem
from gossip.rng import Stream
from tests.helpers import reference_tracking as reft
from tests.helpers.algorithm_setup import HETERO, PROBLEM, TOPO, X0, W, assert_same, distance, run_engine

SEED = 5
PLAIN = make_problem("least-squares", n_nodes=8, dim=12, samples_per_node=30, seed=3, l2=0.0,
                     dtype=torch.float64)
"""Without the L2 term: for a GLM the SAGA table keeps the data part of each sample's gradient
and adds ``l2·x`` at the current point (our choice, the oracle's), which with ``l2 = 0`` is the
paper's table of whole gradients."""


def test_gt_saga_equals_its_recursion_with_the_same_samples():
    eta = 0.5 / PLAIN.smoothness().L_max
    for batch in (1, 3):
        ours, _ = run_engine(make_algorithm("gt-saga", eta=eta, batch_size=batch), "none", 25,
                             problem=PLAIN, seed=SEED)
        assert_same(ours, reft.gt_saga(W, X0(), PLAIN, eta, 25, batch, SEED))


def test_gt_sarah_equals_its_recursion_with_the_same_samples():
    eta = 0.5 / PROBLEM.smoothness().L_max
    ours, eng = run_engine(make_algorithm("gt-sarah", eta=eta, batch_size=4, period=5), "none",
                           25, problem=PROBLEM, seed=SEED)
    assert_same(ours, reft.gt_sarah(W, X0(), PROBLEM, eta, 25, 4, 5, SEED))
    # 5 full local gradients (rounds 1, 6, ..., 21) of 30 samples, 20 recursive ones of 2·4
    assert eng.block.state["gt-vr.sample_grads"].tolist() == [5 * 30 + 20 * 8] * 8


def test_samples_are_distinct_uniform_and_depend_on_the_key_only():
    rng = Stream(1, list(range(4)), "gt-vr.samples")
    picks = draw_samples(rng, [10, 10, 5, 7], 5)
    assert [len(set(p.tolist())) for p in picks] == [5, 5, 5, 5]
    assert sorted(picks[2].tolist()) == [0, 1, 2, 3, 4]  # B = m: every sample
    alone = Stream(1, [3], "gt-vr.samples")  # node 3 alone, as in its own MPI rank
    assert torch.equal(draw_samples(alone, [7], 5)[0], picks[3])
    counts = torch.zeros(6)
    rng = Stream(2, [0], "gt-vr.samples")
    for t in range(3000):
        rng.begin_round(t)
        counts[draw_samples(rng, [6], 1)[0]] += 1
    assert (counts - 500).abs().max() < 90  # uniform: 500 ± 4 sd


def vr_engine(name: str, problem, rounds: int = 0, network=None, topology=None, **hp) -> Engine:
    eta = hp.pop("eta", None) or make_algorithm(name).suggest_hparams(problem)["eta"]
    x0 = problem.initial_point()
    eng = Engine(make_algorithm(name, eta=eta, **hp), topology or topologies.build("ring", 8),
                 lambda i: x0, oracles=lambda i, gen: problem.oracle(i, gen), seed=SEED,
                 network=network)
    for _ in range(rounds):
        eng.step()
    return eng


def test_gt_saga_converges_linearly_to_the_exact_optimum_with_a_constant_step():
    """Heterogeneous least squares (d = 40, 30 samples per node), an 8-ring, η = 1/L_max:
    the error falls by a steady factor (about 50 measured) every 250 rounds, with no noise
    floor, one sample per node and round."""
    eng = vr_engine("gt-saga", HETERO)
    errors = []
    for _ in range(8):
        for _ in range(250):
            eng.step()
        errors.append(distance(eng, HETERO))
    assert errors[-1] < 1e-13, errors
    rates = [b / a for a, b in zip(errors, errors[1:])]
    assert max(rates) < 0.05, errors  # linear, no floor
    assert eng.block.state["gt-vr.sample_grads"].tolist() == [30 + 1999] * 8


def test_gt_sarah_drives_the_gradient_norm_to_zero():
    """Logistic regression (not a quadratic): the gradient of f at the nodes' average falls
    by over four orders of magnitude (about 10x every 150 rounds measured) with a constant step."""
    problem = make_problem("logistic", n_nodes=8, dim=10, samples_per_node=40, seed=2,
                           heterogeneity=1.0, dtype=torch.float64)

    def grad_norm(eng):
        xbar = eng.block.x.mean(0)
        return float(sum(problem.grad_full(i, xbar) for i in range(8)).norm() / 8)

    eng = vr_engine("gt-sarah", problem)
    start = grad_norm(eng)
    norms = []
    for _ in range(4):
        for _ in range(150):
            eng.step()
        norms.append(grad_norm(eng))
    assert all(b < a for a, b in zip(norms, norms[1:])), norms
    assert norms[-1] < 1e-4 * start, (start, norms)


@pytest.mark.parametrize("name", ["gt-saga", "gt-sarah"])
def test_resume_equals_uninterrupted(tmp_path, name):
    """The SAGA table (and GT-SARAH's previous model) are state: a run resumed from a
    checkpoint continues bit for bit, samples included (keyed by round, no generator)."""
    hp = {"batch_size": 2} if name == "gt-saga" else {"batch_size": 3, "period": 4}
    full = vr_engine(name, PROBLEM, 14, **hp)
    first = vr_engine(name, PROBLEM, 7, **hp)
    ck = Checkpointer(tmp_path, identity={"run": name}, every=7)
    ck.save(first)
    resumed = vr_engine(name, PROBLEM, **hp)
    assert ck.restore(resumed) == 7
    for _ in range(7):
        resumed.step()
    assert torch.equal(full.block.x, resumed.block.x)
    for key, value in full.block.state.items():
        for a, b in zip(value if isinstance(value, list) else [value],
                        resumed.block.state[key] if isinstance(value, list) else [resumed.block.state[key]],
                        strict=True):
            assert torch.equal(a, b), key


@pytest.mark.parametrize("name", ["gt-saga", "gt-sarah"])
def test_a_lost_message_drops_its_edge_and_the_optimum_stays_exact(name):
    """Under 10 % loss the edge sits the round out at both ends (on_loss 'edge'): every W_t is
    doubly stochastic, Σ_i y_i = Σ_i v_i holds, and the run still reaches x* to rounding."""
    eng = vr_engine(name, PROBLEM, 800, network="loss=0.1")
    st = eng.block.state
    assert torch.allclose(st["y"].sum(0), st["g"].sum(0), atol=1e-12, rtol=0)
    assert distance(eng, PROBLEM) < 1e-12
    lossless = vr_engine(name, PROBLEM, 20)
    lossy = vr_engine(name, PROBLEM, 20, network="loss=0.1")
    assert not torch.equal(lossless.block.x, lossy.block.x)  # messages were lost


def test_refuses_what_it_cannot_run():
    with pytest.raises(ConfigError, match="batch_size"):
        make_algorithm("gt-saga", batch_size=0)
    with pytest.raises(ConfigError, match="batch_size = 31 exceeds"):
        Engine(make_algorithm("gt-saga", batch_size=31), TOPO, lambda i: torch.zeros(12),
               oracles=lambda i, gen: PROBLEM.oracle(i, gen))

    class NoFiniteSum:  # a model's training oracle: gradients, but no per-sample losses
        def grad(self, x, out):
            return out.copy_(x)

    with pytest.raises(ConfigError, match="finite-sum"):
        Engine(make_algorithm("gt-sarah"), TOPO, lambda i: torch.zeros(12),
               oracles=lambda i, gen: NoFiniteSum())


def test_the_saga_table_starts_in_the_buffers_it_was_given_with_the_exact_gradient():
    """``SAGA.start``: GT-SAGA's start ``z_{i,l} = x⁰``, filled into the state's own tensors
    (what checkpoints restore in place), returning ``∇f_i(x⁰)`` without a draw."""
    from gossip.problems.oracles import SAGA

    logistic = make_problem("logistic", n_nodes=8, dim=12, samples_per_node=30, seed=1,
                            dtype=torch.float64)
    x = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for problem in (PROBLEM, logistic):
        e = SAGA(problem, 2, None, 1)
        table, mean = torch.zeros(e.table_shape(), dtype=torch.float64), torch.zeros(12, dtype=torch.float64)
        e.table, e.mean = table, mean
        g = e.start(x)
        assert torch.allclose(g, problem.grad_full(2, x), atol=1e-13, rtol=0)
        assert e.table is table and e.mean is mean and bool(table.abs().sum() > 0)
        assert e.sample_grads == 30
