"""Federated methods on the star (node 0 the server) on a least-squares problem; every record goes
to a JSON-lines file. Started in process and under ``mpiexec`` by
tests/engine/test_federated_mpi.py, which compares the files (one launch checks every scenario).
Usage: python tests/helpers/mpi_federated_scenarios.py OUT.jsonl NODES [SCENARIO ...]
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
from gossip.problems import make_problem  # noqa: E402
from tests.helpers.mpi_scenarios import distance_metric  # noqa: E402
from tests.helpers.mpi_scenarios import main as scenario_main  # noqa: E402

# name -> (algorithm, hyper-parameters, compressor, estimator)
SCENARIOS: dict[str, tuple[str, dict, str, str]] = {
    "fedavg": ("fedavg", {"clients_per_round": 3}, "none", "full"),
    "fedprox-sgd-weighted": ("fedprox", {"clients_per_round": 4, "mu": 0.1, "sampling": "weighted",
                                         "client_weights": [3.0, 1.0, 1.0, 2.0, 5.0, 1.0, 1.0, 4.0]},
                             "none", "sgd"),
    "fedadam-topk-replacement": ("fedadam", {"clients_per_round": 4, "sampling": "replacement",
                                             "availability": 0.7, "server_lr": 0.05},
                                 "topk:0.25", "full"),
    "scaffold-qsgd": ("scaffold", {"clients_per_round": 5}, "qsgd:4bit", "full"),
    "fedavg-down-randk": ("fedavg", {"clients_per_round": 4, "downlink_compressor": "randk:0.5"},
                          "sign", "full"),
    "cada1-sgd": ("cada", {"rule": "cada1", "c": 20.0, "max_delay": 6, "server_lr": 0.05},
                  "none", "sgd"),
    "cada2-topk": ("cada", {"rule": "cada2", "c": 20.0, "server_lr": 0.05}, "topk:0.25", "sgd"),
    "g-cada": ("g-cada", {"c": 20.0, "server_lr": 0.05}, "none", "full"),
    "fedadamw-sgd": ("fedadamw", {"clients_per_round": 4, "eta": 0.05, "clip": 5.0}, "none", "sgd"),
    "fedadam-ssm-sgd": ("fedadam-ssm", {"clients_per_round": 4, "eta": 0.05, "density": 0.3},
                        "none", "sgd"),
    "fedadam-ssm-separate": ("fedadam-ssm", {"clients_per_round": 4, "eta": 0.05, "density": 0.3,
                                             "mask": "separate", "sampling": "replacement"},
                             "none", "full"),
    "feddyn-topk-down": ("feddyn", {"clients_per_round": 4, "alpha": 0.5,
                                    "downlink_compressor": "qsgd:4bit"}, "topk:0.25", "full"),
    "fednova-steps-sgd": ("fednova", {"clients_per_round": 4, "local_steps": [1, 2, 3, 4, 5, 6, 7, 8]},
                          "none", "sgd"),
    "fedavg-power-fair": ("fedavg", {"clients_per_round": 2, "selection": "power", "candidates": 5,
                                     "sampling": "fair"}, "sign", "sgd"),
    "feddyn-power-weighted": ("feddyn", {"clients_per_round": 3, "alpha": 0.5, "selection": "power",
                                         "candidates": 4, "sampling": "weighted",
                                         "client_weights": [3.0, 1.0, 1.0, 2.0, 5.0, 1.0, 1.0, 4.0]},
                              "none", "full"),
}


def engine_for(name: str, n: int, world: World) -> tuple[Engine, dict]:
    """The scenario's engine (n nodes: the server and n − 1 clients) and log_run's keywords."""
    alg_name, hp, spec, estimator = SCENARIOS[name]
    problem = make_problem("least-squares", n_nodes=n - 1, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    eta = 0.2 / problem.smoothness().L
    x_star = problem.solution()
    x0 = problem.initial_point()
    local = {k: v for k, v in {"eta": eta, "local_steps": 3}.items()
             if k in accepted_hparams(alg_name)}  # CADA takes one gradient a round, no η
    engine = Engine(
        make_algorithm(alg_name, **(local | hp)), topologies.build("star", n),
        lambda i: x0, compressor=spec, seed=11, world=world.configure(timeout=60),
        oracles=lambda i, gen: problem.oracle(i - 1, gen, estimator, 2) if i else None,
    )

    return engine, {"metrics": [distance_metric(x_star)]}


if __name__ == "__main__":
    scenario_main(engine_for, SCENARIOS)
