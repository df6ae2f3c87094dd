"""Asynchronous runs: node activations and messages in virtual time (docs/asynchronous.md).

An asynchronous algorithm (:attr:`~gossip.algorithms.Algorithm.asynchronous`) has no rounds.
Every node has a clock; each time it rings the engine calls the algorithm's
:meth:`~gossip.algorithms.Algorithm.activate` with an :class:`Activation` (the node, the virtual
time, its count of activations), and each message a node posts arrives later as a call of
:meth:`~gossip.algorithms.Algorithm.receive`. The event queue is a binary heap of
``(time, seq, ...)`` entries: ``seq`` is the order entries were pushed (the nodes' first
activations in node order), so events at the same virtual time run in a fixed order and a run is
reproducible to the bit for its seed.

Why a heap and not simpy: the events here are atomic (an activation does its work and schedules
the next one; a message is one arrival), so simpy's processes and resources would add a Python
generator switch per event and nothing the algorithms use; ``heapq`` keeps an event at a few
microseconds and the whole state in one list.

Every draw is keyed (:class:`KeyedUniforms`): node i's k-th clock interval by
(seed, ``"async.clock"``, i, k), its k-th choice of partner by (seed, ``"async.partner"``, i, k);
compute times, delays, losses and churn come from :class:`gossip.timing.Timing`. So the event trace is
a pure function of the seed and the graph.

A *sweep* is n activations (one per node on average): the engine's ``round`` counts sweeps, so
``--rounds``, ``--log-every`` and the records work as for synchronous runs; records gain
``time_virtual_s`` (the virtual time of the last event), ``activations`` and ``messages``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gossip.errors import ConfigError
from gossip.rng import Stream
from gossip.timing import Timing

if TYPE_CHECKING:
    from gossip.engine.engine import Engine

CLOCKS = ("compute", "poisson")
"""``compute``: a node rings when its local step ends (intervals ``compute_s(i, k)``);
``poisson``: at the ticks of a Poisson clock whose mean interval is ``compute_s(i, k)``
(intervals ``compute_s(i, k) · E``, E ~ Exp(1)): randomized gossip's clocks."""

_WAKE, _ARRIVE = 0, 1


class KeyedUniforms:
    """Uniforms on [0, 1) keyed by (seed, stream, row, k), one at a time.

    ``u(row, k)`` is word ``k mod B`` of :class:`~gossip.rng.Stream` ``(seed, [row], stream)``
    at round ``k // B`` (B = :attr:`BLOCK`), drawn B at a time per row and cached (the block in
    use per row), so a scalar costs about a microsecond and never depends on call order."""

    BLOCK = 256

    def __init__(self, seed: int, stream: str):
        self.seed = seed
        self.stream = stream
        self._rows: dict[int, tuple[int, np.ndarray, Stream]] = {}

    def __call__(self, row: int, k: int) -> float:
        b, i = divmod(k, self.BLOCK)
        held = self._rows.get(row)
        if held is None or held[0] != b:
            rng = held[2] if held is not None else Stream(self.seed, [row], self.stream)
            rng.begin_round(b)
            held = (b, rng.uniform(self.BLOCK, dtype=torch.float64)[0].numpy(), rng)
            self._rows[row] = held
        return float(held[1][i])


@dataclass
class Message:
    """A posted message: ``parts`` (copies taken at the post) from ``src`` to ``dst`` (its
    block row ``row``), sent at virtual time ``sent_s``, arriving at ``time``."""

    src: int
    dst: int
    row: int
    parts: tuple[torch.Tensor, ...]
    sent_s: float
    time: float


class Activation:
    """One ringing of node ``node``'s clock (block row ``row``) at virtual time ``time``, its
    ``k``-th (k = 1, 2, ...) and the run's ``seq``-th activation: what
    :meth:`Algorithm.activate` reads and acts through (``seq`` keys per-event randomness)."""

    __slots__ = ("node", "row", "time", "k", "seq", "_loop")

    def __init__(self, loop: EventLoop, node: int, row: int, time: float, k: int, seq: int):
        self.node, self.row, self.time, self.k, self.seq, self._loop = node, row, time, k, seq, loop

    def partner(self) -> int | None:
        """A neighbor drawn uniformly among the node's present out-neighbors (the neighbors of
        an undirected graph); None when none is present."""
        loop = self._loop
        peers = [j for j in loop.out_neighbors[self.node] if loop.present(j, self.time)]
        if not peers:
            return None
        u = loop.partner_draws(self.node, self.k)
        return peers[min(int(u * len(peers)), len(peers) - 1)]

    def next_peer(self) -> int | None:
        """The out-neighbors in turn (the k-th activation sends to out-neighbor k mod degree):
        SGP's one-peer schedule; None when that neighbor is away."""
        out = self._loop.out_neighbors[self.node]
        if not out:
            return None
        j = out[(self.k - 1) % len(out)]
        return j if self._loop.present(j, self.time) else None

    def row_of(self, j: int) -> int:
        """Node ``j``'s row in the block."""
        return self._loop.row_of[j]

    def exchange(self, j: int, nbytes: int, reply_nbytes: int) -> tuple[bool, bool]:
        """Count a pairwise exchange with ``j``: ``nbytes`` from this node to j and
        ``reply_nbytes`` back, each a message on its arc that the network may lose. Returns
        (j got this node's message, this node got j's reply)."""
        loop = self._loop
        heard = (loop.transmit(self.node, j, nbytes, self.time),
                 loop.transmit(j, self.node, reply_nbytes, self.time))
        if loop.trace is not None:
            loop.trace.append(("exchange", self.time, self.node, j, *heard))
        return heard

    def post(self, j: int, *parts: torch.Tensor, nbytes: int | None = None) -> bool:
        """Send copies of ``parts`` to ``j``; they arrive after the arc's delay as a
        :meth:`Algorithm.receive` call (unless lost, or j is away then). ``nbytes``: the
        message's size on the wire (default: the parts' bytes). Returns whether it was sent
        into the network without being lost."""
        loop = self._loop
        size = sum(p.numel() * p.element_size() for p in parts) if nbytes is None else nbytes
        k = loop.next_count(self.node, j)
        if not loop.transmit(self.node, j, size, self.time, k):
            if loop.trace is not None:
                loop.trace.append(("lost", self.time, self.node, j))
            return False
        arrive = self.time + loop.timing.delay_s(self.node, j, k)
        msg = Message(self.node, j, loop.row_of[j], tuple(p.clone() for p in parts), self.time,
                      arrive)
        loop.push(arrive, _ARRIVE, msg)
        if loop.trace is not None:
            loop.trace.append(("post", self.time, self.node, j, arrive))
        return True


class EventLoop:
    """The virtual-time event queue of an asynchronous run (module doc)."""

    def __init__(self, engine: Engine):
        algorithm = engine.algorithm
        if algorithm.clock not in CLOCKS:
            raise ConfigError(f"{algorithm.name}.clock = {algorithm.clock!r} is not one of "
                              f"{', '.join(CLOCKS)}")
        self.engine = engine
        self.algorithm = algorithm
        self.block = engine.block
        self.n = engine.n
        self.timing = Timing(engine.network, engine.seed, engine.n)
        topo = engine.topology
        self.out_neighbors = [topo.view(i).out_neighbors for i in range(self.n)]
        self.row_of = {i: r for r, i in enumerate(self.block.ids)}
        self.clock_draws = KeyedUniforms(engine.seed, "async.clock")
        self.partner_draws = KeyedUniforms(engine.seed, "async.partner")
        self.now = 0.0
        self.activations = 0
        self.messages = 0
        self.messages_lost = 0
        self._counts: dict[tuple[int, int], int] = {}  # messages posted per arc so far
        self._k = [0] * self.n  # activations per node so far
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.trace: list[tuple] | None = None
        """Set to a list to record the run's events as tuples: ``("wake", t, i)``,
        ``("exchange", t, i, j, j_heard, i_heard)``, ``("post", t, i, j, arrival)``,
        ``("lost", t, i, j)``, ``("arrive", t, i, j)`` (tests replay them in matrix form)."""
        for i in range(self.n):
            self._schedule(i, 0.0)

    # -- the queue ---------------------------------------------------------------------------
    def push(self, time: float, kind: int, item: Any) -> None:
        heapq.heappush(self._heap, (time, self._seq, kind, item))
        self._seq += 1

    def _schedule(self, i: int, now: float) -> None:
        """Node i's next activation after ``now`` (its clock's next interval)."""
        k = self._k[i] + 1
        dt = self.timing.compute_s(i, k)
        if self.algorithm.clock == "poisson":
            dt *= -math.log1p(-self.clock_draws(i, k))
        self.push(now + dt, _WAKE, i)

    def present(self, i: int, time: float) -> bool:
        """Whether node i is in the network at ``time`` (churn; always without it)."""
        return self.timing.present(i, time)

    def next_count(self, src: int, dst: int) -> int:
        """The count (1, 2, ...) of the next message on arc src → dst."""
        k = self._counts.get((src, dst), 0) + 1
        self._counts[(src, dst)] = k
        return k

    def transmit(self, src: int, dst: int, nbytes: int, time: float, k: int | None = None) -> bool:
        """Count a message of ``nbytes`` on arc src → dst (its ``k``-th; default the next) and
        say whether it is delivered (not lost, and dst present)."""
        if k is None:
            k = self.next_count(src, dst)
        self.messages += 1
        if self.timing.lost(src, dst, k) or not self.present(dst, time):
            self.messages_lost += 1
            return False
        sent = self.engine.transport.bytes_sent
        sent[src] = sent.get(src, 0) + nbytes
        return True

    # -- running -----------------------------------------------------------------------------
    def run(self, activations: int) -> None:
        """Process events until ``activations`` activations have run in all, and the messages
        that arrive at that same instant."""
        algorithm, block, heap = self.algorithm, self.block, self._heap
        while self.activations < activations or (heap and heap[0][2] == _ARRIVE
                                                 and heap[0][0] <= self.now):
            if not heap:
                raise ConfigError("the asynchronous run has no events left: every node left "
                                  "the network for good (check --network churn=)")
            time, _, kind, item = heapq.heappop(heap)
            self.now = time
            if kind == _ARRIVE:
                if self.present(item.dst, time):
                    if self.trace is not None:
                        self.trace.append(("arrive", time, item.src, item.dst))
                    algorithm.receive(block, item)
                else:
                    self.messages_lost += 1
                continue
            i = item
            self._k[i] += 1
            if self.present(i, time):
                self.activations += 1
                if self.trace is not None:
                    self.trace.append(("wake", time, i))
                algorithm.activate(block, Activation(self, i, self.row_of[i], time, self._k[i],
                                                    self.activations))
            self._schedule(i, time)

    def log_fields(self) -> dict[str, Any]:
        """What a record of an asynchronous run adds."""
        return {"time_virtual_s": self.now, "activations": self.activations,
                "messages": self.messages, "messages_lost_total": self.messages_lost}

