"""Run under ``mpiexec -n 2`` by tests/engine/test_reliability_mpi.py: rank 1 runs a model 1 MB
larger than rank 0's, so the message it sends rank 0 is larger than rank 0's settings announce.
Each rank prints the error it stops with. ``mpi_rogue.py step``: the first message is a
round's (no record before it), else the round-0 record's mean model."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402

world = World.detect()
d = 100 + world.rank * 250_000  # float32: rank 1's model is 1 MB larger
engine = Engine(make_algorithm("gossip"), topologies.build("ring", 2), lambda i: torch.ones(d),
                world=world.configure(timeout=10), dtype=torch.float32)
try:
    if sys.argv[1:] == ["step"]:
        engine.step()
    else:
        engine.run(3, log_every=100)
except Exception as exc:
    print(f"rank {world.rank}: {type(exc).__name__}: {exc}", flush=True)
    world.abort(1)
