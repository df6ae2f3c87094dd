"""Asynchronous runs: node activations and messages in virtual time (docs/asynchronous.md).

An asynchronous algorithm (:attr:`~gossip.algorithms.Algorithm.asynchronous`) has no rounds.
Every node has a clock; each time it rings the engine draws the node's peer (the algorithm's
:attr:`~gossip.algorithms.Algorithm.peer` rule) and calls the algorithm's
:meth:`~gossip.algorithms.Algorithm.activate` with an :class:`~gossip.core.activation.Activation`. The activation talks
to its peer the one way the algorithm's :attr:`~gossip.algorithms.Algorithm.contact` says:

* ``"post"``: :meth:`Activation.post`, a one-way message that arrives after the arc's delay as
  a call of :meth:`~gossip.algorithms.Algorithm.receive`;
* ``"exchange"``: :meth:`Activation.exchange`, the same message taken in at once, atomically:
  the peer's :meth:`~gossip.algorithms.Algorithm.receive` replies
  (:meth:`~gossip.core.activation.Message.reply`) and the activation gets the reply back. The
  two messages' fates are drawn apart; each end acts on what it heard.

The event queue is a binary heap of ``(time, seq, ...)`` entries (``seq``: the order they were
pushed, the nodes' first activations in node order), so events at the same virtual time run in
a fixed order and a run is reproducible to the bit for its seed. Why a heap and not simpy:
every event here is atomic (an activation does its work and schedules the next; a message is
one arrival), so simpy's processes would add a generator switch per event and nothing the
algorithms use; the heap keeps the whole state in one list.

Every draw is keyed: node i's k-th clock interval by (seed, ``"async.clock"``, i, k), its k-th
choice of peer by (seed, ``"async.partner"``, i, k); compute times, delays, losses and churn by
:class:`gossip.network.timing.Timing`. Nothing in the trace depends on the models' values, so **every
process computes the whole trace**: under ``mpiexec`` each rank walks the same events in the
same order, works on the ends it hosts, and sends an exchange's request to the peer's rank,
which replies (or sends a post to the receiver's rank) through buffer-based point-to-point messages. A rank only
ever waits for an event earlier in the one global order than any it has not finished, so the
protocol cannot deadlock; a peer that stops answering ends the wait with a timeout naming its
rank. The same seed gives the same trace and the same numbers in process and under MPI.

A *sweep* is n activations (one per node on average): the engine's ``round`` counts sweeps, so
``--rounds``, ``--log-every`` and the records work as for synchronous runs; records gain
``time_virtual_s`` (the virtual time of the last event), ``activations`` and ``messages``.

**Checkpoints** (:meth:`EventLoop.state_dict`, :meth:`EventLoop.node_state`) save the queue as
it stands between two sweeps, not a position to replay to: the heap's entries (each wake's node,
each message's arc, send time and tag, with its ``seq``), the counters (``now``, activations,
messages, losses, rejoins, the next ``seq``), each node's clock rings ``k`` and last ring, and
the count of messages on each arc. Every draw is keyed by those counters (a node's k-th interval
and peer, an arc's k-th fate and delay, churn by time), so they are the keyed draws' positions,
and :class:`~gossip.network.timing.Timing` keeps only caches of pure functions. The payloads in flight
are the one thing the trace cannot recompute (they are model values): each is saved with the
node it is addressed to (its process holds it: every transfer to another rank is complete
after a sweep, :meth:`EventLoop._reap`), as is the point a fresh node restarts from. Replaying
the trace to the checkpoint's event instead would cost every event so far at each resume and
still need the payloads, so the queue is saved as it is; it is small (n wakes and the messages
in flight). The algorithms' own state (AD-PSGD's stale gradients, SGP's ``s`` and ``w``,
async-choco's per-arc copies) is in ``block.state`` / ``block.arc_state`` and is saved with the
nodes as for rounds; an exchange ends within its event, so nothing of it is in flight between
sweeps.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from gossip.comm.link import TAG_SPACE
from gossip.core.activation import CLOCKS, CONTACTS, PEERS, Activation, Message, answer_request
from gossip.errors import ConfigError, ContractError
from gossip.network.frames import activated, frame, framed_nbytes, merged, parts_nbytes, unframe
from gossip.network.host import Host
from gossip.network.spec import Network
from gossip.network.timing import FIRST, KeyedDraws, Timing

_WAKE, _ARRIVE = 0, 1
_LOW = 0xFFFFFFFF  # an arc key's receiver bits

IDLE_EVENTS = 1_000_000
"""Events in a row without an activation after which :meth:`EventLoop.run` stops: every clock
that rang was an away node's (churn), so the run would spin in virtual time and make no
progress. Rate churn that leaves a node present too rarely is refused before (spec.py,
``MIN_PRESENT``); this bounds whatever else could."""
MAX_CHURN_CYCLES = 100_000
"""Rate churn's leave-and-back cycles per node over a run's virtual time above which the run is
refused (:meth:`EventLoop.check_horizon`): the draws alone would take minutes, and a node that
flips that often per step is not a model of anything."""


class EventLoop:
    """The virtual-time event queue of an asynchronous run (module doc)."""

    def __init__(self, host: Host, network: Network):
        algorithm = host.algorithm
        for attr, allowed in (("clock", CLOCKS), ("contact", CONTACTS), ("peer", PEERS)):
            if getattr(algorithm, attr) not in allowed:
                raise ConfigError(f"{algorithm.name}.{attr} = {getattr(algorithm, attr)!r} is not "
                                  f"one of {', '.join(allowed)}")
        if algorithm.contact == "exchange" and network.delay is not None:
            raise ConfigError(
                f"--network delay=: {algorithm.name}'s pairwise exchanges are atomic events in "
                "virtual time, so no message of theirs travels for a while; model slow links "
                "with compute= (an exchange happens when its activation ends), or use a method "
                "that posts messages (gossip-learning, async-sgp)")
        self.network = network
        self.algorithm = algorithm
        self.block = host.block
        self.transport = host.transport
        self.n = host.n
        self.timing = Timing(network, host.seed, host.n)
        topo = host.topology
        lists = getattr(topo, "out_neighbor_lists", None)  # (all at once: no view per node)
        self.out_neighbors = lists() if lists is not None else \
            [topo.view(i).out_neighbors for i in range(self.n)]
        self.row_of = {i: r for r, i in enumerate(self.block.ids)}
        self._rows_are_ids = self.block.ids == list(range(self.n))  # one process: row i is node i
        self._steady = network.churn is None  # every node present at all times
        self._lossless = network.loss is None
        # a few draws a node per sweep: chunks of FIRST keep 10^6 nodes' caches small
        self._clocks = KeyedDraws(host.seed, "async.clock", None, chunk=FIRST)
        self._partners = KeyedDraws(host.seed, "async.partner", None, chunk=FIRST)
        self.clock_draws = self._clocks.value
        self.partner_draws = self._partners.value
        self.now = 0.0
        self.activations = 0
        self.messages = 0
        self.messages_lost = 0
        self.trace: list[tuple] | None = None
        """Set to a list to record the run's events as tuples: ``("wake", t, i)``,
        ``("exchange", t, i, j, j_heard, i_heard)``, ``("post", t, i, j, arrival)``,
        ``("lost", t, i, j)``, ``("arrive", t, i, j)`` (tests replay them in matrix form;
        every process records the whole trace)."""
        self._counts: dict[int, int] = {}  # messages on each arc (key i << 32 | j) so far
        self._k = [0] * self.n  # clock rings per node so far
        self._last = [0.0] * self.n  # the time of each node's last ring
        self._x0 = self.block.x.clone() if self.timing.fresh else None  # what a fresh node restarts from
        self.rejoins = 0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._sends: list[tuple[Any, torch.Tensor, int]] = []  # posts sent to other ranks
        self._recvs: list[_Incoming] = []  # posts from other ranks, receives posted
        self._restored: dict[int, tuple[torch.Tensor, ...]] = {}  # a checkpoint's payloads by seq
        self._batching = bool(getattr(algorithm, "batch_exchanges", False)) and \
            algorithm.contact == "exchange"
        self._pending: list[tuple[int, int, bool, bool]] = []  # exchanges not applied yet
        self._busy: set[int] = set()  # the rows they touch
        self._pair_nbytes = parts_nbytes(algorithm.message_like(self.block, 0)) \
            if self._batching and self.block.m else 0  # sized alike for every row
        nodes = range(self.n)  # every process draws the whole trace: every node's first draws at once
        if algorithm.clock == "poisson":
            self._clocks.prefill(nodes, 1)
        if algorithm.peer == "random":
            self._partners.prefill(nodes, 1)
        for i in range(self.n):
            self._schedule(i, 0.0)

    # -- the queue ---------------------------------------------------------------------------
    def _push(self, time: float, kind: int, item: Any) -> None:
        heapq.heappush(self._heap, (time, self._seq, kind, item))
        self._seq += 1

    def _schedule(self, i: int, now: float) -> None:
        """Node i's next clock ring after ``now``."""
        k = self._k[i] + 1
        dt = self.timing.compute_s(i, k)
        if self.algorithm.clock == "poisson":
            dt *= -math.log1p(-self.clock_draws(i, k))
        self._push(now + dt, _WAKE, i)

    def present(self, i: int, time: float) -> bool:
        """Whether node i is in the network at ``time`` (churn; always without it)."""
        return self._steady or self.timing.present(i, time)

    def local(self, i: int) -> bool:
        return self._rows_are_ids or self.transport.is_local(i)

    def _peer_of(self, i: int, k: int, time: float) -> int | None:
        out = self.out_neighbors[i]
        if self.algorithm.peer == "next":
            j = out[(k - 1) % len(out)] if out else None
            return j if j is not None and self.present(j, time) else None
        peers = out if self._steady else [j for j in out if self.present(j, time)]
        if not peers:
            return None
        return peers[min(int(self.partner_draws(i, k) * len(peers)), len(peers) - 1)]

    def _delivered(self, src: int, dst: int, time: float) -> tuple[bool, int]:
        """The fate of the next message on arc src → dst (the same on every process): whether
        it is delivered (not lost, dst present) and its count on the arc."""
        arc = src << 32 | dst  # (an int key: no tuple made, a cheaper hash)
        k = self._counts.get(arc, 0) + 1
        self._counts[arc] = k
        self.messages += 1
        ok = (self._lossless or not self.timing.lost(src, dst, k)) and self.present(dst, time)
        if not ok:
            self.messages_lost += 1
        return ok, k

    def _count(self, src: int, nbytes: int) -> None:
        sent = self.transport.bytes_sent
        sent[src] = sent.get(src, 0) + nbytes

    # -- contacts ------------------------------------------------------------------------------
    def exchange(self, event: Activation, parts: tuple[torch.Tensor, ...]) -> Message:
        """The exchange of ``event`` (its node i local) with its peer j: the fates of both
        messages, ``parts`` to j, whose ``receive`` replies (in process, or j's rank takes its
        part in :meth:`_answer`), and the reply, as i hears it."""
        i, j, time, seq = event.node, event.peer, event.time, event.seq
        tag, j_heard, i_heard = self._exchange_fates(i, j, time)
        if j_heard:
            self._count(i, parts_nbytes(parts))
        row = self.row_of[i]
        if self.local(j):  # each end hears the other's message as it was sent
            replies: list[tuple[torch.Tensor, ...]] = []

            def answer(reply: tuple[torch.Tensor, ...]) -> bool:
                if i_heard:
                    self._count(j, parts_nbytes(reply))
                replies.append(tuple(p.clone() for p in reply))
                return i_heard

            sent = tuple(p.clone() for p in parts) if j_heard else None
            request = Message(i, j, self.row_of[j], sent, time, time, seq, answer=answer)
            answer_request(self.algorithm, self.block, request)
            return Message(j, i, row, replies[0] if i_heard else None, time, time, seq,
                           acked=j_heard)
        buf = frame(parts, self._where(time, i)) if j_heard else None
        got = self._swap(buf, framed_nbytes(parts), j, i_heard, tag, time)
        where = self._where(time, i, j)
        heard = unframe(got, parts, where, j, i) if i_heard else None
        if heard is not None:
            heard = tuple(p.to(self.block.x.device) for p in heard)
        event.heard_from = (where, j)
        return Message(j, i, row, heard, time, time, seq, acked=j_heard)

    def _exchange_fates(self, i: int, j: int, time: float) -> tuple[int, bool, bool]:
        """The tag of the exchange of i (initiator) with j and its messages' fates (the same
        on every process): whether j hears i's, whether i hears j's."""
        tag = self.messages % TAG_SPACE
        j_heard, _ = self._delivered(i, j, time)
        i_heard, _ = self._delivered(j, i, time)
        if self.trace is not None:
            self.trace.append(("exchange", time, i, j, j_heard, i_heard))
        return tag, j_heard, i_heard

    def _answer(self, i: int, j: int, time: float, seq: int) -> None:
        """On every process but remote i's, at i's exchange with j: the fates, and where j is
        local its part: receive i's request (sized by ``message_like``), let ``receive``
        reply, and send the reply to i's rank."""
        tag, j_heard, i_heard = self._exchange_fates(i, j, time)
        if not self.local(j):
            return
        alg, block, r = self.algorithm, self.block, self.row_of[j]
        where = self._where(time, j, i)
        heard = None
        if j_heard:
            like = alg.message_like(block, r)
            got = self._swap(None, framed_nbytes(like), i, True, tag, time)
            heard = tuple(p.to(block.x.device) for p in unframe(got, like, where, i, j))

        def answer(reply: tuple[torch.Tensor, ...]) -> bool:
            if i_heard:
                self._count(j, parts_nbytes(reply))
                self._swap(frame(reply, self._where(time, j)), 0, i, False, tag, time)
            return i_heard

        request = Message(i, j, r, heard, time, time, seq, answer=answer)
        merged(lambda: answer_request(self.algorithm, self.block, request), where, i, j)

    def _where(self, time: float, node: int, sender: int | None = None) -> str:
        """How an error about a message names it: the virtual time and ``node`` with its rank
        (and the ``sender`` with its, for a message ``node`` received)."""
        rank = self.transport.placement
        head = f"virtual time {time:.6g}: node {node} (rank {rank[node]})"
        return head if sender is None else f"{head} refused the message from node {sender} (rank {rank[sender]})"

    def _swap(self, buf: torch.Tensor | None, size: int, peer: int, recv: bool, tag: int,
              time: float) -> torch.Tensor:
        """Send ``buf`` (a host :func:`frame`; None: nothing) to ``peer``'s rank and receive
        its message (``size`` bytes, when ``recv``)."""
        rank = self.transport.placement[peer]
        out = torch.empty(size, dtype=torch.uint8)
        link = self.transport.link
        handles = link.exchange([(out, rank)] if recv else [],
                                [(buf, rank)] if buf is not None else [], tag)
        label = (f"node {peer} (rank {rank})", rank)
        link.wait(handles, timeout=self.transport.timeout, peers=[label] * len(handles),
                  sizes=[size] * int(recv),
                  what=f"virtual time {time:.6g}: rank {self.transport.rank} waited {{timeout}} "
                       "in a pairwise exchange with")
        return out

    def post(self, i: int, j: int, time: float, parts: tuple[torch.Tensor, ...]) -> bool:
        """The post of i (local) to j: its fate, and the parts on their way."""
        ok, arrive, tag = self._post_fate(i, j, time)
        if not ok:
            return False
        self._count(i, parts_nbytes(parts))
        if self.local(j):
            payload: Any = tuple(p.clone() for p in parts)
        else:  # on its way to j's rank now; j's rank receives it at the arrival
            host = frame(parts, self._where(time, i))
            rank = self.transport.placement[j]
            self._sends.append((self.transport.link.exchange([], [(host, rank)], tag), host, j))
            payload = None
        self._push(arrive, _ARRIVE, (i, j, time, payload, tag))
        return True

    def _post_fate(self, i: int, j: int, time: float) -> tuple[bool, float, int]:
        tag = self.messages % TAG_SPACE
        ok, k = self._delivered(i, j, time)
        if not ok:
            if self.trace is not None:
                self.trace.append(("lost", time, i, j))
            return False, math.inf, tag
        arrive = time + self.timing.delay_s(i, j, k)
        if self.trace is not None:
            self.trace.append(("post", time, i, j, arrive))
        return True, arrive, tag

    def _expect(self, i: int, j: int, tag: int) -> _Incoming | None:
        """On j's rank, at the post of remote i to j: the receive of the message, posted now
        (its send is posted by i's rank at the same event, so the two always match)."""
        if not self.local(j):
            return None
        like = self.algorithm.message_like(self.block, self.row_of[j])
        size = framed_nbytes(like)
        rank = self.transport.placement[i]
        incoming = _Incoming(torch.empty(size, dtype=torch.uint8), like, rank, i, j)
        incoming.handles = self.transport.link.exchange([(incoming.host, rank)], [], tag)
        self._recvs.append(incoming)
        return incoming

    def _arrive(self, item: tuple, time: float) -> None:
        i, j, sent, payload, tag = item
        if isinstance(payload, _Incoming):
            self._finish(payload)
            payload = tuple(p.to(self.block.x.device) for p in payload.parts)
        if not self.present(j, time):
            self.messages_lost += 1
            return
        if self.trace is not None:
            self.trace.append(("arrive", time, i, j))
        if self.local(j):
            msg = Message(i, j, self.row_of[j], payload, sent, time)
            if self.local(i):
                self.algorithm.receive(self.block, msg)
            else:
                merged(lambda: self.algorithm.receive(self.block, msg), self._where(time, j, i), i, j)

    def _finish(self, incoming: _Incoming) -> None:
        """Wait for a message from another rank (at its arrival, or at the end of a run) and
        check it (:func:`unframe`)."""
        if incoming.handles is None:
            return
        rank = incoming.rank
        self.transport.link.wait(
            incoming.handles, timeout=self.transport.timeout,
            peers=[(f"node {incoming.src} (rank {rank})", rank)], sizes=[incoming.host.numel()],
            what=f"virtual time {self.now:.6g}: rank {self.transport.rank} waited {{timeout}} for "
                 "a message from")
        incoming.handles = None
        incoming.parts = unframe(incoming.host, incoming.like,
                                 self._where(self.now, incoming.dst, incoming.src),
                                 incoming.src, incoming.dst)

    # -- running -----------------------------------------------------------------------------
    def run(self, activations: int) -> None:
        """Process events until ``activations`` activations have run in all, and the messages
        that arrive at that same instant."""
        heap = self._heap
        self._restored.clear()  # a checkpoint's payloads are in the heap now
        idle, seen, since = 0, self.activations, self.now
        while self.activations < activations or (heap and heap[0][2] == _ARRIVE
                                                 and heap[0][0] <= self.now):
            if not heap:
                raise ConfigError("the asynchronous run has no events left: every node left "
                                  "the network for good (check --network churn=)")
            time, _, kind, item = heapq.heappop(heap)
            self.now = time
            if kind == _ARRIVE:
                self._flush()
                self._arrive(item, time)
            else:
                self._wake(item, time)
            if self.activations != seen:
                idle, seen, since = 0, self.activations, time
            else:
                idle += 1
                if idle > IDLE_EVENTS:
                    self._stalled(since)
        self._flush()
        self._reap()

    def _flush(self) -> None:
        """Apply the pending exchanges (disjoint pairs of local nodes, consecutive in the event
        order) in one call of the algorithm's ``exchange_pairs``: before any other event that
        reads or writes the models, and at the end of :meth:`run`. Disjoint pairs commute, so
        this is the result of the events one by one."""
        if not self._pending:
            return
        rows_i, rows_j, j_heard, i_heard = zip(*self._pending, strict=True)
        self._pending = []
        self._busy.clear()
        dev = self.block.x.device
        self.algorithm.exchange_pairs(
            self.block, torch.tensor(rows_i, device=dev), torch.tensor(rows_j, device=dev),
            torch.tensor(j_heard, device=dev), torch.tensor(i_heard, device=dev))

    def _batch(self, i: int, j: int, time: float) -> None:
        """The exchange of local i with local j, its fates drawn and counted now, its update
        pending with the others' (:meth:`_flush`); the pending ones applied first when i or j
        is among their ends."""
        ri, rj = (i, j) if self._rows_are_ids else (self.row_of[i], self.row_of[j])
        busy = self._busy
        if ri in busy or rj in busy:
            self._flush()
        _, j_heard, i_heard = self._exchange_fates(i, j, time)
        if j_heard:  # i's request; j's reply is sized alike (message_like)
            self._count(i, self._pair_nbytes)
        if i_heard:
            self._count(j, self._pair_nbytes)
        self._pending.append((ri, rj, j_heard, i_heard))
        busy.add(ri)
        busy.add(rj)

    def _stalled(self, since: float) -> NoReturn:
        """Stop a run whose last :data:`IDLE_EVENTS` events activated no node."""
        raise ConfigError(
            f"--network {self.network.spec()}: {IDLE_EVENTS} events in a row (virtual "
            f"time {since:.6g} s to {self.now:.6g} s) activated no node: every clock that rang "
            f"was an away node's, so the run makes no progress; let the nodes be present more "
            f"often (churn= with a smaller rate or mean_away)")

    def _wake(self, i: int, time: float) -> None:
        self._k[i] += 1
        k = self._k[i]
        self._schedule(i, time)
        last, self._last[i] = self._last[i], time
        if not self.present(i, time):
            return
        if self.timing.fresh and self.timing.next_change(i, last) <= time:  # back, fresh
            self._flush()
            row = self.row_of.get(i)
            self.algorithm.rejoin(self.block, i, self._x0[row] if row is not None else None)
            self.rejoins += 1
        self.activations += 1
        if self.trace is not None:
            self.trace.append(("wake", time, i))
        j = self._peer_of(i, k, time)
        alg = self.algorithm
        if self._batching and j is not None and self.local(i) and self.local(j):
            self._batch(i, j, time)
            return
        self._flush()
        if self.local(i):
            event = Activation(self, i, self.row_of[i], time, k, self.activations, j)
            activated(alg, self.block, event)
            if j is not None and not event._done:
                raise ContractError(f"{alg.name}.activate did not {alg.contact} with its peer "
                                    f"(node {i}, activation {k}): every activation with a peer must, "
                                    "so that the peer's process can take its part")
        elif j is not None and alg.contact == "exchange":  # the peer's end, or nobody's here
            self._answer(i, j, time, self.activations)
        elif j is not None:
            ok, arrive, tag = self._post_fate(i, j, time)
            if ok:
                self._push(arrive, _ARRIVE, (i, j, time, self._expect(i, j, tag), tag))

    def _reap(self) -> None:
        """At the end of :meth:`run`: complete every transfer to and from other ranks (each
        send's receive was posted at the same event, so they all complete), keeping the
        received messages for their arrival events."""
        for incoming in self._recvs:
            self._finish(incoming)
        self._recvs = []
        link = self.transport.link
        for handles, _host, j in self._sends:
            rank = self.transport.placement[j]
            link.wait(handles, timeout=self.transport.timeout, peers=[(f"node {j} (rank {rank})", rank)],
                      what=f"virtual time {self.now:.6g}: rank {self.transport.rank} waited "
                           "{timeout} to send to")
        self._sends = []

    def check_horizon(self, sweeps: int) -> None:
        """Refuse a delay no message can outlive: every post would arrive after a run of
        ``sweeps`` sweeps ends (about sweeps × the mean compute time of virtual time); and rate
        churn that would flip each node more than :data:`MAX_CHURN_CYCLES` times by then."""
        net = self.network
        step = net.compute.mean if net.compute is not None else 1.0
        horizon = self.now + sweeps * step
        churn = net.churn
        if churn is not None and churn.schedule is None and churn.rate > 0:
            cycles = horizon / (1.0 / churn.rate + churn.mean_away)
            if cycles > MAX_CHURN_CYCLES:
                raise ConfigError(
                    f"--network {net.spec()}: each node would leave and come back about "
                    f"{cycles:.3g} times in the run's {horizon:.3g} s of virtual time ({sweeps} "
                    f"more sweeps of {step:g} s steps), more than {MAX_CHURN_CYCLES:g}: give a "
                    "smaller churn rate or a longer mean_away")
        if net.delay is None or net.delay.low <= 0:
            return
        if net.delay.low >= horizon:
            raise ConfigError(
                f"--network delay={net.delay.spec()}: every message takes at least "
                f"{net.delay.low:g} s, but the run ends at about {horizon:g} s of virtual time "
                f"({sweeps} more sweeps of {step:g} s steps), so none would arrive; shorten the "
                "delay or run more rounds")

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The queue between two sweeps, the same on every process (module doc): everything but
        the payloads in flight (:meth:`node_state`). Plain lists and numbers (``weights_only``)."""
        heap = []
        for time, seq, kind, item in self._heap:
            if kind == _WAKE:
                heap.append([time, seq, kind, item])
            else:
                i, j, sent, _payload, tag = item
                heap.append([time, seq, kind, [i, j, sent, tag]])
        return {"now": self.now, "activations": self.activations, "messages": self.messages,
                "messages_lost": self.messages_lost, "rejoins": self.rejoins, "seq": self._seq,
                "k": list(self._k), "last": list(self._last),
                "counts": [[arc >> 32, arc & _LOW, c] for arc, c in sorted(self._counts.items())],
                "heap": heap}

    def node_state(self, i: int) -> dict[str, Any]:
        """Local node i's part of the queue: the payloads of the messages in flight to it (by
        their ``seq``) and, when a node comes back fresh, the point it restarts from."""
        inbox = {}
        for _time, seq, kind, item in self._heap:
            if kind == _ARRIVE and item[1] == i:
                payload = item[3]
                if isinstance(payload, _Incoming):  # received at the last sweep's end (_reap)
                    payload = payload.parts
                if payload is not None:
                    inbox[seq] = [p.clone() for p in payload]
        out: dict[str, Any] = {"inbox": inbox}
        if self._x0 is not None:
            out["x0"] = self._x0[self.row_of[i]].clone()
        return out

    def load_state_dict(self, state: dict[str, Any], nodes: dict[int, dict[str, Any]]) -> None:
        """Restore :meth:`state_dict` and the local ``nodes``' :meth:`node_state` (called once
        per node as a checkpoint is read: the payloads gathered so far are kept)."""
        if self._sends or self._recvs:
            raise ConfigError("an asynchronous run's checkpoint is loaded between sweeps, not "
                              "while messages to other ranks are in transfer")
        restored = self._restored
        dev = self.block.x.device
        for i, blob in nodes.items():
            restored.update({int(seq): tuple(p.to(dev) for p in parts)
                             for seq, parts in blob["inbox"].items()})
            if self._x0 is not None and "x0" in blob:
                self._x0[self.row_of[i]].copy_(blob["x0"])
        self.now = float(state["now"])
        self.activations = int(state["activations"])
        self.messages = int(state["messages"])
        self.messages_lost = int(state["messages_lost"])
        self.rejoins = int(state["rejoins"])
        self._seq = int(state["seq"])
        self._k = [int(k) for k in state["k"]]
        self._last = [float(t) for t in state["last"]]
        self._counts = {int(i) << 32 | int(j): int(c) for i, j, c in state["counts"]}
        heap = []
        for time, seq, kind, item in state["heap"]:
            if kind == _WAKE:
                heap.append((float(time), int(seq), _WAKE, int(item)))
            else:
                i, j, sent, tag = item
                payload = restored.get(int(seq)) if self.local(int(j)) else None
                heap.append((float(time), int(seq), _ARRIVE,
                             (int(i), int(j), float(sent), payload, int(tag))))
        self._heap = heap  # the saved list keeps its heap order

    def log_fields(self) -> dict[str, Any]:
        """What a record of an asynchronous run adds."""
        fields = {"time_virtual_s": self.now, "activations": self.activations,
                  "messages": self.messages, "messages_lost_total": self.messages_lost}
        if self.timing.fresh:
            fields["rejoins"] = self.rejoins
        return fields


@dataclass
class _Incoming:
    """A post from node ``src`` on another rank to node ``dst``: its receive buffer (framed,
    :func:`frame`), tensors like its parts, and once received and checked the parts."""

    host: torch.Tensor
    like: tuple[torch.Tensor, ...]
    rank: int
    src: int
    dst: int
    handles: Any = None
    parts: tuple[torch.Tensor, ...] | None = None
