"""Algorithms under message loss, late messages, noise and partial activation (``--network``);
every record goes to a JSON-lines file.
Started in process and under ``mpiexec`` by tests/engine/test_network_mpi.py, which compares
the files: the same seed must give the same drops, lags, noise, active nodes, bytes, bits and
virtual times wherever the nodes sit.
Usage: python tests/helpers/mpi_network_scenarios.py OUT.jsonl NODES [SCENARIO ...]
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
from gossip.problems import make_problem  # noqa: E402
from tests.helpers.mpi_scenarios import distance_metric  # noqa: E402
from tests.helpers.mpi_scenarios import main as scenario_main  # noqa: E402

GE = "loss=ge:p_gb=0.1,p_bg=0.4,loss_good=0.02,loss_bad=0.9"
TIMED = "loss=0.2;delay=lognormal:0.1,0.5;compute=exp:1;slow=0.25x5"  # records: time_virtual_s
# name -> (algorithm, hyper-parameters, compressor, topology spec, weights, network, gradients)
SCENARIOS: dict[str, tuple[str, dict, str, str, str, str, bool]] = {
    "gossip-exact": ("gossip", {}, "none", "ring", "metropolis", "loss=0.2", False),
    "gossip-ge-qsgd": ("gossip", {"gamma": 0.5}, "qsgd:4bit", "exponential", "metropolis", GE, False),
    "dpsgd-onepeer": ("dpsgd", {}, "none", "one-peer-exponential", "metropolis", "loss=0.2", True),
    "deepsqueeze-sign": ("deepsqueeze", {"gamma": 0.2}, "sign", "ring", "metropolis", GE, False),
    "choco-topk": ("choco", {"gamma": 0.3}, "topk:0.25", "ring", "metropolis", "loss=0.1", True),
    "choco-arcs-topk": ("choco-arcs", {"gamma": 0.3}, "topk:0.25", "ring", "metropolis", "loss=0.1",
                        True),
    "choco-arcs-randk": ("choco-arcs", {"gamma": 0.3}, "randk:0.3", "erdos-renyi:p=0.4",
                         "metropolis", GE, False),
    "lead-qsgd": ("lead", {}, "qsgd:4bit", "erdos-renyi:p=0.4", "metropolis", GE, True),
    "lead-arcs-lead2": ("lead-arcs", {}, "lead:2", "erdos-renyi:p=0.4", "metropolis", GE, True),
    "lead-arcs-topk": ("lead-arcs", {}, "topk:0.25", "ring", "metropolis", "loss=0.2", True),
    "beer-topk": ("beer", {}, "topk:0.25", "ring", "metropolis", "loss=0.1", True),
    "beer-arcs-qsgd": ("beer-arcs", {}, "qsgd:4bit", "erdos-renyi:p=0.4", "metropolis", GE, True),
    "beer-arcs-topk": ("beer-arcs", {}, "topk:0.25", "ring", "metropolis", "loss=0.2", True),
    "prox-lead-arcs-lead2": ("prox-lead-arcs", {}, "lead:2", "ring", "metropolis", "loss=0.2",
                             True),  # on the lasso
    "dcd-none": ("dcd", {}, "none", "ring", "metropolis", "loss=0.1", True),
    "c-gt-lead2": ("c-gt", {}, "lead:2", "ring", "metropolis", "loss=0.1", True),
    "c-gt-arcs-lead2": ("c-gt-arcs", {}, "lead:2", "ring", "metropolis", "loss=0.1", True),
    "c-gt-arcs-none": ("c-gt-arcs", {}, "none", "erdos-renyi:p=0.4", "metropolis", GE, True),
    "powergossip-r2": ("powergossip", {"rank": 2, "iterations": 2}, "none", "erdos-renyi:p=0.4",
                       "metropolis", "loss=0.2", False),
    "powergossip-ge": ("powergossip", {}, "none", "ring", "metropolis", GE, True),
    "extra-none": ("extra", {}, "none", "erdos-renyi:p=0.4", "metropolis", "loss=0.2", True),
    "c-ecl-randk": ("c-ecl", {"period": 2}, "randk:0.3", "ring", "metropolis", GE, True),
    "dadam-loss": ("dadam", {}, "none", "exponential", "metropolis", "loss=0.2", True),
    "tracked-amsgrad-ge": ("tracked-amsgrad", {}, "none", "erdos-renyi:p=0.4", "metropolis", GE,
                           True),
    "push-sum-exact": ("push-sum", {}, "none", "directed-random:p=0.3", "push", "loss=0.3", True),
    "dpsgd-timed": ("dpsgd", {}, "none", "exponential", "metropolis", TIMED, True),
    # late messages (stale=): values get the newest arrived, increments and mass every arrival
    "gossip-stale-geom": ("gossip", {}, "none", "ring", "metropolis", "stale=geom:0.4", False),
    "deepsqueeze-stale": ("deepsqueeze", {"gamma": 0.2}, "sign", "exponential", "metropolis",
                          "stale=2", False),
    "choco-stale-topk": ("choco", {"gamma": 0.3}, "topk:0.25", "erdos-renyi:p=0.4", "metropolis",
                         "stale=uniform:0,3", True),
    "lead-stale-qsgd": ("lead", {}, "qsgd:4bit", "ring", "metropolis", "stale=geom:0.5", True),
    "push-sum-stale": ("push-sum", {}, "none", "directed-random:p=0.3", "push", "stale=geom:0.5",
                       True),
    "push-sum-loss-stale": ("push-sum", {}, "none", "directed-random:p=0.3", "push",
                            "loss=0.2;stale=uniform:0,2", True),
    "dpsgd-onepeer-loss-stale": ("dpsgd", {}, "none", "one-peer-exponential", "metropolis",
                                 "loss=0.2;stale=arcs:*@geom:0.5+0>1@3", True),
    # adapt-then-combine trackers (on_loss "edge", per phase; ATC-DIGing has two a round)
    "atc-diging-loss": ("atc-diging", {}, "none", "ring", "metropolis", "loss=0.2", True),
    "next-loss": ("next", {}, "none", "erdos-renyi:p=0.4", "metropolis", "loss=0.2", True),
    "led-loss": ("led", {"local_steps": 2}, "none", "erdos-renyi:p=0.4", "metropolis", GE, True),
    # a noisy channel (noise=) and partial activation (active=), with loss so that both
    # meet lost messages too
    "gossip-noise": ("gossip", {}, "none", "ring", "metropolis", "loss=0.1;noise=var:0.01", False),
    "choco-noise-topk": ("choco", {"gamma": 0.3}, "topk:0.25", "erdos-renyi:p=0.4", "metropolis",
                         "loss=0.1;noise=std:0.05", True),
    "lead-noise-qsgd": ("lead", {}, "qsgd:4bit", "ring", "metropolis", "loss=0.1;noise=var:1e-4",
                        True),
    "choco-arcs-noise": ("choco-arcs", {"gamma": 0.3}, "topk:0.25", "ring", "metropolis",
                         "loss=0.1;noise=var:1e-4", True),
    "dpsgd-active-markov": ("dpsgd", {}, "none", "exponential", "metropolis",
                            "loss=0.1;active=markov:p_off=0.3,p_on=0.5", True),
    "extra-active": ("extra", {}, "none", "erdos-renyi:p=0.4", "metropolis",
                     "loss=0.1;active=0.6", True),
    "push-sum-active": ("push-sum", {}, "none", "directed-random:p=0.3", "push",
                        "loss=0.1;active=poisson:1", True),
    "lead-arcs-active-cyclic": ("lead-arcs", {}, "topk:0.25", "erdos-renyi:p=0.4", "metropolis",
                                "loss=0.1;active=cyclic:2", True),  # (on a ring no arc would move)
    "gossip-noise-active-qsgd": ("gossip", {"gamma": 0.5}, "qsgd:4bit", "exponential",
                                 "metropolis", "loss=0.1;noise=var:0.01;active=0.7", False),
    "k-gt-loss": ("k-gt", {"local_steps": 2}, "none", "erdos-renyi:p=0.4", "metropolis",
                  "loss=0.2", True),
    "scaffnew-ge": ("scaffnew", {"p": 0.5}, "none", "ring", "metropolis", GE, True),
    # running sums (on_loss "running-sum"): lost and late (reordered) together
    "robust-push-sum-loss-stale": ("robust-push-sum", {}, "none", "directed-random:p=0.3", "push",
                                   "loss=0.2;stale=geom:0.5", False),
    "robust-push-tracking-loss-stale": ("robust-push-tracking", {}, "none", "directed-random:p=0.3",
                                        "push", "loss=0.2;stale=uniform:0,3", True),
    "robust-push-sum-ge": ("robust-push-sum", {}, "none", "exponential", "push", GE, True),
    "lead-arcs-loss-stale": ("lead-arcs", {"gamma_dual": 0.1}, "topk:0.25", "erdos-renyi:p=0.4",
                             "metropolis", "loss=0.1;stale=geom:0.5", True),
    "c-gt-arcs-loss-stale": ("c-gt-arcs", {}, "topk:0.25", "ring", "metropolis",
                             "loss=0.1;stale=geom:0.5", True),  # two channels, one packed phase
    "c-ecl-loss-stale": ("c-ecl", {"period": 2}, "randk:0.3", "ring", "metropolis",
                         "loss=0.1;stale=uniform:0,3", True),
    # RASGP: running sums, and sleeping nodes that catch up their steps when they wake
    "robust-push-sgd-loss-active": ("robust-push-sgd", {"mu": 0.05}, "none",
                                    "directed-random:p=0.3", "push",
                                    "loss=0.2;active=markov:p_off=0.3,p_on=0.5", True),
}


def engine_for(name: str, n: int, world: World) -> tuple[Engine, dict]:
    """The scenario's engine and the keywords :func:`log_run` takes for it (consensus runs
    start from distinct models, optimization runs from one and log the distance to x*)."""
    alg_name, hp, spec, topo_spec, weights, network, trains = SCENARIOS[name]
    topo = topologies.build(topo_spec, n, weights=weights, seed=3)
    kind = "lasso" if alg_name.startswith("prox-") else "least-squares"  # prox: a regularizer
    problem = make_problem(kind, n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    x_star, x0 = problem.solution(), problem.initial_point()
    if trains:
        hp = hp | {"eta": 0.2 / problem.smoothness().L}
    engine = Engine(
        make_algorithm(alg_name, **hp), topo, (lambda i: x0) if trains else (lambda i: x0 + 0.1 * i),
        compressor=spec, seed=11, world=world.configure(timeout=60), network=network,
        layout=Layout([(4, 5)]) if alg_name == "powergossip" else None,  # matrices to sketch
        oracles=(lambda i, gen: problem.oracle(i, gen, "full", 2)) if trains else None,
    )

    return engine, {"metrics": [distance_metric(x_star)] if trains else []}


if __name__ == "__main__":
    scenario_main(engine_for, SCENARIOS)
