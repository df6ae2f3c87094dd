"""The adaptive / all-reduce scenarios, in process or under ``mpiexec``: one JSON line each.

Started by tests/engine/test_adaptive_mpi.py, which compares the two files.
Usage: python tests/helpers/mpi_adaptive.py OUT.jsonl NODES
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.layout import Layout  # noqa: E402
from tests.helpers.mpi_scenarios import main as scenario_main  # noqa: E402
from tests.helpers.reference_adaptive import QuadraticOracle, quadratic_problem  # noqa: E402

# name -> (algorithm, hyper-parameters, topology); COMPRESSORS: the scenarios' compressors
SCENARIOS = {
    "onebit-adam": ("onebit-adam", {"eta": 0.05, "freeze_step": 3}, "complete"),
    "onebit-adam-l1": ("onebit-adam", {"eta": 0.05, "freeze_step": 2, "codec": "sign_l1"},
                       "complete"),
    "zero-one-adam": ("zero-one-adam", {"eta": 0.03, "var_freeze_step": 5, "var_update_scaler": 1,
                                        "local_step_scaler": 2, "local_step_clipper": 2},
                      "complete"),
    "onebit-lamb": ("onebit-lamb", {"eta": 0.02, "freeze_step": 4, "weight_decay": 0.01,
                                    "max_coeff": 3.0}, "complete"),
    "signum": ("signum", {"eta": 0.01, "byzantine": [1]}, "complete"),
    "signsgd": ("signum", {"eta": 0.01, "beta": 0.0}, "complete"),
    "adasum": ("adasum", {"eta": 0.05}, "complete"),
    "greedylore": ("greedylore", {"eta": 0.05, "rank": 2, "refresh": 4, "start": 2,
                                  "min_compression": 0.0}, "complete"),
    "powersgd": ("powersgd", {"eta": 0.05, "rank": 1, "start": 2}, "complete"),
    "tracked-amsgrad": ("tracked-amsgrad", {"eta": 0.02, "gossip_steps": 2}, "ring"),
    "dadam": ("dadam", {"eta": 0.02}, "ring"),
    "choco-amsgrad": ("choco-amsgrad", {"eta": 0.02, "gamma": 0.3}, "ring"),
    "desloc": ("desloc", {"eta": 0.02, "period_x": 2, "period_m": 3, "period_v": 4}, "ring"),
    "accum-adamw": ("accum-adamw", {"eta": 0.02, "accum_iter": 3}, "ring"),
    "lodadac": ("lodadac", {"eta": 0.02, "gamma": 0.5, "local_steps": 3, "rule": "amsgrad",
                            "delta": 0.1}, "ring"),
    "squarm-sgd": ("squarm-sgd", {"eta": 0.02, "gamma": 0.4, "local_steps": 2,
                                  "threshold": 30000.0}, "ring"),
    "apmsqueeze": ("apmsqueeze", {"eta": 0.05, "freeze_step": 3}, "complete"),
}
COMPRESSORS = {"choco-amsgrad": "topk:0.5", "lodadac": "topk:0.5",
               "squarm-sgd": "randk:0.5+qsgd:4:biased"}
"""The scenarios that compress with something other than ``none``."""


def engine_for(name: str, n: int, world: World) -> tuple[Engine, dict] | None:
    """The scenario's engine and the keywords :func:`log_run` takes for it (None: the scenario
    does not run on ``n`` nodes)."""
    alg, hp, topo = SCENARIOS[name]
    if alg == "adasum" and n & (n - 1):
        return None  # a power-of-two node count only
    data, _ = quadratic_problem(n, 23, seed=9, scales=[0.5 + i for i in range(n)])
    engine = Engine(make_algorithm(alg, **hp), topologies.build(topo, n),
                    lambda i: torch.zeros(23, dtype=torch.float64),
                    compressor=COMPRESSORS.get(alg, "none"),
                    layout=Layout([(4, 5), (3,)]), seed=4, world=world.configure(timeout=60),
                    oracles=lambda i, gen: QuadraticOracle(data, i))
    return engine, {"rounds": 12, "log_every": 4}


if __name__ == "__main__":
    scenario_main(engine_for, SCENARIOS)
