"""Free-running asynchronous runs under MPI: wall-clock order, one node per rank
(docs/asynchronous.md, "Free-running under mpiexec").

The event loop (:mod:`gossip.engine.events`) runs an asynchronous algorithm in virtual time,
the same on every rank. Here nothing is shared: each rank runs its node on its own, and the
order of events is whatever the wall clock makes it. A node's k-th local step lasts
``compute_s(i, k) × scale`` wall seconds (the same ``--network`` draws, so stragglers and their
virtual times are the event loop's), during which the node keeps answering its neighbors (the
communication thread of AD-PSGD's design). Then it activates: the algorithm's
:meth:`~gossip.algorithms.Algorithm.activate`, whose ``meet()`` sends a request carrying this
end's offer to the peer and waits for the reply carrying the peer's; ``post()`` sends a message
the receiver takes in when it next polls.

Deadlock-free: a node waiting for a reply keeps serving every request that reaches it, so two
nodes that ask each other at once both get answered (each merges the other's offer twice: the
non-atomic averaging of real asynchronous systems). Ending: a node that has taken its steps
tells its neighbors (DONE) and goes on serving until every neighbor has told it the same. A
neighbor that does not answer within the timeout is routed around: left out of the node's
peers from then on, and named in the log. The run's one record, after all ranks are done, has
the usual metrics plus ``local_steps``, ``wall_s`` and ``left`` (the nodes routed around).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from gossip.engine.events import Activation, Message, Side, _flat, _nbytes, _split
from gossip.errors import ConfigError
from gossip.timing import KeyedDraws, Timing

if TYPE_CHECKING:
    from gossip.engine.engine import Engine

log = logging.getLogger(__name__)

_BASE = 3 << 20  # above the rounds' and the reductions' tags
REQUEST, REPLY, POST, DONE = _BASE, _BASE + 1, _BASE + 2, _BASE + 3


def check(engine: Engine, scale: float) -> None:
    """Refuse, in one line, a free run this engine cannot make (module doc)."""
    alg, world = engine.algorithm, engine.world
    if not alg.asynchronous:
        raise ConfigError(f"--free-run runs asynchronous algorithms; {alg.name} runs in rounds")
    link = engine.transport.link
    if link is None or not hasattr(link, "comm") or len(engine.local_ids) != 1:
        raise ConfigError("--free-run needs mpiexec with one node per rank (an MPI world of n "
                          f"processes for n nodes); this run has {world.size} process(es) for "
                          f"{engine.n} nodes")
    net = engine.network
    if net.lossy or net.delay is not None or net.churn is not None:
        raise ConfigError("--free-run: loss=, delay= and churn= are modeled in virtual time; a free "
                          "run takes its delays from the machine and its compute times from "
                          "compute=/slow= (drop the others, or run without --free-run)")
    if not scale > 0 or scale != scale:
        raise ConfigError(f"--free-run {scale!r}: give the wall seconds per virtual second (> 0)")


class FreeRun:
    """One rank's node, run free (module doc). ``scale``: wall seconds per virtual second of
    compute time; ``timeout``: seconds a neighbor may stay silent before it is routed around."""

    def __init__(self, engine: Engine, scale: float = 0.01, timeout: float | None = None):
        check(engine, scale)
        link, net = engine.transport.link, engine.network
        from mpi4py import MPI

        self.MPI, self.comm = MPI, link.comm.Dup()  # its own traffic, apart from the reductions
        self.engine, self.algorithm, self.block = engine, engine.algorithm, engine.block
        self.node = engine.local_ids[0]
        self.timing = Timing(net, engine.seed, engine.n)
        self.partner_draws = KeyedDraws(engine.seed, "async.partner", None).value
        self.scale = scale
        self.timeout = engine.transport.timeout if timeout is None else timeout
        view = engine.topology.view(self.node)
        self.peers = sorted(set(view.out_neighbors) | set(view.in_neighbors))
        self.rank_of = engine.transport.placement
        self.left: list[int] = []
        self.done_from: set[int] = set()
        self.steps = 0
        self.seq = 0
        self._sends: list[tuple[Any, torch.Tensor, int]] = []  # (request, buffer, receiver)
        self._start = time.monotonic()

    # -- what an activation calls (the event loop's interface) --------------------------------
    def exchange(self, i: int, j: int, time_s: float, seq: int) -> Side | None:
        side = Side(i, 0, j, True, time_s, seq)
        side.heard = side.was_heard = True
        parts = self.algorithm.offer(self.block, side)
        self._count(_nbytes(parts))
        buf, _ = _flat(parts)
        host = buf.cpu().clone()
        request = self.comm.Isend([host.numpy(), self.MPI.BYTE], dest=self.rank_of[j], tag=REQUEST)
        self._sends.append((request, host, j))
        reply = self._serve_until(reply_from=j, size=buf.numel())
        if reply is None:  # j stopped answering: it is routed around, nothing merged
            return None
        self.algorithm.merge(self.block, side, _split(reply.to(buf.device), parts))
        return side

    def post(self, i: int, j: int, time_s: float, parts: tuple[torch.Tensor, ...]) -> bool:
        buf, _ = _flat(parts)
        host = buf.cpu().clone()
        self._sends.append((self.comm.Isend([host.numpy(), self.MPI.BYTE], dest=self.rank_of[j],
                                            tag=POST), host, j))
        self._count(host.numel())
        return True

    # -- the loop ------------------------------------------------------------------------------
    def run(self, steps: int | None = None, seconds: float | None = None,
            metrics: list[Any] = ()) -> dict[str, Any]:
        """Take local steps (activations) until ``steps`` of them or until ``seconds`` of wall
        time (whichever comes first), serving the neighbors throughout; then end with them
        (module doc) and return the run's record with ``metrics`` (collective). With stragglers a time budget
        is the fair one: every node stops at the same instant, as in the event loop."""
        if steps is None and seconds is None:
            raise ConfigError("a free run needs a number of steps or a time budget")
        i, k = self.node, 0
        end = self._start + seconds if seconds is not None else float("inf")
        while (steps is None or k < steps) and time.monotonic() < end:
            k += 1
            self._serve_for(self.timing.compute_s(i, k) * self.scale)
            if time.monotonic() >= end:  # the budget ran out while it computed
                break
            j = self._peer(k)
            self.seq += 1
            self.steps += 1
            event = Activation(self, i, 0, self._now(), k, self.seq, j)  # type: ignore[arg-type]
            self.algorithm.activate(self.block, event)
        done = torch.zeros(1, dtype=torch.uint8)
        for j in self.peers:
            if j not in self.left:
                self._sends.append((self.comm.Isend([done.numpy(), self.MPI.BYTE],
                                                    dest=self.rank_of[j], tag=DONE), done, j))
        self._serve_until(all_done=True)
        deadline = time.monotonic() + self.timeout
        for req, _, j in self._sends:  # the neighbors still there received them all
            if j in self.left:
                req.Cancel()
            while not req.Test() and j not in self.left:
                if time.monotonic() > deadline:
                    self._route_around(j)
                time.sleep(1e-5)
        self.comm.Free()
        return self._record(metrics)

    def _now(self) -> float:
        return time.monotonic() - self._start

    def _peer(self, k: int) -> int | None:
        alive = [j for j in self.engine.topology.view(self.node).out_neighbors if j not in self.left]
        if not alive:
            return None
        if self.algorithm.peer == "next":
            return alive[(k - 1) % len(alive)]
        return alive[min(int(self.partner_draws(self.node, k) * len(alive)), len(alive) - 1)]

    def _count(self, nbytes: int) -> None:
        sent = self.engine.transport.bytes_sent
        sent[self.node] = sent.get(self.node, 0) + nbytes

    def _serve_for(self, seconds: float) -> None:
        """Compute for ``seconds`` of wall time, answering whoever asks meanwhile."""
        end = time.monotonic() + seconds
        while True:
            self._serve_one()
            if time.monotonic() >= end:
                return
            time.sleep(min(1e-4, max(end - time.monotonic(), 0.0)))

    def _serve_until(self, reply_from: int | None = None, size: int = 0,
                     all_done: bool = False) -> torch.Tensor | None:
        """Serve requests until ``reply_from``'s reply arrives (returned; None when it stays
        silent past the timeout and is routed around) or, with ``all_done``, until every
        neighbor still there has said DONE."""
        deadline = time.monotonic() + self.timeout
        while True:
            got = self._serve_one(reply_from, size)
            if got is not None:
                return got
            if all_done and all(j in self.done_from or j in self.left for j in self.peers):
                return None
            if time.monotonic() > deadline:
                silent = ([reply_from] if reply_from is not None else
                          [j for j in self.peers if j not in self.done_from and j not in self.left])
                for j in silent:
                    self._route_around(j)
                return None
            time.sleep(1e-5)

    def _serve_one(self, reply_from: int | None = None, size: int = 0) -> torch.Tensor | None:
        """Handle one message waiting for this rank, if any; a reply from ``reply_from`` is
        returned instead."""
        if len(self._sends) > 64:  # drop the sends that have completed
            self._sends = [s for s in self._sends if not s[0].Test()]
        MPI, status = self.MPI, self.MPI.Status()
        if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            return None
        src_rank, tag, count = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
        j = self.rank_of.index(src_rank)
        buf = torch.empty(count, dtype=torch.uint8)
        self.comm.Recv([buf.numpy(), MPI.BYTE], source=src_rank, tag=tag)
        if j in self.left:
            return None  # it was routed around: what it sends now is dropped
        if tag == REPLY:
            return buf if j == reply_from else None
        if tag == DONE:
            self.done_from.add(j)
        elif tag == REQUEST:
            self._answer(j, buf)
        elif tag == POST:
            like = self.algorithm.message_like(self.block, 0)
            parts = _split(buf.to(self.block.x.device), like)
            now = self._now()
            self.algorithm.receive(self.block, Message(j, self.node, 0, parts, now, now))
        return None

    def _answer(self, j: int, request: torch.Tensor) -> None:
        """j asked for an exchange: reply with this end's offer, then merge j's."""
        self.seq += 1
        side = Side(self.node, 0, j, False, self._now(), self.seq)
        side.heard = side.was_heard = True
        parts = self.algorithm.offer(self.block, side)
        buf, _ = _flat(parts)
        host = buf.cpu().clone()
        self._sends.append((self.comm.Isend([host.numpy(), self.MPI.BYTE], dest=self.rank_of[j],
                                            tag=REPLY), host, j))
        self._count(_nbytes(parts))
        self.algorithm.merge(self.block, side, _split(request.to(buf.device), parts))

    def _route_around(self, j: int) -> None:
        if j not in self.left:
            self.left.append(j)
            log.warning("node %d (rank %d) did not answer node %d within %g s: routed around it",
                        j, self.rank_of[j], self.node, self.timeout)

    def _record(self, metrics: list[Any]) -> dict[str, Any]:
        engine = self.engine
        rec = engine.record(metrics)
        steps = engine.node_values({self.node: float(self.steps)})
        left = engine.node_values({self.node: float(len(self.left))})
        rec.update(local_steps=int(steps.sum()), wall_s=self._now(),
                   routed_around=int(left.sum()))
        return rec
