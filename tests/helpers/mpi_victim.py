"""A long consensus run whose ranks write their pids, so a test can kill one (test_mpi.py).

``mpi_victim.py PIDFILE [where]``: with ``where`` = ``values`` or ``sum``, rank 2 stops itself
(SIGSTOP) at round 5 inside a metric, just before the per-node value gather or the ordered sum
of the mean model, while the other ranks enter that reduction; with ``chain``, inside the
ordered sum after its opening barrier, while the others wait along the chain of ranks
(test_reliability_mpi.py); with ``async``, an asynchronous run (pairwise gossip in virtual
time) that logs every sweep to ``PIDFILE.jsonl`` as it goes (test_events_mpi.py).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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
where = sys.argv[2] if len(sys.argv) > 2 else None
engine = Engine(make_algorithm("pairwise-gossip" if where == "async" else "gossip"), topo,
                lambda i: torch.randn(1000), world=world.configure(timeout=5))


def stop_inside_reduction(eng, xbar):
    if eng.round == 5 and world.rank == 2:
        if where == "chain":  # stop once the sum's opening barrier is passed
            passed = world.barrier
            world.barrier = lambda *what: (passed(*what), os.kill(os.getpid(), signal.SIGSTOP))
        else:
            os.kill(os.getpid(), signal.SIGSTOP)
    if where in ("sum", "chain"):
        return {"norm_of_mean": float(eng.mean_model().norm())}
    return {"spread": float(eng.node_values({i: float(nd.x[0]) for i, nd in eng.nodes.items()}).std())}


try:
    if where == "async":
        from gossip.metrics import JsonlLogger

        with JsonlLogger(sys.argv[1] + ".jsonl", enabled=world.is_root) as log:
            engine.run(10**7, log_every=10, on_record=log.write)
    elif where is None:
        engine.run(10**7, log_every=10**6)
    else:
        engine.run(10**7, log_every=1, metrics=[stop_inside_reduction])
except Exception as exc:  # what a user's script sees: the error, then an abort of the job
    print(f"rank {world.rank}: {exc}", flush=True)
    world.abort(1)
