"""Tracking, directed, momentum and primal-dual algorithms on a least-squares problem; every
record goes to a JSON-lines file. Started in process and under ``mpiexec`` by
tests/engine/test_tracking_mpi.py, which compares the files (one launch checks every scenario).
Usage: python tests/helpers/mpi_tracking_scenarios.py OUT.jsonl NODES [SCENARIO ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import topologies  # noqa: E402
from gossip.algorithms import accepted_hparams, make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.metrics import gradient_metric  # noqa: E402
from gossip.problems import make_problem  # noqa: E402
from tests.helpers.mpi_scenarios import distance_metric  # noqa: E402
from tests.helpers.mpi_scenarios import main as scenario_main  # noqa: E402

# name -> (algorithm, hyper-parameters, compressor, topology spec, weights, estimator)
SCENARIOS: dict[str, tuple[str, dict, str, str, str, str]] = {
    "c-gt-lead2": ("c-gt", {}, "lead:2", "ring", "metropolis", "full"),
    "c-gt-ef-topk": ("c-gt", {"error_feedback": True}, "topk:0.25", "exponential", "metropolis", "full"),
    "c-gt-onepeer": ("c-gt", {}, "qsgd:4bit", "one-peer-exponential", "metropolis", "full"),
    "c-gt-matchings": ("c-gt", {}, "topk:0.25", "matchings", "metropolis", "sgd"),
    "diging-onepeer": ("diging", {}, "none", "one-peer-exponential", "metropolis", "full"),
    "extra": ("extra", {}, "none", "erdos-renyi:p=0.4", "metropolis", "full"),
    "push-sum-lead2": ("push-sum", {"gamma": 0.5}, "lead:2", "directed-random:p=0.2", "push", "full"),
    "push-sum-onepeer": ("push-sum", {}, "none", "one-peer-exponential", "metropolis", "full"),
    "push-sum-onepeer-q": ("push-sum", {}, "lead:2", "one-peer-exponential", "metropolis", "full"),
    "cpp-lead2": ("cpp", {}, "lead:2", "directed-random:p=0.2", "push", "full"),
    "docom-sgd": ("docom", {"beta": 0.3}, "sign", "ring", "metropolis", "sgd"),
    "motef-topk": ("motef", {}, "topk:0.25", "ring", "metropolis", "sgd"),
    "c-ecl-randk": ("c-ecl", {"period": 2}, "randk:0.3", "ring", "metropolis", "full"),
    "c-ecl-topk": ("c-ecl", {"period": 1}, "topk:0.25", "erdos-renyi:p=0.4", "metropolis", "sgd"),
    # block algorithms with gradients (2 nodes per rank: rows of a block exchange across ranks)
    "lead-qsgd": ("lead", {}, "qsgd:4bit", "erdos-renyi:p=0.4", "metropolis", "sgd"),
    "dpsgd-sgd": ("dpsgd", {}, "none", "exponential", "metropolis", "sgd"),
    "choco-sgd-topk": ("choco", {"gamma": 0.3}, "topk:0.25", "ring", "metropolis", "sgd"),
    # the same with the next gradients computed while the messages travel: the same records
    "dpsgd-sgd-overlap": ("dpsgd", {}, "none", "exponential", "metropolis", "sgd"),
    "choco-sgd-topk-overlap": ("choco", {"gamma": 0.3}, "topk:0.25", "ring", "metropolis", "sgd"),
    # decentralized ADMM (exact local solves) and DLM: unit weights, 2 nodes per rank
    "admm": ("admm", {"c": 0.7}, "none", "erdos-renyi:p=0.4", "metropolis", "full"),
    "dlm": ("dlm", {"c": 0.7, "rho": 5.0}, "none", "ring", "metropolis", "full"),
    # adapt-then-combine (gossip/algorithms/atc.py): ATC-DIGing's two phases a round
    "atc-dgd-sgd": ("atc-dgd", {}, "none", "exponential", "metropolis", "sgd"),
    "atc-diging": ("atc-diging", {}, "none", "ring", "metropolis", "full"),
    "next-matchings": ("next", {}, "none", "matchings", "metropolis", "sgd"),
    "exact-diffusion": ("exact-diffusion", {}, "none", "erdos-renyi:p=0.4", "metropolis", "full"),
    "led-sgd": ("led", {"local_steps": 3}, "none", "ring", "metropolis", "sgd"),
    # variance-reduced tracking: samples drawn from the keyed stream, whatever the oracle's estimator
    "gt-saga": ("gt-saga", {"batch_size": 2}, "none", "ring", "metropolis", "full"),
    "gt-sarah": ("gt-sarah", {"batch_size": 3, "period": 4}, "none", "erdos-renyi:p=0.4", "metropolis", "full"),
    # local training with a correction (issue 41): rounds without messages, a shared coin
    "k-gt": ("k-gt", {"local_steps": 3}, "none", "erdos-renyi:p=0.4", "metropolis", "full"),
    "scaffnew": ("scaffnew", {"p": 0.4}, "none", "ring", "metropolis", "sgd"),
}


def engine_for(name: str, n: int, world: World) -> tuple[Engine, dict]:
    """The scenario's engine and the keywords :func:`log_run` takes for it."""
    alg_name, hp, spec, topo_spec, weights, estimator = SCENARIOS[name]
    topo = topologies.build(topo_spec, n, weights=weights, seed=3)
    problem = make_problem("least-squares", n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    eta = 0.2 / problem.smoothness().L
    x_star = problem.solution()
    x0 = problem.initial_point()
    step = {"eta": eta} if "eta" in accepted_hparams(alg_name) else {}  # admm, dlm take none
    engine = Engine(
        make_algorithm(alg_name, **step, **hp), topo, lambda i: x0, compressor=spec, seed=11,
        world=world.configure(timeout=60), oracles=lambda i, gen: problem.oracle(i, gen, estimator, 2),
        overlap=name.endswith("-overlap"),
    )

    return engine, {"metrics": [distance_metric(x_star), gradient_metric]}


if __name__ == "__main__":
    scenario_main(engine_for, SCENARIOS)
