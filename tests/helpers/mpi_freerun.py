"""A free-running asynchronous run (gossip/network/freerun.py), one node per rank; the records
(round 0, the node and round records of the snapshots every LOG_EVERY sweeps, the run's end) go
to a JSON-lines file. Started under mpiexec by tests/asynchronous/test_freerun_mpi.py.
Usage: python tests/helpers/mpi_freerun.py OUT.jsonl ALGORITHM NETWORK SECONDS [STOP_RANK [LOG_EVERY]]
(with STOP_RANK >= 0, that rank stops answering, SIGSTOP, a third of the way through; with
kill:R, rank R kills itself then, SIGKILL; -1: none; LOG_EVERY: default 100, the end record
only). Records carry distance_to_optimum (node records:
the node's own) and node records its local loss.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.metrics import JsonlLogger, squared_distance  # noqa: E402
from gossip.problems import make_problem  # noqa: E402

torch.set_num_threads(1)
out, name, network, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
stop = sys.argv[5] if len(sys.argv) > 5 else "-1"
stop_signal = signal.SIGKILL if stop.startswith("kill:") else signal.SIGSTOP
stop_rank = int(stop.removeprefix("kill:"))
log_every = int(sys.argv[6]) if len(sys.argv) > 6 else 100
world = World.detect()
n = world.size
problem = make_problem("least-squares", n_nodes=n, dim=20, samples_per_node=15, seed=4,
                       heterogeneity=1.0, dtype=torch.float64)
x0, x_star = problem.initial_point(), problem.solution()
engine = Engine(make_algorithm(name, eta=0.2 / problem.smoothness().L), topologies.build("ring", n),
                lambda i: x0 + i, world=world.configure(timeout=3), network=network if network != "none" else None,
                oracles=lambda i, gen: problem.oracle(i, gen, "full"), free_run=seconds / 100)


def distance(engine, xbar):
    return {"distance_to_optimum": squared_distance(engine, x_star)}


def node_distance(i, x):
    return {"distance_to_optimum": float(((x - x_star) ** 2).sum() / (x_star**2).sum()),
            "loss": problem.local_loss(i, x)}


if world.rank == stop_rank:
    threading.Timer(seconds / 3, lambda: os.kill(os.getpid(), stop_signal)).start()
with JsonlLogger(out, enabled=world.is_root) as logger:
    try:
        engine.run(100, log_every=log_every, on_record=logger.write, metrics=[distance],
                   node_metrics=[node_distance])
    except Exception as exc:  # what a user's script sees: the error, then an abort of the job
        print(f"rank {world.rank}: {exc}", flush=True)
        world.abort(1)
