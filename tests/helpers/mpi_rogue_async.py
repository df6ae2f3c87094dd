"""Run under ``mpiexec -n 2`` by tests/asynchronous/test_rogue_mpi.py: rank 1 is a rogue peer
of an asynchronous run, rank 0 an honest node. For each case the rogue corrupts what it hands
MPI (its free run's requests, replies or posts, or the event loop's messages in virtual time)
and rank 0 prints the one line it stops with::

    CASE name: ErrorClass: message        (or "CASE name: no error")

then both ranks meet at a barrier and go on with the next case. The rogue speaks the run's own
protocol (the engine's own round-0 record, the free run's own sends, a snapshot's row) with its bytes
altered on the way to MPI, so the cases hold whatever the honest side checks.

``mpi_rogue_async.py [CASE ...]``: the cases to run (default: all of :data:`CASES`).
"""

from __future__ import annotations

import faulthandler
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.link import TAG_SPACE  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.core.activation import Activation  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.network import freerun as fr  # noqa: E402
from gossip.problems import make_problem  # noqa: E402

torch.set_num_threads(1)
PROBLEM = make_problem("least-squares", n_nodes=2, dim=6, samples_per_node=8, seed=3,
                       dtype=torch.float64)


def truncated(a: np.ndarray) -> np.ndarray:
    return a[: a.size // 2].copy()


def appended(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, np.zeros(1 << 20, dtype=np.uint8)])


def first_byte(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[0] ^= 0xFF
    return out


def last_nan(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[-8:] = np.frombuffer(np.float64(np.nan).tobytes(), dtype=np.uint8)
    return out


def last_inf(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[-8:] = np.frombuffer(np.float64(np.inf).tobytes(), dtype=np.uint8)
    return out


def garbage(a: np.ndarray) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, a.size, dtype=np.uint8)


CASES = {
    # name: (algorithm, where the rogue's bytes go, corruption)
    "post-truncated": ("gossip-learning", "post", truncated),
    "post-appended-1MiB": ("gossip-learning", "post", appended),
    "post-bad-header": ("gossip-learning", "post", first_byte),
    "post-nan": ("gossip-learning", "post", last_nan),
    "post-sgp-nan-weight": ("async-sgp", "post", last_nan),
    "request-garbage": ("ad-psgd", "request", garbage),
    "reply-inf": ("ad-psgd", "reply", last_inf),
    "request-choco-bad-header": ("async-choco", "request", first_byte),  # a compressor's bytes
    "reply-choco-bad-header": ("async-choco", "reply", first_byte),  # decoded by activate
    "snapshot-row-garbage": ("gossip-learning", "row", garbage),  # a node record's scalars
    "virtual-exchange-nan": ("ad-psgd", "virtual", last_nan),
    "virtual-exchange-bad-header": ("ad-psgd", "virtual", first_byte),
    "virtual-post-inf": ("gossip-learning", "virtual", last_inf),
}


class RogueComm:
    """A communicator that alters the free run's data messages on their way to MPI."""

    def __init__(self, comm, corrupt):
        self.comm, self.corrupt, self.kept = comm, corrupt, []

    def Isend(self, spec, dest, tag):
        arr, kind = spec
        if tag in (fr.REQUEST, fr.REPLY, fr.POST, fr.LOG) and arr.size:
            arr = self.corrupt(np.asarray(arr).reshape(-1).view(np.uint8))
        self.kept.append(arr)  # alive until sent
        return self.comm.Isend([arr, kind], dest=dest, tag=tag)

    def __getattr__(self, name):
        return getattr(self.comm, name)


def rogue_link(link, corrupt) -> None:
    """Alter the event loop's messages (tags below the reductions') on their way to MPI (until
    ``del link.exchange``)."""
    exchange, kept = type(link).exchange.__get__(link), []

    def altered(recvs, sends, tag):
        if tag < TAG_SPACE:
            sends = [(torch.from_numpy(corrupt(buf.numpy())), dst) for buf, dst in sends]
            kept.extend(sends)
        return exchange(recvs, sends, tag)

    link.exchange = altered


def engine_for(world: World, name: str, where: str) -> Engine:
    """A 2-node ring of float64 models, one node per rank; in a free run (0.01 wall s per
    virtual second) the node that must not act first is 1000 times slower."""
    slow = {"post": 0, "request": 0, "reply": 1, "row": 0}.get(where)
    network = f"slow=nodes:{slow}x1000" if slow is not None else None
    x0 = PROBLEM.initial_point()
    return Engine(make_algorithm(name, eta=0.01), topologies.build("ring", 2), lambda i: x0 + i,
                  world=world.configure(timeout=2), network=network,
                  oracles=lambda i, gen: PROBLEM.oracle(i, gen, "full"),
                  free_run=None if where == "virtual" else 0.01)


def honest(world: World, name: str, where: str) -> str:
    engine = engine_for(world, name, where)
    try:
        engine.run(300 if where != "virtual" else 20, log_every=10**6)
    except Exception as exc:  # the line a user's script would print
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def rogue(world: World, name: str, where: str, corrupt) -> None:
    engine = engine_for(world, name, where)
    if where == "virtual":
        link = engine.transport.link
        rogue_link(link, corrupt)
        try:
            engine.run(20, log_every=10**6)
        except Exception:  # rank 0 stopped answering: on to the next case
            pass
        finally:
            del link.exchange
        return
    # what Engine.run does up to the free run's start, then one message of the protocol
    engine.setup()
    engine.record([])
    free = fr.FreeRun(engine, engine.network.model, engine.network.free_run)
    free.comm = RogueComm(free.comm, corrupt)
    world.barrier("the common start of a free run with")
    free._start = time.monotonic()
    if where == "post":
        free.post(1, 0, 0.0, engine.algorithm.message_like(engine.block, 0))
    elif where == "request":
        # the activation's request; no reply comes: routed around after the timeout
        engine.algorithm.activate(engine.block, Activation(free, 1, 0, 0.0, 1, 1, 0))
    elif where == "row":
        free._instants = [(10, 0.0)]  # the snapshot of round 10, its row to rank 0
        free._snapshot()
    else:
        free._serve_for(1.0)  # answers rank 0's request
    deadline = time.monotonic() + 3
    sends = [req for req, *_ in free._sends] + [req for req, _ in free._log_sends]
    while any(not req.Test() for req in sends) and time.monotonic() < deadline:
        time.sleep(1e-3)


def main() -> None:
    world = World.detect(timeout=20)
    names = sys.argv[1:] or list(CASES)
    for case in names:
        name, where, corrupt = CASES[case]
        faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where, not a timeout
        if world.rank == 0:
            print(f"CASE {case}: {honest(world, name, where)}", flush=True)
        else:
            rogue(world, name, where, corrupt)
        world.timeout = 20  # the engine's 2 s deadline is the run's; the cases' ends differ more
        world.barrier("the end of a case with")
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
