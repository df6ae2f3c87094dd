"""The transport moves a phase's message rows between node ids; it knows no math.

The engine posts each message phase of a block of nodes with :meth:`Transport.start_rows` and
ends it with :meth:`Transport.finish_rows`.
Receivers hosted by the same process read the sender's row in place; messages that cross a
process boundary go over the world's :class:`~gossip.comm.link.Link` (MPI or
torch.distributed), sent from the rows' own memory and received into their staging rows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from gossip.comm.link import TAG_SPACE, Link
from gossip.errors import CommConfigError


def check_timeout(value: float) -> float:
    """``value`` as seconds of a deadline: a positive finite number, else CommConfigError."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise CommConfigError(
            f"timeout must be a positive number of seconds, got {value!r}: it is how long a rank "
            "waits for a neighbor before stopping the run (e.g. --timeout 120)"
        )
    return seconds


def check_latency(value: float) -> float:
    """``value`` as seconds of a simulated link delay: finite and >= 0, else CommConfigError."""
    if not (isinstance(value, int | float) and 0 <= value < math.inf):
        raise CommConfigError(f"link_latency must be a number of seconds >= 0, got {value!r} "
                              "(e.g. --link-latency 0.005 for 5 ms)")
    return float(value)


@dataclass(eq=False, slots=True)
class Pending:
    """A phase in flight: posted by :meth:`Transport.start_rows`, ended by ``finish_rows``."""

    rows: Any
    plan: Any
    round: int
    posted: float | None  # when it was posted (None: the phase moved no message)
    handles: list | None = None  # the link's, when messages cross processes
    staged: bool = False  # CUDA rows travel through pinned host twins
    host_recv: torch.Tensor | None = None
    wire: Wire | None = None  # how its messages cross processes


@dataclass(eq=False)
class Wire:
    """What a phase's messages between processes need that depends only on its plan and its
    buffers, made once and reused while they come back (every round of a static graph): the
    link's prepared buffers, and the peers, texts and sizes its wait reads."""

    plan: Any  # plan and buffers held: their ids are the key
    own: torch.Tensor
    recv: torch.Tensor
    prepared: Any
    peers: list[tuple[str, int]]
    what: list[str]
    sizes: list[int]
    nbytes: int  # of each message


@dataclass(eq=False, slots=True)
class Repeat:
    """A phase that goes out again as it went (:meth:`Transport.repeat`): the :class:`Wire`
    of its messages between processes (None: all its receivers are local) and what each of
    its senders hands over, ``(node, nbytes × out-degree)``."""

    wire: Wire | None
    counts: list[tuple[int, int]]


class Transport:
    """Delivers the phases of a block of nodes.

    ``placement[i]`` is the rank hosting node ``i``; ``rank`` is this process's rank; ``link``
    carries the messages to other processes (None: every node is in this process).
    """

    def __init__(self, placement: list[int], rank: int = 0, link: Link | None = None,
                 timeout: float = 120.0):
        self.placement = placement
        self.rank = rank
        self.world_size = 1 if link is None else link.size
        self.link = link
        self.timeout = check_timeout(timeout)
        self.bytes_sent: dict[int, int] = {}  # per sending node, counted at hand-over
        self.latency = 0.0  # seconds a simulated link delays every phase (0: none)
        self._host: dict[str, torch.Tensor] = {}
        self._wires: dict[tuple, Wire] = {}
        self._last_wire: Wire | None = None

    def is_local(self, node: int) -> bool:
        return self.placement[node] == self.rank

    def start_rows(self, rows, plan, seq: int, round_: int) -> Pending:
        """Post one phase of a block of nodes (:mod:`gossip.core.block`) and return at once:
        ``rows.own`` are the block's messages (row r sent by node ``plan.senders[r]``); the
        messages of remote senders land in ``rows.recv`` at their staging rows
        (``plan.remote_in``; a plan without lost messages fills every row) by
        :meth:`finish_rows`, and the rows must stay untouched until then. Local receivers
        read the senders' rows.

        Each row counts ``nbytes`` times its out-degree for its sender, at hand-over."""
        nbytes, sent = rows.nbytes, self.bytes_sent
        moved = False
        for i, degree in zip(plan.senders, plan.out_degree):
            sent[i] = sent.get(i, 0) + nbytes * degree
            moved = moved or degree > 0
        pending = Pending(rows, plan, round_, time.perf_counter() if moved else None)
        if not (plan.remote_in or plan.remote_out):
            return pending
        own, recv = rows.own, rows.recv
        pending.staged = not own.is_cpu and not self.link.moves_cuda
        if pending.staged:  # through pinned host twins of the rows
            host_own, pending.host_recv = self._host_rows("own", own), self._host_rows("recv", recv)
            if plan.remote_out:
                host_own.copy_(own)
        else:
            host_own, pending.host_recv = own, recv
        pending.wire = self._wire(plan, host_own, pending.host_recv, nbytes)
        pending.handles = self.link.post(pending.wire.prepared, seq % TAG_SPACE)
        return pending

    def _wire(self, plan, own: torch.Tensor, recv: torch.Tensor, nbytes: int) -> Wire:
        """The phase's :class:`Wire` for these buffers (made the first time)."""
        wire = self._last_wire  # a static graph's phase: the same objects as the last one
        if (wire is not None and wire.plan is plan and wire.own is own and wire.recv is recv
                and wire.nbytes == nbytes):
            return wire
        key = (id(plan), id(own), id(recv), nbytes)  # the same tensor objects every round
        wire = self._wires.get(key)
        if wire is not None and wire.plan is plan and wire.own is own and wire.recv is recv:
            self._last_wire = wire
            return wire
        if len(self._wires) > 64:  # a graph or a loss pattern that changes every round
            self._wires.clear()
            self._last_wire = None
        own_rows = len(plan.senders)  # staging row s is recv[s - own_rows]
        where = self.placement
        recvs = [(recv[s - own_rows, :nbytes], where[j]) for j, _, s in plan.remote_in]
        sends = [(own[r, :nbytes], where[j]) for r, j in plan.remote_out]
        head = f"round {{round}}: rank {self.rank} waited {{timeout}} for "
        wire = self._wires[key] = Wire(
            plan, own, recv, self.link.prepare(recvs, sends),
            peers=[self._peer(j) for j, _, _ in plan.remote_in]
            + [self._peer(j) for _, j in plan.remote_out],
            what=[head + "a message from"] * len(recvs) + [head + "a send to"] * len(sends),
            sizes=[nbytes] * len(recvs), nbytes=nbytes)
        self._last_wire = wire
        return wire

    def repeat(self, rows, plan) -> Repeat | None:
        """The phase ``rows`` just posted on ``plan`` as a :class:`Repeat`, when it can go out
        again as it is: CPU rows (no staging), no simulated latency, and its messages between
        processes (if any) on the wire its :meth:`start_rows` used. None otherwise."""
        if self.latency or not rows.own.is_cpu:
            return None
        wire = None
        if plan.remote_in or plan.remote_out:
            wire = self._last_wire
            if (wire is None or wire.plan is not plan or wire.own is not rows.own
                    or wire.recv is not rows.recv or wire.nbytes != rows.nbytes):
                return None
        nbytes = rows.nbytes
        return Repeat(wire, [(i, nbytes * degree) for i, degree
                             in zip(plan.senders, plan.out_degree) if degree])

    def repeat_holds(self, again: Repeat) -> bool:
        """Whether ``again`` (from :meth:`repeat`) may still be posted by :meth:`post_again`:
        its wire is still the last one made or found, and still no simulated latency."""
        return (again.wire is None or again.wire is self._last_wire) and not self.latency

    def post_again(self, again: Repeat, seq: int) -> list | None:
        """:meth:`start_rows` of a phase that came back (:meth:`repeat`): the senders' bytes
        counted from its totals, its messages between processes posted from the wire's
        prepared buffers; returns the link's handles for :meth:`finish_again`."""
        sent = self.bytes_sent
        for i, nbytes in again.counts:
            sent[i] = sent.get(i, 0) + nbytes
        wire = again.wire
        return None if wire is None else self.link.post(wire.prepared, seq % TAG_SPACE)

    def finish_again(self, again: Repeat, handles: list | None, round_: int) -> None:
        """:meth:`finish_rows` of a phase posted by :meth:`post_again`."""
        if handles is not None:
            wire = again.wire
            self.link.wait(handles, timeout=self.timeout, round=round_, sizes=wire.sizes,
                           peers=wire.peers, what=wire.what)

    def finish_rows(self, pending: Pending) -> None:
        """Wait for a phase posted by :meth:`start_rows` (no earlier than :attr:`latency`
        seconds after it was posted, when a link delay is simulated): its receives and sends
        at once, a timeout naming the silent peers (those of the receives first)."""
        if self.latency and pending.posted is not None:
            left = pending.posted + self.latency - time.perf_counter()
            if left > 0:
                time.sleep(left)
        if pending.handles is None:
            return
        wire = pending.wire
        self.link.wait(pending.handles, timeout=self.timeout, round=pending.round,
                       sizes=wire.sizes, peers=wire.peers, what=wire.what)
        if pending.staged and pending.plan.remote_in:
            pending.rows.recv.copy_(pending.host_recv)

    def progress(self) -> None:
        """Let the messages in flight move while the caller computes (:meth:`Link.progress`)."""
        if self.link is not None:
            self.link.progress()

    def _peer(self, node: int) -> tuple[str, int]:
        return f"node {node} (rank {self.placement[node]})", self.placement[node]

    def _host_rows(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        """A pinned host twin of CUDA message rows (reused while the shape holds)."""
        host = self._host.get(key)
        if host is None or host.shape != rows.shape:
            host = self._host[key] = torch.empty(rows.shape, dtype=torch.uint8, pin_memory=True)
        return host

    def close(self) -> None:
        """Release communication resources."""
