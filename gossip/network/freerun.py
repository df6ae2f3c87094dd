"""Free-running asynchronous runs under MPI: wall-clock order, one node per rank
(docs/asynchronous.md, "Free-running under mpiexec").

The event loop (:mod:`gossip.network.events`) runs an asynchronous algorithm in virtual time,
the same on every rank. Here nothing is shared: each rank runs its node on its own, and the
order of events is whatever the wall clock makes it. A node's k-th local step lasts
``compute_s(i, k) × scale`` wall seconds (the same ``--network`` draws, so stragglers and their
virtual times are the event loop's), during which the node keeps answering its neighbors (the
communication thread of AD-PSGD's design). Then it activates: the algorithm's
:meth:`~gossip.algorithms.Algorithm.activate`, whose ``exchange()`` sends a request to the peer
and waits for the reply its ``receive`` makes; ``post()`` sends a message the receiver takes in
when it next polls.

Deadlock-free: a node waiting for a reply keeps serving every request that reaches it, so two
nodes that ask each other at once both get answered (each takes in the other's message twice:
the non-atomic averaging of real asynchronous systems). Ending: a node that has taken its steps
tells its neighbors (DONE) and goes on serving until every neighbor has told it the same. A
neighbor that does not answer within the timeout is routed around: left out of the node's
peers from then on, and named in the log. The run's end record, after all ranks are done, has
the usual metrics plus ``local_steps``, ``wall_s`` and ``routed_around``.

Trajectories (``log_every``): nobody waits for the others during the run, so no record can be
a collective then. Instead every rank snapshots its own node at the common wall instants
``t_k = k · log_every · sweep_s`` (since a barrier at the start; ``sweep_s`` is the wall time of
one mean compute time, so instant k falls where the event loop logs sweep ``k · log_every``):
the model (kept until the end), its local steps, bits sent and the ``node_metrics`` a node can
compute alone. The scalars travel to rank 0 at once, one buffer per snapshot, and rank 0
hands each ``node`` record to the log as it gets it (in the order they arrive: each node's in
its order, the nodes' interleaved as the wall clock made them); after the run every rank puts
its snapshot models back in turn so that the usual collective metrics give one ``round`` record
per instant (consensus error, distance of the average, ...) — the network as it was at t_k,
computed after the fact with nothing waited for during the run. A rank that stops answering
loses only what it had not sent: the other ranks' node records and its own up to the stop are
in the log before the collectives (which then stop with a timeout naming it), and so they are
when a rank is killed and the launcher ends the job with it.

Checks: everything a rank receives is checked before it is read, as in a synchronous round.
A request, reply or post travels as :func:`~gossip.network.events.frame` makes it (each
floating part with the wire header), and :func:`~gossip.network.events.unframe` refuses a
message of the wrong size, a bad header or NaN/Inf values; a control message or a snapshot row
of the wrong size, or a row for another node, is refused too. The run then stops with one line
naming the sender's node and rank and what was wrong (a truncated message used to end in an
internal error, a NaN in a merged model and a misleading "diverged").

Step-size schedules: the event loop sets ``block.round`` (what schedules and the trainer's
optimizers read) to the sweep an event falls in; a free run sets it to the sweep of the wall
clock, ``first_round + ⌊now / sweep_s⌋ + 1`` (at most the budget's last), before every
activation and every message it takes in. A schedule thus follows the run's common time, as in
virtual time, not a node's own count of steps: a straggler decays with the others instead of
keeping a large step while its model is averaged into theirs, and a free run and its virtual
twin step with the same rates at the same (scaled) times.

Loss and delay (``loss=``, ``delay=``): a node draws the fate of each message it sends from
the keyed draws of the event loop (arc node → peer, counted per arc from 1: the sender is the
only one who sends on its out-arcs, so it alone keeps the count, wherever the run's events
fall). A lost post is not sent (``post()`` returns False, as in the event loop). A delivered
post with a delay d is handed to MPI ``d × scale`` wall seconds after it is made (an outbox the
node empties while it polls; the receiver takes it in at its next poll), its bytes counted when
made; the posts still due after the run's end are dropped, as they would arrive after it. An
exchange's two messages are drawn apart, as in the event loop, and each end acts on what it
heard: a lost request is not sent, and the initiator, which drew the loss, hears nothing and
goes on at once; a lost reply is replaced by an empty LOST notice, so the initiator hears
nothing and goes on, while the peer took the request in. The draw stands for the acknowledgement
a real protocol gets (or the timeout it waits out: skipped here, because the event loop's
exchange takes no virtual time whatever its fates), and it keeps both ends in agreement on
``acked`` — what async-choco's per-arc copies need to stay equal. ``delay=`` on an
exchange algorithm is refused, as in the event loop. The end record gains ``messages`` and
``messages_lost_total`` (summed over the nodes).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gossip.core.activation import Activation, Message, answer_request
from gossip.core.algorithm import Algorithm
from gossip.errors import CommError, ConfigError
from gossip.network.clock import sleep_serving
from gossip.network.frames import activated, frame, merged, parts_nbytes, unframe
from gossip.network.host import Host
from gossip.network.spec import Network
from gossip.network.timing import KeyedDraws, Timing
from gossip.problems.oracles import ORACLE_FIELDS

log = logging.getLogger(__name__)

_BASE = 3 << 20  # above the rounds' and the reductions' tags
REQUEST, REPLY, POST, DONE = _BASE, _BASE + 1, _BASE + 2, _BASE + 3
LOG, LOG_END, WRITTEN = _BASE + 4, _BASE + 5, _BASE + 6
"""A snapshot's scalars to rank 0; a rank's last row sent; rank 0 has written the node records."""
LOST = _BASE + 7
"""In place of a reply the network lost: the initiator learns at once that it hears nothing
(module doc, "Loss and delay")."""

NodeMetric = Callable[[int, torch.Tensor], Mapping[str, float]]
"""``metric(node, x) -> {name: value}``: what one node computes from its own model alone (its
distance to a known x*, its local loss); the same names at every call and on every rank."""

NODE_FIELDS = ("node", "round", "wall_s", "local_steps", "bits_sent")
"""The leading fields of a node record (then the node metrics' values), in the order of the
float64 row a rank sends rank 0."""


@dataclass
class Snapshot:
    """One node's state at the wall instant ``instant_s`` of round ``round``, taken at
    ``wall_s`` (the first poll after the instant; both since the common start)."""

    round: int
    instant_s: float
    wall_s: float
    steps: int
    nbytes: int
    left: int
    x: torch.Tensor


def check_models(algorithm: Algorithm, network: Network, scale: float) -> None:
    """Refuse, in one line, a free run of ``algorithm`` on ``network`` that cannot be made: a
    ``scale`` that is not positive, or a timing model the kind of run does not take (an
    asynchronous free run: ``compute=``/``slow=``, ``loss=`` and, for posts, ``delay=``;
    synchronous rounds in wall-clock time, :class:`gossip.network.clock.WallRounds`:
    ``compute=``/``slow=`` and ``loss=``, whose lost messages nobody waits for)."""
    alg, net = algorithm, network
    if not scale > 0 or scale != scale:
        raise ConfigError(f"--free-run {scale!r}: give the wall seconds per virtual second (> 0)")
    if alg.asynchronous and (net.churn is not None or net.late):
        raise ConfigError("--free-run: churn= and stale= are modeled in virtual time only; a free "
                          "run takes compute=/slow=, loss= and delay= (drop the others, or run "
                          "without --free-run)")
    if alg.asynchronous and alg.contact == "exchange" and net.delay is not None:
        raise ConfigError(f"--free-run: {alg.name}'s pairwise exchanges take no virtual time, so "
                          "delay= has nothing to delay (as in the event loop); model slow links "
                          "with compute=, or use a method that posts messages (gossip-learning, "
                          "async-sgp)")
    if not alg.asynchronous and net.delay is not None:
        raise ConfigError(f"--free-run: {alg.name} runs in rounds, whose wall-clock pacing sleeps "
                          "the compute=/slow= draws; delay= stays in virtual time "
                          "(time_virtual_s): drop it, or run without --free-run")


def check_host(host: Host) -> None:
    """Refuse, in one line, a free run on anything but mpiexec with one node per rank."""
    link = host.transport.link
    if link is None or not hasattr(link, "comm") or len(host.local_ids) != 1:
        raise ConfigError("--free-run needs mpiexec with one node per rank (an MPI world of n "
                          f"processes for n nodes); this run has {host.world.size} process(es) for "
                          f"{host.n} nodes")


class FreeRun:
    """One rank's node, run free (module doc). ``scale``: wall seconds per virtual second of
    compute time; ``timeout``: seconds a neighbor may stay silent before it is routed around."""

    def __init__(self, host: Host, network: Network, scale: float = 0.01,
                 timeout: float | None = None):
        check_models(host.algorithm, network, scale)
        check_host(host)
        if not host.algorithm.asynchronous:
            raise ConfigError(f"FreeRun runs asynchronous algorithms; {host.algorithm.name} "
                              "runs in rounds, paced by gossip.network.clock.WallRounds")
        link, net = host.transport.link, network
        from mpi4py import MPI

        self.MPI, self.comm = MPI, link.comm.Dup()  # its own traffic, apart from the reductions
        self.host, self.algorithm, self.block = host, host.algorithm, host.block
        self.node = host.local_ids[0]
        self.timing = Timing(net, host.seed, host.n)
        self.partner_draws = KeyedDraws(host.seed, "async.partner", None).value
        self.scale = scale
        self.timeout = host.transport.timeout if timeout is None else timeout
        view = host.topology.view(self.node)
        self.peers = sorted(set(view.out_neighbors) | set(view.in_neighbors))
        self.rank_of = host.transport.placement
        self.left: list[int] = []
        self.done_from: set[int] = set()
        self.steps = 0
        self.seq = 0
        self._sends: list[tuple[Any, torch.Tensor, int]] = []  # (request, buffer, receiver)
        self.sent_on: dict[int, int] = {}
        """Messages this node sent (or had lost) on each out-arc, by receiver: the counter of
        the arc's keyed loss and delay draws."""
        self.lost_on: dict[int, int] = {}
        """Of those, the ones the network lost."""
        self.dropped_in_flight = 0
        """Delayed posts still on their way at the end (not handed over: they would arrive
        after the run)."""
        self._posts = itertools.count()  # the outbox's order among equal due times
        self._outbox: list[tuple[float, int, torch.Tensor, int]] = []  # delayed posts: (due, seq,
        # buffer, receiver), a heap
        self._start = time.monotonic()
        step = net.compute.mean if net.compute is not None else 1.0
        self.sweep_s = step * scale
        """Wall seconds of one sweep: a mean compute time, scaled."""
        self.first_round = host.round
        self.last_round: int | None = None
        """The budget's last sweep (``seconds / sweep_s``, rounded up); None: a steps budget."""
        self.snapshot_round: int | None = None
        """The round of the instant being snapshotted, while the node metrics are called (what
        a metric that keeps values per instant keys them by)."""
        # trajectories (run's log_every; module doc)
        self.snapshots: list[Snapshot] = []
        self.node_metrics: list[NodeMetric] = []
        self.metric_names: list[str] = []
        self._instants: list[tuple[int, float]] = []  # (round, wall instant) not yet taken
        self._log_sends: list[tuple[Any, np.ndarray]] = []
        self.log_ended: set[int] = set()  # rank 0: the ranks that sent all their rows
        self.on_record: Callable[[dict[str, Any]], None] | None = None
        """Rank 0: where the node records go as the rows come (the run's ``on_record``)."""

    # -- what an activation calls (the event loop's interface) --------------------------------
    def exchange(self, event: Activation, parts: tuple[torch.Tensor, ...]) -> Message | None:
        i, j = event.node, event.peer
        if self._lost(j):  # the request is not sent: j hears nothing, nor does this end
            return Message(j, i, 0, None, event.time, event.time, event.seq, acked=False)
        self._count(parts_nbytes(parts))
        host = frame(parts, self._where())
        request = self.comm.Isend([host.numpy(), self.MPI.BYTE], dest=self.rank_of[j], tag=REQUEST)
        self._sends.append((request, host, j))
        reply = self._serve_until(reply_from=j)
        if reply is None:  # j stopped answering: it is routed around, nothing heard
            return None
        where = self._where(j)
        heard = self._device(unframe(reply, parts, where, j, i)) if reply.numel() else None
        event.heard_from = (where, j)  # empty: j's reply was lost (LOST)
        now = self._now()
        return Message(j, i, 0, heard, now, now, event.seq, acked=True)

    def post(self, i: int, j: int, time_s: float, parts: tuple[torch.Tensor, ...]) -> bool:
        if self._lost(j):
            return False
        host = frame(parts, self._where())
        self._count(parts_nbytes(parts))
        delay = self.timing.delay_s(i, j, self.sent_on[j]) * self.scale
        if delay > 0:  # handed over when it is due (_flush), the receiver takes it in then
            heapq.heappush(self._outbox, (time.monotonic() + delay, next(self._posts), host, j))
        else:
            self._send_post(host, j)
        return True

    def _send_post(self, host: torch.Tensor, j: int) -> None:
        self._sends.append((self.comm.Isend([host.numpy(), self.MPI.BYTE], dest=self.rank_of[j],
                                            tag=POST), host, j))

    def _lost(self, j: int) -> bool:
        """Draw the fate of this node's next message to j (the keyed loss draw of arc
        node → j at its count, as in the event loop); count it."""
        k = self.sent_on[j] = self.sent_on.get(j, 0) + 1
        lost = self.timing.lost(self.node, j, k)
        if lost:
            self.lost_on[j] = self.lost_on.get(j, 0) + 1
        return lost

    def _flush(self, until: float | None = None) -> None:
        """Hand over the delayed posts due by now (``until``: by then, sleeping for them, and
        drop the rest: they would arrive after the run)."""
        box = self._outbox
        if until is not None:
            while box and box[0][0] <= until:
                sleep_serving(box[0][0] - time.monotonic(), self._serve_one)
            self.dropped_in_flight = len(box)
            box.clear()
            return
        now = time.monotonic()
        while box and box[0][0] <= now:
            _, _, host, j = heapq.heappop(box)
            if j not in self.left:
                self._send_post(host, j)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, steps: int | None = None, seconds: float | None = None,
            metrics: list[Any] = (), *, log_every: int | None = None,
            node_metrics: list[NodeMetric] = (),
            on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Take local steps (activations) until ``steps`` of them or until ``seconds`` of wall
        time (whichever comes first), serving the neighbors throughout; then end with them
        (module doc) and return the run's record with ``metrics`` (collective). With stragglers a time budget
        is the fair one: every node stops at the same instant, as in the event loop.

        ``log_every`` (sweeps; needs ``seconds``): snapshot the node at the wall instants of
        rounds ``log_every``, ``2 · log_every``, ... before the budget's end; ``on_record``
        then gets, on rank 0 during the run, the ``node`` records (``NODE_FIELDS`` and
        ``node_metrics``' values) as the rows come, and after it, before the end record, on
        every rank the ``round`` record of each instant (``metrics`` on the snapshots; module
        doc)."""
        try:
            return self._run(steps, seconds, metrics, log_every, node_metrics, on_record)
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Leave nothing pending in MPI when the run stops with an error (a refused message, a
        silent neighbor, an interrupt): this rank's sends still in flight are cancelled and its
        communicator freed, so the process can end (MPI_Finalize would wait for them)."""
        pending = [req for req, *_ in self._sends] + [req for req, _ in self._log_sends]
        for req in pending:
            if not req.Test():
                req.Cancel()
        deadline = time.monotonic() + 1.0
        while pending and time.monotonic() < deadline:
            pending = [req for req in pending if not req.Test()]
            time.sleep(1e-4)
        self._sends, self._log_sends = [], []
        if self.comm != self.MPI.COMM_NULL:  # not freed yet by a run that got to its end
            self.comm.Free()

    def _run(self, steps: int | None, seconds: float | None, metrics: list[Any],
             log_every: int | None, node_metrics: list[NodeMetric],
             on_record: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        if steps is None and seconds is None:
            raise ConfigError("a free run needs a number of steps or a time budget")
        if log_every is not None and (seconds is None or log_every < 1):
            raise ConfigError(f"a free run's snapshots (log_every={log_every!r}) are taken at "
                              "common wall instants before the end of a time budget: give "
                              "seconds and log_every >= 1")
        self.node_metrics = list(node_metrics)
        self.on_record = on_record
        x = self.block.x[0]
        self.metric_names = [name for m in self.node_metrics for name in m(self.node, x)]
        self.host.world.barrier("the common start of a free run with")
        self._start = time.monotonic()
        if log_every is not None and seconds is not None:
            every = log_every * self.sweep_s
            count = max(math.ceil(seconds / every - 1e-9) - 1, 0)  # instants before the end
            self._instants = [(self.first_round + k * log_every, k * every)
                              for k in range(count, 0, -1)]  # popped from the end
        if seconds is not None:
            self.last_round = self.first_round + max(math.ceil(seconds / self.sweep_s - 1e-9), 1)
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
            self._set_sweep()
            event = Activation(self, i, 0, self._now(), k, self.seq, j)  # type: ignore[arg-type]
            activated(self.algorithm, self.block, event)
        # the delayed posts due before the end go out; the later ones would arrive after it
        self._flush(until=end if seconds is not None else max([d for d, *_ in self._outbox],
                                                                 default=0.0))
        done = torch.zeros(1, dtype=torch.uint8)
        for j in self.peers:
            if j not in self.left:
                self._sends.append((self.comm.Isend([done.numpy(), self.MPI.BYTE],
                                                    dest=self.rank_of[j], tag=DONE), done, j))
        self._serve_until(all_done=True)
        self._snapshot(final=True)  # a steps budget spent before the last instants: the end state
        deadline = time.monotonic() + self.timeout
        for req, _, j in self._sends:  # the neighbors still there received them all
            if j in self.left:
                req.Cancel()
            while not req.Test() and j not in self.left:
                if time.monotonic() > deadline:
                    self._route_around(j)
                time.sleep(1e-5)
        self._gather_log()
        self.comm.Free()
        for rec in self.snapshot_records(metrics):
            if on_record is not None:
                on_record(rec)
        return self._record(metrics)

    def _now(self) -> float:
        return time.monotonic() - self._start

    def _where(self, sender: int | None = None) -> str:
        """How an error names this node at this instant (and the ``sender`` of a message it
        refuses)."""
        head = f"free run at {self._now():.3f} s: node {self.node} (rank {self.rank_of[self.node]})"
        if sender is None:
            return head
        return f"{head} refused the message from node {sender} (rank {self.rank_of[sender]})"

    def _device(self, parts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Received parts (host tensors) on the model's device."""
        device = self.block.x.device
        return parts if device.type == "cpu" else tuple(p.to(device) for p in parts)

    def _set_sweep(self) -> None:
        """``block.round`` (and the node's ``round``) to the sweep of the wall clock, what
        step-size schedules read (module doc, "Step-size schedules")."""
        t = self.first_round + int(self._now() // self.sweep_s) + 1
        if self.last_round is not None:
            t = min(t, self.last_round)
        self.block.round = t  # (each node's round reads the block's)

    def _peer(self, k: int) -> int | None:
        alive = [j for j in self.host.topology.view(self.node).out_neighbors if j not in self.left]
        if not alive:
            return None
        if self.algorithm.peer == "next":
            return alive[(k - 1) % len(alive)]
        return alive[min(int(self.partner_draws(self.node, k) * len(alive)), len(alive) - 1)]

    def _count(self, nbytes: int) -> None:
        sent = self.host.transport.bytes_sent
        sent[self.node] = sent.get(self.node, 0) + nbytes

    def _serve_for(self, seconds: float) -> None:
        """Compute for ``seconds`` of wall time, answering whoever asks meanwhile."""
        sleep_serving(seconds, self._serve_one)

    def _serve_until(self, reply_from: int | None = None,
                     all_done: bool = False) -> torch.Tensor | None:
        """Serve requests until ``reply_from``'s reply arrives (returned; None when it stays
        silent past the timeout and is routed around) or, with ``all_done``, until every
        neighbor still there has said DONE."""
        deadline = time.monotonic() + self.timeout
        while True:
            got = self._serve_one(reply_from)
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

    def _serve_one(self, reply_from: int | None = None) -> torch.Tensor | None:
        """Handle one message waiting for this rank, if any; a reply from ``reply_from`` is
        returned instead (its bytes, checked by the caller). What arrives is checked before
        anything reads it: the size of every message (:meth:`_check_size`), and the wire
        header and values of a request or a post (:func:`~gossip.network.events.unframe`, as a
        synchronous round checks a message); a bad one stops the run naming its sender."""
        if self._instants and time.monotonic() - self._start >= self._instants[-1][1]:
            self._snapshot()
        if self._outbox and self._outbox[0][0] <= time.monotonic():
            self._flush()
        if len(self._sends) > 64:  # drop the sends that have completed
            self._sends = [s for s in self._sends if not s[0].Test()]
        MPI, status = self.MPI, self.MPI.Status()
        if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            return None
        src_rank, tag, count = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
        j = self.rank_of.index(src_rank)
        buf = torch.empty(count, dtype=torch.uint8)
        self.comm.Recv([buf.numpy(), MPI.BYTE], source=src_rank, tag=tag)
        self._check_size(buf, tag, j)
        if tag == LOG:  # rank 0 takes every rank's rows, routed around or not
            row = buf.numpy().view(np.float64).copy()
            if row[0] != j or not np.isfinite(row[:len(NODE_FIELDS)]).all():
                raise CommError(f"{self._where()}: node {j} (rank {src_rank}) sent a snapshot row "
                                f"whose fields {NODE_FIELDS} are {row[:len(NODE_FIELDS)].tolist()}: "
                                "not its own node's, or not finite (a faulty rank)",
                                rank=self.comm.Get_rank())
            self._take_row(row)
            return None
        if tag == LOG_END:
            self.log_ended.add(src_rank)
            return None
        if j in self.left:
            return None  # it was routed around: what it sends now is dropped
        if tag in (REPLY, LOST):
            if j != reply_from:
                return None
            return buf if tag == REPLY else buf[:0]
        if tag == DONE:
            self.done_from.add(j)
        elif tag == REQUEST:
            self._set_sweep()
            self._answer(j, buf)
        elif tag == POST:
            self._set_sweep()
            like = self.algorithm.message_like(self.block, 0)
            where = self._where(j)
            parts = self._device(unframe(buf, like, where, j, self.node))
            now = self._now()
            msg = Message(j, self.node, 0, parts, now, now)
            merged(lambda: self.algorithm.receive(self.block, msg), where, j, self.node)
        return None

    _SIZES = {DONE: 1, LOG_END: 1, LOST: 0}
    """Bytes of the control messages (the others' sizes depend on the run)."""

    def _check_size(self, buf: torch.Tensor, tag: int, j: int) -> None:
        """Refuse a control message or a snapshot row whose size is not the one this rank's
        settings give (the data messages' sizes are checked with their header, by
        :func:`~gossip.network.events.unframe`), or a message of no kind of the run."""
        if tag in (REQUEST, REPLY, POST):
            return
        size = (8 * (len(NODE_FIELDS) + len(self.metric_names)) if tag == LOG
                else self._SIZES.get(tag))
        if size is None or buf.numel() != size:
            what = (f"a message of {buf.numel()} bytes, expected {size}" if size is not None else
                    f"a message of no kind a free run sends (tag {tag})")
            raise CommError(f"{self._where()}: node {j} (rank {self.rank_of[j]}) sent {what} (the "
                            "ranks run different settings? start every rank with the same flags "
                            "and files)", rank=self.comm.Get_rank())

    def _answer(self, j: int, request: torch.Tensor) -> None:
        """j asked for an exchange: ``receive`` its request, whose reply goes back to j (or,
        when the network loses the reply, an empty LOST notice)."""
        self.seq += 1
        acked = not self._lost(j)
        where = self._where(j)
        like = self.algorithm.message_like(self.block, 0)
        heard = self._device(unframe(request, like, where, j, self.node))

        def answer(reply: tuple[torch.Tensor, ...]) -> bool:
            host = frame(reply, self._where()) if acked else torch.zeros(0, dtype=torch.uint8)
            self._sends.append((self.comm.Isend([host.numpy(), self.MPI.BYTE],
                                                dest=self.rank_of[j], tag=REPLY if acked else LOST),
                                host, j))
            if acked:
                self._count(parts_nbytes(reply))
            return acked

        now = self._now()
        msg = Message(j, self.node, 0, heard, now, now, self.seq, answer=answer)
        merged(lambda: answer_request(self.algorithm, self.block, msg), where, j, self.node)

    # -- trajectories (module doc) -------------------------------------------------------------
    def _snapshot(self, final: bool = False) -> None:
        """Snapshot the node at every instant now due (``final``: at all those left); the row
        of scalars goes to rank 0 at once, the model stays here for the round records."""
        now = self._now()
        while self._instants and (final or now >= self._instants[-1][1]):
            rnd, instant = self._instants.pop()
            x = self.block.x[0]
            self.snapshot_round = rnd
            values = [float(v) for m in self.node_metrics for v in m(self.node, x).values()]
            self.snapshot_round = None
            if len(values) != len(self.metric_names):
                raise ConfigError(f"the node metrics gave {len(values)} value(s) at round {rnd}, "
                                  f"{len(self.metric_names)} at the start ({self.metric_names}): "
                                  "a node metric returns the same names at every call")
            nbytes = self.host.transport.bytes_sent.get(self.node, 0)
            self.snapshots.append(Snapshot(rnd, instant, now, self.steps, nbytes, len(self.left),
                                           x.clone()))
            row = np.array([self.node, rnd, now, self.steps, 8 * nbytes, *values], dtype=np.float64)
            if self.comm.Get_rank() == 0:
                self._take_row(row)
            else:
                self._log_sends.append((self.comm.Isend([row, self.MPI.BYTE], dest=0, tag=LOG),
                                        row))

    def _take_row(self, row: np.ndarray) -> None:
        """Rank 0: hand a snapshot row's node record (its own or one another rank sent) to the
        run's ``on_record`` at once: the log has it even if the job then ends abruptly (a rank
        killed, and the launcher with it the others)."""
        if self.on_record is not None:
            self.on_record(self._node_record(row))

    def _gather_log(self) -> None:
        """Rank 0 waits (serving) until every rank has sent all its rows or the timeout
        passes (handing each node record on as it comes, :meth:`_take_row`) and tells the
        ranks that answered; the others wait for that, so no rank enters the collectives
        (which stop the job when a rank is silent) before the node records are written."""
        MPI, rank, size = self.MPI, self.comm.Get_rank(), self.comm.Get_size()
        deadline = time.monotonic() + self.timeout
        if rank == 0:
            others = set(range(1, size))
            while self.log_ended != others and time.monotonic() < deadline:
                self._serve_one()
                time.sleep(1e-5)
            if self.log_ended != others:
                log.warning("rank(s) %s did not send the end of their node records within %g s: "
                            "the records they sent before are kept", sorted(others - self.log_ended),
                            self.timeout)
            flag = np.zeros(1, dtype=np.uint8)
            sends = [self.comm.Isend([flag, MPI.BYTE], dest=r, tag=WRITTEN)
                     for r in sorted(self.log_ended)]
            MPI.Request.Waitall(sends)  # the ranks that sent LOG_END are waiting for it
            return
        flag = np.zeros(1, dtype=np.uint8)
        self._log_sends.append((self.comm.Isend([flag, MPI.BYTE], dest=0, tag=LOG_END), flag))
        deadline += self.timeout  # rank 0 may wait a whole timeout for another rank
        heard = np.empty(1, dtype=np.uint8)
        written = self.comm.Irecv([heard, MPI.BYTE], source=0, tag=WRITTEN)
        while not written.Test():
            if time.monotonic() > deadline:
                written.Cancel()
                for req, _ in self._log_sends:
                    req.Cancel()
                log.warning("node %d (rank %d): rank 0 did not confirm its node records within "
                            "%g s", self.node, rank, 2 * self.timeout)
                return
            self._serve_one()
            time.sleep(1e-5)

    def _node_record(self, row: np.ndarray) -> dict[str, Any]:
        """The ``node`` record of a snapshot row."""
        names = [*NODE_FIELDS, *self.metric_names]
        if len(row) != len(names):
            raise ConfigError(f"a node record of {len(row)} values where this rank's node "
                              f"metrics make {len(names)} ({names}): every rank must be given "
                              "the same node metrics")
        rec: dict[str, Any] = {"type": "node"}
        rec.update(zip(names, row.tolist()))
        for key in ("node", "round", "local_steps"):
            rec[key] = int(rec[key])
        return rec

    def snapshot_records(self, metrics: list[Any]) -> list[dict[str, Any]]:
        """One ``round`` record per instant (collective): each rank puts its snapshot's model
        and bytes in place of the node's, the usual record is computed, then the end state is
        put back. ``wall_s`` is the instant, ``snapshot_lag_s`` how long after it the last node
        took its snapshot; the engine's ``round`` is the instant's while its record is made."""
        host, block, sent = self.host, self.block, self.host.transport.bytes_sent
        here = block.x.clone()
        nbytes = sent.get(self.node, 0)
        offset = host.elapsed_s() - self._now()  # the run's time at the start
        out = []
        end_round = host.round
        try:
            for snap in self.snapshots:
                block.x[0].copy_(snap.x)
                sent[self.node] = snap.nbytes
                host.round = snap.round  # what metrics read (a trainer's epoch)
                rec = host.record(metrics)
                for field in ORACLE_FIELDS.values():  # the counters are now's, not the snapshot's
                    rec.pop(field, None)
                steps = host.node_values({self.node: float(snap.steps)})
                taken = host.node_values({self.node: snap.wall_s})
                left = host.node_values({self.node: float(snap.left)})
                rec.update(round=snap.round, local_steps=int(steps.sum()), wall_s=snap.instant_s,
                           snapshot_lag_s=float(taken.max()) - snap.instant_s,
                           routed_around=int(left.sum()), time_s=offset + snap.instant_s)
                out.append(rec)
        finally:
            block.x.copy_(here)
            sent[self.node] = nbytes
            host.round = end_round
        return out

    def _route_around(self, j: int) -> None:
        if j not in self.left:
            self.left.append(j)
            log.warning("node %d (rank %d) did not answer node %d within %g s: routed around it",
                        j, self.rank_of[j], self.node, self.timeout)

    def _record(self, metrics: list[Any]) -> dict[str, Any]:
        host = self.host
        rec = host.record(metrics)
        steps = host.node_values({self.node: float(self.steps)})
        left = host.node_values({self.node: float(len(self.left))})
        sent = host.node_values({self.node: float(sum(self.sent_on.values()))})
        lost = host.node_values({self.node: float(sum(self.lost_on.values()))})
        rec.update(local_steps=int(steps.sum()), wall_s=self._now(),
                   routed_around=int(left.sum()), messages=int(sent.sum()),
                   messages_lost_total=int(lost.sum()))
        return rec
