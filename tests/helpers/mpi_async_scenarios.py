"""Asynchronous algorithms in virtual time; every record (and a digest of the event trace) goes
to a JSON-lines file. Started in process and under ``mpiexec`` by
tests/asynchronous/test_events_mpi.py, which compares the files: the same seed must give the
same events, bits and numbers wherever the nodes sit. A scenario named ``BASE-resumed`` runs
BASE for 10 sweeps, checkpoints it (every rank writes its nodes), restores the checkpoint into a
fresh engine and runs 10 more: its records, final models and trace equal BASE's.
Usage: python tests/helpers/mpi_async_scenarios.py OUT.jsonl NODES [SCENARIO ...]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.checkpoint import Checkpointer  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.metrics import JsonlLogger  # noqa: E402
from gossip.problems import make_problem  # noqa: E402
from tests.helpers.mpi_scenarios import distance_metric, log_run  # noqa: E402

STRAGGLER = "compute=exp:1;slow=nodes:0x5"
LATE = "loss=0.1;delay=exp:0.7;compute=lognormal:1,0.3"  # posts overtake one another
# name -> (algorithm, hyper-parameters, compressor, topology spec, network, gradients)
SCENARIOS: dict[str, tuple[str, dict, str, str, str, bool]] = {
    "pairwise-lossy": ("pairwise-gossip", {}, "none", "ring", "loss=0.1", False),
    "ad-psgd-straggler": ("ad-psgd", {}, "none", "exponential", STRAGGLER, True),
    "async-choco-topk": ("async-choco", {"gamma": 0.5}, "topk:0.25", "ring", "loss=0.2", True),
    "async-choco-qsgd-churn": ("async-choco", {"gamma": 0.5}, "qsgd:4", "exponential",
                               "churn=at:2@3-6+5@1-inf,fresh", False),
    "gossip-learning-late": ("gossip-learning", {}, "none", "exponential", LATE, True),
    "async-sgp-late": ("async-sgp", {}, "none", "directed-exponential", LATE, True),
}
RESUMED = ("gossip-learning-late-resumed",)
"""Scenarios checkpointed at sweep 10 and resumed into a fresh engine (module doc)."""


def engine_for(name: str, n: int, world: World) -> tuple[Engine, dict]:
    alg_name, hp, spec, topo_spec, network, trains = SCENARIOS[name]
    topo = topologies.build(topo_spec, n, seed=3)
    problem = make_problem("least-squares", n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    x_star, x0 = problem.solution(), problem.initial_point()
    if trains:
        hp = hp | {"eta": 0.2 / problem.smoothness().L}
    engine = Engine(
        make_algorithm(alg_name, **hp), topo, (lambda i: x0) if trains else (lambda i: x0 + 0.1 * i),
        compressor=spec, seed=11, world=world.configure(timeout=60), network=network,
        oracles=(lambda i, gen: problem.oracle(i, gen, "sgd", 3)) if trains else None,
    )
    engine.network.events.trace = []
    return engine, {"metrics": [distance_metric(x_star)] if trains else []}


def resumed(name: str, n: int, world: World, logger: JsonlLogger, out: str) -> Engine:
    """BASE run for 10 sweeps and checkpointed, then restored into a fresh engine that runs 10
    more (its trace continues the first engine's: the whole run's)."""
    base = name.removesuffix("-resumed")
    first, kw = engine_for(base, n, world)
    for rec in first.run(10, log_every=5, **kw):
        logger.write({"scenario": name} | {k: v for k, v in rec.items()
                                           if not k.endswith("_s") or k == "time_virtual_s"})
    ckpt = Checkpointer(f"{out}.ck-{name}", {"run": name}, every=10, world=world)
    try:
        ckpt.save(first)
        engine, kw = engine_for(base, n, world)
        assert ckpt.restore(engine) == 10
    finally:
        ckpt.close()
    engine.network.events.trace = first.network.events.trace
    log_run(engine, name, logger, rounds=10, **kw)
    return engine


def main() -> None:
    torch.set_num_threads(1)
    out, n = sys.argv[1], int(sys.argv[2])
    world = World.detect()
    with JsonlLogger(out, enabled=world.is_root) as logger:
        for name in sys.argv[3:] or [*SCENARIOS, *RESUMED]:
            if name in RESUMED:
                engine = resumed(name, n, world, logger, out)
            else:
                engine, kw = engine_for(name, n, world)
                log_run(engine, name, logger, **kw)
            trace = repr(engine.network.events.trace).encode()
            logger.write({"scenario": name, "type": "trace", "events": len(engine.network.events.trace),
                          "sha256": hashlib.sha256(trace).hexdigest()})


if __name__ == "__main__":
    main()
