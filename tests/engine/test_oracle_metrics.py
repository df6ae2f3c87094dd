"""The records' gradient norm at the average and oracle call counters (issue 41): ‖∇f(x̄)‖
against a direct float64 computation, its minimum so far, the counters against the calls the
methods make (K local steps: K gradients a round), and the weighted cost."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.metrics import JsonlLogger, gradient_metric, weighted_cost
from gossip.problems import make_problem
from gossip.runner import execute

N, D, M = 6, 10, 15
RING = topologies.build("ring", N)


def problem(kind: str = "least-squares", n: int = N):
    return make_problem(kind, n_nodes=n, dim=D, samples_per_node=M, seed=5, heterogeneity=2.0,
                        dtype=torch.float64)


def engine(name: str, pb, topo=RING, estimator: str = "full", federated: bool = False, **hp):
    return Engine(make_algorithm(name, **hp), topo, lambda i: torch.zeros(D, dtype=torch.float64),
                  seed=3, oracles=lambda i, gen: (None if federated and i == 0 else pb.oracle(
                      i - federated, gen, estimator, 2)))


def records(eng: Engine, rounds: int, log_every: int = 1, **kw) -> list[dict]:
    result = execute(eng, label="t", config={}, logger=JsonlLogger(None), rounds=rounds,
                     log_every=log_every, metrics=[gradient_metric], **kw)
    assert result.status == "ok"
    return result.records


def test_gradient_norm_is_that_of_the_mean_objective_at_the_average_in_float64():
    """Least squares (∇f_i(x) = H_i x − c_i from the float64 quadratic) and logistic
    regression (its loss differentiated by torch autograd in float64): the record's
    grad_norm is ‖(1/n) Σ_i ∇f_i(x̄)‖ at the average of the nodes' models."""
    pb = problem()
    eng = engine("dpsgd", pb, eta=0.5 / pb.smoothness().L)
    rec = records(eng, 6, log_every=3)[-1]
    X = np.stack([eng.nodes[i].x.numpy() for i in range(N)])
    xbar = X.mean(axis=0)
    grads = []
    for i in range(N):
        H, c = pb.local_quadratic(i)
        grads.append(H @ xbar - c)
    want = float(np.linalg.norm(np.mean(grads, axis=0)))
    assert rec["grad_norm"] == pytest.approx(want, rel=1e-12)

    lg = problem("logistic")
    eng = engine("dpsgd", lg, eta=0.5 / lg.smoothness().L)
    rec = records(eng, 4, log_every=4)[-1]
    xbar = torch.stack([eng.nodes[i].x for i in range(N)]).mean(0).requires_grad_(True)
    total = math.fsum(lg.local_loss(i, xbar.detach()) for i in range(N))
    with torch.enable_grad():
        f = sum(_logistic(lg, i, xbar) for i in range(N)) / N
        (g,) = torch.autograd.grad(f, xbar)
    assert total / N == pytest.approx(float(f.detach()), rel=1e-12)  # the same loss, differentiated
    assert rec["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-10)


def _logistic(pb, i, x):
    """Node i's logistic loss written out: mean log(1 + exp(−b aᵀx)) + (l2/2)‖x‖²."""
    z = pb.b[i] * (pb.A[i] @ x)
    return torch.nn.functional.softplus(-z).mean() + 0.5 * pb.l2 * (x @ x)


def test_gradient_norm_minimum_is_the_running_minimum_over_the_records():
    """DIGing, whose ‖∇f(x̄)‖ goes up and down while the trackers settle: the minimum so far
    is the least grad_norm of the records up to each one, below the current value somewhere."""
    pb = problem()
    recs = records(engine("diging", pb, eta=0.5 / pb.smoothness().L), 30)
    norms = [r["grad_norm"] for r in recs]
    assert [r["grad_norm_min"] for r in recs] == [min(norms[: k + 1]) for k in range(len(recs))]
    assert any(r["grad_norm_min"] < r["grad_norm"] for r in recs)


def test_counters_count_the_calls_each_method_makes():
    pb = problem()
    L = pb.smoothness().L
    # DGD: one full local gradient a round, m per-sample gradients each, no values, no prox
    recs = records(engine("dpsgd", pb, eta=0.5 / L), 5)
    for r in recs:
        assert (r["grads_per_node"], r["sample_grads_per_node"]) == (r["round"], M * r["round"])
        assert r["values_per_node"] == r["prox_per_node"] == 0
    # sampled gradients (batches of 2): 2 per-sample gradients per estimate
    recs = records(engine("dpsgd", pb, estimator="sgd", eta=0.1 / L), 4)
    assert [r["sample_grads_per_node"] for r in recs] == [2 * r["round"] for r in recs]
    # decentralized ADMM: one exact local proximal solve a round, no gradient
    recs = records(engine("admm", pb, c=0.7), 4)
    assert [(r["prox_per_node"], r["grads_per_node"]) for r in recs] == [(t, 0) for t in range(5)]
    # Prox-LEAD on lasso: the prox of r once a round, a gradient a round (and one at setup)
    lasso = problem("lasso")
    recs = records(engine("prox-lead", lasso, eta=0.5 / lasso.smoothness().L), 4)
    assert [r["prox_per_node"] - recs[0]["prox_per_node"] for r in recs] == list(range(5))
    assert [r["grads_per_node"] - recs[0]["grads_per_node"] for r in recs] == list(range(5))


def test_k_local_steps_count_k_gradients_a_round_and_power_of_choice_counts_values():
    """FedAvg with every client and K = 3 local steps: 3 gradients per client a round (the
    server holds no oracle and is not averaged in); power-of-choice ranks d candidates by their
    loss: one value per candidate a round, over the 5 clients d/5 per client."""
    pb = problem(n=5)
    star = topologies.build("star", 6)
    eta = 0.2 / pb.smoothness().L
    recs = records(engine("fedavg", pb, star, federated=True, clients_per_round=5, local_steps=3,
                          eta=eta), 4)
    assert [r["grads_per_node"] for r in recs] == [3 * r["round"] for r in recs]
    assert [r["sample_grads_per_node"] for r in recs] == [3 * M * r["round"] for r in recs]
    recs = records(engine("fedavg", pb, star, federated=True, clients_per_round=2, local_steps=3,
                          selection="power", candidates=4, eta=eta), 5)
    assert [r["values_per_node"] for r in recs] == [4 * r["round"] / 5 for r in recs]
    assert [r["grads_per_node"] for r in recs] == [2 * 3 * r["round"] / 5 for r in recs]


def test_variance_reduced_tracking_counts_its_samples_on_the_oracles():
    """GT-SAGA and GT-SARAH evaluate the problem themselves: they report to the node's oracle,
    whose per-node mean times n is the methods' own sum, sample_grads."""
    pb = problem()
    for name, hp in (("gt-saga", {"batch_size": 2}), ("gt-sarah", {"batch_size": 3, "period": 4})):
        recs = records(engine(name, pb, eta=0.5 / pb.smoothness().L_max, **hp), 9)
        for r in recs:
            assert r["sample_grads_per_node"] * N == pytest.approx(r["sample_grads"], rel=1e-15)
            assert r["grads_per_node"] == r["round"], name
        assert recs[-1]["sample_grads_per_node"] > recs[1]["sample_grads_per_node"]


def test_oracle_counters_are_saved_and_restored():
    pb = problem()
    a = pb.oracle(2, torch.Generator().manual_seed(1), "lsvrg", 2)
    x = torch.ones(D, dtype=torch.float64)
    for _ in range(3):
        a.grad(x)
    a.loss(x)
    a.count(prox=2)
    want = {"grads": 3, "sample_grads": a.sample_grads, "values": 1, "prox": 2}
    assert a.counters() == want and a.sample_grads >= 3 * 4  # 2 points x batch 2, + refreshes
    b = pb.oracle(2, torch.Generator().manual_seed(1), "lsvrg", 2)
    b.load_state_dict(a.state_dict())
    assert b.counters() == want


def test_weighted_cost_prices_the_records_fields():
    rec = {"bits_per_node": 2e6, "grads_per_node": 3.0, "prox_per_node": 4.0}
    assert weighted_cost(rec, {"comm": 1e-6, "grad": 1.0, "prox": 0.5}) == 2.0 + 3.0 + 2.0
    assert weighted_cost(rec, {"value": 1.0}) is None  # a field the record lacks
    pb = problem()
    recs = records(engine("dpsgd", pb, eta=0.5 / pb.smoothness().L), 3,
                   cost_weights={"comm": 1e-3, "grad": 2.0})
    for r in recs:
        assert r["cost"] == math.fsum([1e-3 * r["bits_per_node"], 2.0 * r["grads_per_node"]])
    assert recs[-1]["cost"] > recs[1]["cost"] > 0


def test_runs_without_a_problem_have_no_oracle_fields():
    eng = Engine(make_algorithm("gossip", gamma=1.0), RING,
                 lambda i: torch.full((D,), float(i), dtype=torch.float64), seed=3)
    rec = eng.record()
    assert "grads_per_node" not in rec
    assert math.isnan(gradient_metric(eng, eng.mean_model())["grad_norm"])  # no f to differentiate


@pytest.mark.parametrize(("name", "estimator"), [("dpsgd", "lsvrg"), ("lead", "full"),
                                                 ("gt-saga", "full")])
def test_a_resumed_run_counts_what_the_uninterrupted_one_counts(name, estimator):
    """The counters travel in the oracles' checkpointed state: stopped after 3 rounds, saved,
    loaded into a fresh engine and run on, a run records the calls of the uninterrupted one
    (no setup gradient counted twice, none lost)."""
    from tests.helpers.resume import stopped_and_resumed

    pb = problem()
    hp = {"eta": 0.2 / pb.smoothness().L_max} if name != "lead" else {}
    straight, resumed = stopped_and_resumed(
        lambda: engine(name, pb, estimator=estimator, **hp), 7, 3)
    fields = ("grads_per_node", "sample_grads_per_node", "values_per_node", "prox_per_node")
    a, b = straight.record(), resumed.record()
    assert [a[k] for k in fields] == [b[k] for k in fields]
    assert a["grads_per_node"] >= 7
