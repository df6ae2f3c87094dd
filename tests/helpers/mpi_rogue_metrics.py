"""Run under ``mpiexec -n 2`` by tests/engine/test_rogue_metrics_mpi.py: rank 1 is a rogue in
the metric reductions of a synchronous run (gossip/comm/world.py): it alters what it sends into
a record's per-node values or the ordered sum of the mean model on the way to MPI. For each case
rank 0 prints the one line it stops with::

    CASE name: ErrorClass: message        (or "CASE name: no error")

then both ranks meet at a barrier and go on with the next case, each case in a communicator of
its own (what a stopped case left in flight cannot reach the next). ``honest-divergence``: rank
1 is honest and its model holds NaN: both ranks must still say the run diverged.

``mpi_rogue_metrics.py [CASE ...]``: the cases to run (default: all of :data:`CASES`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm import world as world_module  # noqa: E402
from gossip.comm.mpi import MPILink  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from tests.helpers.mpi_rogue_async import appended, garbage, truncated  # noqa: E402

torch.set_num_threads(1)
SUM, VALUES = world_module._TAG_SUM, world_module._TAG_VALUES


def first_nan(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[:8] = np.frombuffer(np.float64(np.nan).tobytes(), dtype=np.uint8)
    return out


CASES = {  # name: (the tag of the rogue's messages it alters, how)
    "sum-nan": (SUM, first_nan),
    "sum-garbage": (SUM, garbage),
    "sum-truncated": (SUM, truncated),
    "values-nan": (VALUES, first_nan),
    "values-garbage": (VALUES, garbage),
    "values-truncated": (VALUES, truncated),
    "values-appended-1MiB": (VALUES, appended),
    "honest-divergence": (None, None),
}


def rogue_link(link: MPILink, tag_of: int, corrupt) -> None:
    """Alter the sends of tag ``tag_of`` on their way to MPI."""
    exchange, kept = link.exchange, []

    def altered(recvs, sends, tag):
        if tag == tag_of:
            sends = [(torch.from_numpy(corrupt(buf.numpy())), dst) for buf, dst in sends]
            kept.extend(sends)
        return exchange(recvs, sends, tag)

    link.exchange = altered


def main() -> None:
    base = World.detect(timeout=20)
    for case in sys.argv[1:] or list(CASES):
        tag, corrupt = CASES[case]
        world = World(MPILink(MPI.COMM_WORLD.Dup()), timeout=2)
        engine = Engine(make_algorithm("gossip"), topologies.build("ring", 2),
                        lambda i: torch.linspace(0, 1, 6, dtype=torch.float64) + i, world=world)
        if world.rank == 1 and tag is not None:
            rogue_link(world.link, tag, corrupt)
        if world.rank == 1 and tag is None:
            engine.block.x[0, 2] = float("nan")  # an honest rank whose model diverged
        try:
            engine.run(2, log_every=1)
            line = "no error"
        except Exception as exc:  # the line a user's script would print
            line = f"{type(exc).__name__}: {exc}"
        for rank in (0, 1):  # in turn: two ranks' lines at once may reach mpiexec's output mixed
            if world.rank == rank and (rank == 0 or tag is None):
                print(f"CASE {case}: rank {world.rank}: {line}", flush=True)
            base.barrier("the end of a case with")


if __name__ == "__main__":
    main()
