"""A long consensus run whose ranks write their pids, so a test can kill one (test_mpi.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402

torch.set_num_threads(1)
world = World.detect()
with open(sys.argv[1], "a") as fh:
    fh.write(f"{world.rank}:{os.getpid()}\n")
topo = topologies.build("ring", world.size)
engine = Engine(make_algorithm("gossip"), topo, lambda i: torch.randn(1000), world=world, timeout=5)
try:
    engine.run(10**7, log_every=10**6)
except Exception as exc:  # what a user's script sees: the error, then an abort of the job
    print(f"rank {world.rank}: {exc}", flush=True)
    world.abort(1)
