"""Runs a fixed list of small scenarios and writes every record to a JSON-lines file.

Started in process and under ``mpiexec`` by tests/engine/test_mpi.py, which compares the files: one
launch checks every algorithm (starting ranks is the expensive part on a 2-core machine).
Usage: python tests/helpers/mpi_scenarios.py OUT.jsonl NODES [SCENARIO ...]
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
from gossip.metrics import JsonlLogger  # noqa: E402
from gossip.rng import generator, init_seed  # noqa: E402

# name -> (algorithm, hyper-parameters, compressor, topology spec, shape)
SCENARIOS: dict[str, tuple[str, dict, str, str, tuple]] = {
    "gossip-none": ("gossip", {"gamma": 1.0}, "none", "erdos-renyi:p=0.4", (40,)),
    "gossip-onepeer": ("gossip", {}, "none", "one-peer-exponential", (40,)),
    "choco-topk": ("choco", {"gamma": 0.3}, "topk:0.25", "erdos-renyi:p=0.4", (40,)),
    "choco-qsgd": ("choco", {"gamma": 0.5}, "qsgd:4bit:biased", "ring", (40,)),
    "choco-lowrank": ("choco", {"gamma": 0.5}, "lowrank:1", "ring", (6, 5)),
    "deepsqueeze-sign": ("deepsqueeze", {"gamma": 0.2}, "sign", "erdos-renyi:p=0.4", (40,)),
    "dcd-qsgd": ("dcd", {}, "qsgd:8bit", "ring", (40,)),
    "ecd-randk": ("ecd", {}, "randk:0.5:unbiased", "ring", (40,)),
    # per-arc messages; shape (6, 5) and (4,): a layout of a matrix and a vector
    "powergossip-r2": ("powergossip", {"rank": 2, "iterations": 2}, "none", "erdos-renyi:p=0.4",
                       ((6, 5), (4,))),
    "powergossip-cold": ("powergossip", {"warm_start": False}, "none", "ring", (6, 5)),
}


def engine_for(name: str, n: int, world: World) -> tuple[Engine, dict]:
    """The scenario's engine and the keywords :func:`log_run` takes for it."""
    alg_name, hp, spec, topo_spec, shape = SCENARIOS[name]
    topo = topologies.build(topo_spec, n, seed=3)

    shapes = list(shape) if isinstance(shape[0], tuple) else [shape]  # a layout of several
    layout = Layout(shapes)

    def x0(i: int) -> torch.Tensor:
        size = shape if len(shapes) == 1 else (layout.numel,)
        return torch.randn(size, generator=generator(init_seed(5, i)), dtype=torch.float64)

    engine = Engine(
        make_algorithm(alg_name, **hp), topo, x0, compressor=spec,
        layout=layout if len(shapes) > 1 or len(shape) > 1 else None, seed=11,
        world=world.configure(timeout=60),
    )
    return engine, {}


def log_run(engine: Engine, name: str, logger: JsonlLogger, rounds: int = 20, log_every: int = 5,
            metrics: list = ()) -> None:
    """Run ``engine`` and write its records, then every node's final model sum and x̄ exactly."""
    for rec in engine.run(rounds, log_every=log_every, metrics=metrics):
        logger.write({"scenario": name} | {k: v for k, v in rec.items()  # wall times differ
                                           if not k.endswith("_s") or k == "time_virtual_s"})
    xs = engine.node_values({i: float(nd.x.sum()) for i, nd in engine.nodes.items()})
    logger.write({"scenario": name, "type": "final", "x_sums": xs.tolist(),
                  "xbar": engine.mean_model().tolist()})


def distance_metric(x_star: torch.Tensor):
    """The metric the problem scenarios log: x̄'s relative squared distance to ``x_star``."""
    from gossip.metrics import squared_distance

    return lambda eng, xbar: {"distance_to_optimum": squared_distance(eng, x_star)}


def main(engine_for=engine_for, scenarios=SCENARIOS) -> None:
    """``OUT.jsonl NODES [SCENARIO ...]``: each scenario's ``engine_for(name, n, world)``
    (an engine and :func:`log_run`'s keywords, or None to skip it) run and logged."""
    torch.set_num_threads(1)
    out, n = sys.argv[1], int(sys.argv[2])
    names = sys.argv[3:] or list(scenarios)
    world = World.detect()
    with JsonlLogger(out, enabled=world.is_root) as logger:
        for name in names:
            built = engine_for(name, n, world)
            if built is not None:
                log_run(built[0], name, logger, **built[1])


if __name__ == "__main__":
    main()
