"""Late messages of synchronous rounds (``--network stale=LAG``, docs/network.md): a message of round t
moves in round t (both ends post and complete the exchange then; its bits are counted then),
and the engine holds it at the receiver and hands it to the algorithm in round ``t + lag``.

The lag of arc j → i's message of phase k of round t is drawn from (seed, arc, round, phase)
(:class:`gossip.network.LagDraws`), so every process computes the same lags whatever the
placement; only the receiver needs them. Messages on one arc (and phase) never overtake each
other, as on a real link: ``due = max(t + lag, due of the arc's previous message)``
(:func:`fifo_due`).

What the algorithm is handed in round t follows its
:attr:`~gossip.algorithms.Algorithm.on_loss` family:

* ``"renormalize"`` (values averaged in: gossip, dpsgd, deepsqueeze): from each in-neighbor j
  the *newest* message that has arrived so far (this round's, or the last one that came: a stale
  ``x_j``); while nothing has arrived from j yet, j's weight goes to the receiver's own term, as
  for a lost message. Every row still sums to one.
* ``"drop"`` (increments to copies: choco, lead, beer, c-gt, ...) and ``"keep-mass"``
  (push-sum): *every* message that arrives this round, in the order they were sent, each with
  the weight of the round it was sent in (several from one arc when a slow one is followed by
  others); none from an arc where none arrives. So a receiver's copy of a sender is the
  sender's copy as it was some rounds ago and catches up as the increments arrive (eventually
  consistent), and push-sum's mass is conserved counting the mass in flight.

* ``"running-sum"`` (messages that carry running sums and a counter:
  :mod:`gossip.core.running`): *every* message due this round, in the order they were sent,
  and the arc's messages are *not* kept in order (``due = t + lag``: a late message may be
  handed over after a newer one, as on a network that reorders). The receiver keeps, per
  in-arc, the running sum of the newest message by counter and ignores an older one: a later
  running sum already carries everything it carried.

With ``loss=`` too, a lost message is never held and does not hold up its arc
(:meth:`Staleness.hold`).

The round's mix then runs on a :class:`~gossip.core.routing.MixPlan` whose neighbor terms all
read rows of one fresh staging buffer holding those messages (the own rows are copied in front
of them); the phase's :class:`~gossip.core.staging.Rows` are pointed at it.

* ``"ack"`` (per-arc copies acknowledged at both ends: choco-arcs, lead-arcs, prox-lead-arcs,
  beer-arcs, c-gt-arcs, c-ecl; per-arc phases only, on a graph that does not change): each
  delivered message is held twice, at its receiver and, as its acknowledgement, at its sender
  (both ends draw its lag from the same key and know the arc's order), and each end is handed
  the messages due, in send order (a message's sequence number is its send round), in layers
  of one message per arc (:attr:`~gossip.core.routing.ArcPlan.in_late`, ``out_late``,
  :meth:`Staleness.hold_arcs`). The senders compute their messages against their copy plus
  what is in flight (:data:`MODES`, :class:`~gossip.core.channel._ArcCopies`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from gossip.compress.base import row_stride
from gossip.core.cache import IdentityCache
from gossip.core.routing import ArcPlan, MixPlan
from gossip.core.staging import PackedRows, Rows, message_buffer
from gossip.errors import ConfigError, ContractError
from gossip.network.draws import LagDraws, arc_keys
from gossip.network.spec import Network

MODES = {"renormalize": "newest", "drop": "in-order", "keep-mass": "in-order",
         "running-sum": "by-counter", "ack": "sequenced"}
"""What a receiver is handed per :attr:`~gossip.algorithms.Algorithm.on_loss` (module doc).

``"ack"`` (``"sequenced"``): per-arc copies acknowledged at both ends. For the arc's two copies
to stay equal the sender must apply each increment to the copy its receiver holds in the round
the receiver does, and compute its next messages against that copy *plus* the increments still
in flight: against the acknowledged copy alone every message in flight would carry the same
unacknowledged gap again, and all of them would be applied (with the identity compressor and a
fixed z the gap then follows ``e(t+1) = e(t) − e(t−K)``: spectral radius 1 for K = 1, 1.15 for
K = 2, 1.18 for K = 3, never decaying). So the channel keeps a sent copy (moved at send time)
and an acknowledged one (moved at hand-over), :class:`~gossip.core.channel._ArcCopies`; the
engine hands each end the messages due (:meth:`Staleness.hold_arcs`)."""


def mode_of(policy: str, network: Network, name: str) -> str:
    """What algorithm ``name``, whose :attr:`~gossip.algorithms.Algorithm.on_loss` is
    ``policy``, is handed (:data:`MODES`); :class:`ConfigError` in one line for ``"edge"`` and
    anything else without a meaning for late messages."""
    if policy == "edge":
        raise ConfigError(
            f"--network {network.spec()}: {name} moves both ends of an edge together, from both "
            "of the edge's messages of one round (on_loss 'edge'); a late one would move one "
            "end in a round the other does not, and the sum over the nodes would drift: run it "
            "without stale=")
    if policy not in MODES:
        raise ConfigError(f"--network {network.spec()}: on_loss = {policy!r} has no meaning for "
                          f"late messages ({name}); the meaningful ones are {', '.join(MODES)}")
    return MODES[policy]


def fifo_due(t: int, lag: int, previous: int) -> int:
    """The round a message sent in round ``t`` with drawn ``lag`` is handed over: no earlier
    than the arc's ``previous`` message (first in, first out)."""
    return max(t + lag, previous)


@dataclass
class Held:
    """A message held at its receiver: sent in round ``sent`` on arc ``sender → receiver``,
    handed over in round ``due``, weighing ``weight`` (its arc's weight in round ``sent``)."""

    sender: int
    receiver: int
    phase: int
    sent: int
    due: int
    weight: float
    data: torch.Tensor  # [nbytes] uint8, the message as it arrived


class _Link:
    """One arc's (and phase's) messages in flight, in order, and the newest one handed over."""

    __slots__ = ("queue", "due", "newest")

    def __init__(self) -> None:
        self.queue: deque[Held] = deque()
        self.due = 0
        self.newest: Held | None = None


class _InArcs:
    """A round plan's in-arcs of the block, in the order its mix sums them (receiver row, then
    degree slot: sorted senders), and their lag draws."""

    def __init__(self, plan: MixPlan, ids: list[int], network: Network, seed: int):
        entries = []  # (receiver row, slot, sender, staging row, weight)
        for k, (src, dst, w) in enumerate(plan.slots):
            rows = range(plan.m) if dst is None else dst.tolist()
            entries += [(r, k, plan.sender_of[s], s, wt)
                        for s, r, wt in zip(src.tolist(), rows, w.tolist())]
        entries.sort(key=lambda e: (e[0], e[1]))
        self.entries = [(r, j, s, w) for r, _, j, s, w in entries]
        self.draws = LagDraws(network.stale, seed, arc_keys([(j, ids[r]) for r, j, _, _ in
                                                              self.entries]))


class _ArcLinks:
    """An :class:`~gossip.core.routing.ArcPlan`'s own and incoming arcs as rows of one sorted
    list of arcs (their :class:`~gossip.network.LagDraws`), and each incoming arc's receiver row."""

    def __init__(self, route: ArcPlan, network: Network, seed: int):
        self.arcs = list(route.arcs)
        self.incoming = list(route.incoming)
        every = sorted(set(self.arcs) | set(self.incoming))
        index = {a: k for k, a in enumerate(every)}
        self.draws = LagDraws(network.stale, seed, arc_keys(every))
        self.out_idx = np.array([index[a] for a in self.arcs], dtype=np.int64)
        self.in_idx = np.array([index[a] for a in self.incoming], dtype=np.int64)
        self.in_row = route.in_dst.cpu().tolist()


class Staleness:
    """The engine's late messages: per phase, hold what was exchanged and hand over what is due
    (module doc). ``late_round`` / ``late_total``: messages sent this round / since round 1 that
    are handed over in a later round, per local receiving node."""

    def __init__(self, network: Network, seed: int, policy: str, ids: list[int], name: str):
        self.network = network
        self.seed = seed
        self.mode = mode_of(policy, network, name)
        self.ids = ids
        self.late_round = np.zeros(len(ids), dtype=np.int64)
        self.late_total = np.zeros(len(ids), dtype=np.int64)
        self._links: dict[int, dict[int, dict[int, _Link]]] = {}  # phase -> row -> sender -> link
        self._arcs = IdentityCache()
        self._plans: dict[Any, MixPlan] = {}  # the delivered plans by their terms (reused)
        self._acks: dict[int, dict[tuple[int, int], _Link]] = {}  # "ack": phase -> own arc -> link
        self._arc_draws: dict[int, _ArcLinks] = {}  # "ack": phase -> its arcs' lag draws

    def begin_round(self) -> None:
        self.late_round[:] = 0

    def in_flight(self) -> list[Held]:
        """Every message held now (sent, not yet handed over), by phase, receiver, sender."""
        return [h for phase in sorted(self._links) for row in sorted(self._links[phase])
                for j in sorted(self._links[phase][row])
                for h in self._links[phase][row][j].queue]

    def unacknowledged(self) -> list[Held]:
        """Under ``"ack"``: every own message the block's senders hold as not yet handed over
        to its receiver (the senders' side of :meth:`in_flight`), by phase and arc."""
        return [h for phase in sorted(self._acks) for arc in sorted(self._acks[phase])
                for h in self._acks[phase][arc].queue]

    def hold_arcs(self, rows: Rows, t: int, phase: int) -> None:
        """Hold the messages of the per-arc phase ``phase`` of round ``t`` (``"ack"``; ``rows``
        exchanged and checked) at both ends, and point ``rows`` at the messages due now:
        ``rows.route`` becomes the delivered plan with :attr:`ArcPlan.out_late` and
        :attr:`ArcPlan.in_late` (empty layers when none is due), its own rows still this
        round's messages (what the senders' sent copies move by, ``out_delivered``).

        A lost message is held at neither end and does not move its arc's order. Each end
        computes a message's due round from the same keyed lag and the arc's previous due
        (:func:`fifo_due`), so the sender's acknowledged copy moves in the round its receiver's
        copy does, by the same bytes in the same order."""
        route = rows.route
        arcs = self._arcs_of(route, phase)
        lags = arcs.draws.lags(t, phase)
        out_ok = None if route.out_delivered is None else route.out_delivered.tolist()
        in_ok = None if route.in_delivered is None else route.in_delivered.tolist()
        own = rows.mine()
        acks = self._acks.setdefault(phase, {})
        for a, (arc, lag) in enumerate(zip(route.arcs, lags[arcs.out_idx].tolist())):
            link = acks.get(arc)
            if link is None:
                link = acks[arc] = _Link()
            if out_ok is None or out_ok[a]:
                link.due = fifo_due(t, lag, link.due)
                link.queue.append(Held(arc[0], arc[1], phase, t, link.due, 1.0, own[a].clone()))
        got = rows.gather(route.in_src, route.in_span)
        links = self._links.setdefault(phase, {})
        for e, (arc, r, lag) in enumerate(zip(route.incoming, arcs.in_row,
                                              lags[arcs.in_idx].tolist())):
            link = links.setdefault(r, {}).get(arc[0])
            if link is None:
                link = links[r][arc[0]] = _Link()
            if in_ok is None or in_ok[e]:
                link.due = fifo_due(t, lag, link.due)
                link.queue.append(Held(arc[0], arc[1], phase, t, link.due, 1.0, got[e].clone()))
                if link.due > t:
                    self.late_round[r] += 1
                    self.late_total[r] += 1
        messages: list[torch.Tensor] = []
        out_late = self._due([acks[arc] for arc in route.arcs], t, len(own), messages)
        in_late = self._due([links[r][arc[0]] for arc, r in zip(route.incoming, arcs.in_row)],
                            t, len(own), messages)
        device = route.in_dst.device
        out_late = tuple((torch.tensor(i, dtype=torch.int64, device=device),
                          torch.tensor(s, dtype=torch.int64, device=device)) for i, s in out_late)
        in_late = tuple((torch.tensor(i, dtype=torch.int64, device=device),
                         torch.tensor(s, dtype=torch.int64, device=device)) for i, s in in_late)
        held = replace(route, remote_in=[], out_late=out_late, in_late=in_late)
        _point(rows, held, messages)

    @staticmethod
    def _due(links: list[_Link], t: int, first: int, messages: list[torch.Tensor]
             ) -> list[tuple[list[int], list[int]]]:
        """Pop every message of ``links`` due by round ``t``, in send order; their bytes are
        appended to ``messages`` (staging rows ``first + len(messages)`` on). Returns the
        layers: layer k is (link indices, staging rows) of each link's k-th message due."""
        layers: list[tuple[list[int], list[int]]] = []
        for k, link in enumerate(links):
            n = 0
            while link.queue and link.queue[0].due <= t:
                h = link.newest = link.queue.popleft()
                if n == len(layers):
                    layers.append(([], []))
                layers[n][0].append(k)
                layers[n][1].append(first + len(messages))
                messages.append(h.data)
                n += 1
        return layers

    def _arcs_of(self, route: ArcPlan, phase: int) -> _ArcLinks:
        """The lag draws of ``route``'s arcs (cached per phase while its arcs stay the same)."""
        hit = self._arc_draws.get(phase)
        if hit is None or hit.arcs != route.arcs or hit.incoming != route.incoming:
            hit = self._arc_draws[phase] = _ArcLinks(route, self.network, self.seed)
        return hit

    def hold(self, rows: Rows, t: int, phase: int, routing: MixPlan | None = None) -> MixPlan:
        """Hold the messages phase ``phase`` of round ``t`` just exchanged (``rows``, checked),
        point ``rows`` at the messages due now, and return the plan to mix them with.

        ``routing``: the round's whole plan when ``rows.route`` is the plan of what was
        delivered under ``loss=`` (:mod:`gossip.network.loss`): a lost message is never held
        (it does not move its arc's order either); the self weights are the delivered plan's
        for ``"in-order"`` (push-sum's kept share), the whole plan's for ``"newest"`` (a
        neighbor whose message was lost this round still counts with its newest value)."""
        delivered = rows.route
        if isinstance(delivered, ArcPlan):
            raise ConfigError(f"--network {self.network.spec()}: this algorithm sends a message "
                              "per arc (an arc phase), for which late messages have no defined "
                              "meaning; run it without stale=")
        if self.mode == "sequenced":
            raise ConfigError(f"--network {self.network.spec()}: on_loss = 'ack' hands late "
                              "messages over per arc, but this phase sends one message per node: "
                              "send it per arc (block.arc_plan())")
        plan = routing or delivered
        got = None  # (receiver row, sender) of the messages that moved (None: all of them)
        if delivered is not plan:
            got = {(r, delivered.sender_of[s]) for src, dst, _ in delivered.slots
                   for s, r in zip(src.tolist(), range(plan.m) if dst is None else dst.tolist())}
        arcs = self._arcs.get(plan, lambda: _InArcs(plan, self.ids, self.network, self.seed))
        nb = rows.nbytes
        data = rows.both()
        links = self._links.setdefault(phase, {})
        for (r, j, s, w), lag in zip(arcs.entries, arcs.draws.lags(t, phase).tolist()):
            if got is not None and (r, j) not in got:
                links.setdefault(r, {}).setdefault(j, _Link())  # known, nothing arrived
                continue
            into = links.setdefault(r, {})
            link = into.get(j)
            if link is None:
                link = into[j] = _Link()
            due = t + lag if self.mode == "by-counter" else fifo_due(t, lag, link.due)
            link.due = max(link.due, due)
            link.queue.append(Held(j, self.ids[r], phase, t, due, w, data[s, :nb].clone()))
            if due > t:
                self.late_round[r] += 1
                self.late_total[r] += 1
        terms: list[tuple[int, Held]] = []
        self_weight = (plan if self.mode == "newest" else delivered).self_weight.tolist()
        for r in sorted(links):
            for j in sorted(links[r]):
                link = links[r][j]
                if self.mode == "by-counter":  # every message due, in the order sent
                    due = [h for h in link.queue if h.due <= t]
                    if due:
                        link.queue = deque(h for h in link.queue if h.due > t)
                        terms += [(r, h) for h in due]
                    continue
                while link.queue and link.queue[0].due <= t:
                    link.newest = link.queue.popleft()
                    if self.mode == "in-order":
                        terms.append((r, link.newest))
        if self.mode == "newest":
            for r, j, _, w in arcs.entries:  # this round's in-arcs, in the mix's order
                newest = links[r][j].newest
                if newest is None:  # nothing from j yet: its weight to the own term
                    self_weight[r] += w
                else:
                    terms.append((r, Held(j, newest.receiver, phase, newest.sent, t, w,
                                          newest.data)))
        for _, h in terms:
            if h.data.numel() != nb:
                raise ContractError(f"phase {phase} of round {t} sends {nb}-byte messages, but the "
                                    f"late one node {h.sender} sent in round {h.sent} has "
                                    f"{h.data.numel()}: under stale= a phase must carry the same "
                                    "message every round")
        held = self._plan(plan, self_weight, terms)
        _point(rows, held, [h.data for _, h in terms])
        return held

    def _plan(self, plan: MixPlan, self_weight: list[float],
              terms: list[tuple[int, Held]]) -> MixPlan:
        """The plan whose neighbor terms are ``terms`` (staging rows ``m + e``, in order: each
        row's terms are consecutive), cached by its terms (a fixed lag repeats them)."""
        m = plan.m
        key = (tuple(plan.out_degree), tuple(self_weight), tuple((r, h.sender, h.weight) for r, h in terms))
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        per_row: list[list[tuple[int, float]]] = [[] for _ in range(m)]
        for e, (r, h) in enumerate(terms):
            per_row[r].append((m + e, h.weight))
        device = plan.self_weight.device
        slots = []
        for k in range(max((len(p) for p in per_row), default=0)):
            rows = [r for r in range(m) if len(per_row[r]) > k]
            src = torch.tensor([per_row[r][k][0] for r in rows], dtype=torch.int64, device=device)
            w = torch.tensor([per_row[r][k][1] for r in rows], dtype=torch.float64, device=device)
            dst = None if len(rows) == m else torch.tensor(rows, dtype=torch.int64, device=device)
            slots.append((src, dst, w))
        held = MixPlan(m=m, self_weight=torch.tensor(self_weight, dtype=torch.float64,
                                                     device=device),
                       slots=slots, remote_in=[], remote_out=[], out_degree=plan.out_degree,
                       sender_of=plan.senders + [h.sender for _, h in terms],
                       senders=plan.senders)
        if len(self._plans) >= 64:
            self._plans.clear()
        self._plans[key] = held
        return held


def _point(rows: Rows, plan: MixPlan | ArcPlan, messages: list[torch.Tensor]) -> None:
    """Point ``rows`` (and a packed phase's parts) at a fresh staging buffer: its own rows as
    they are, then ``messages`` (staging rows ``m + e``), routed on ``plan``."""
    m, nb = rows.own.shape[0], rows.nbytes
    full = message_buffer((m + len(messages), row_stride(nb)), rows.own.device)
    full[:m, :nb].copy_(rows.own[:, :nb])
    for e, data in enumerate(messages):
        full[m + e, :nb].copy_(data)
    rows.recv, rows._all, rows.route = full[m:], full, plan
    if isinstance(rows, PackedRows):
        for part, off in zip(rows.parts, rows.compressor.offsets):
            part.recv = full[m:, off : off + part.nbytes]
            part._all = full[:, off : off + part.nbytes]
            part.route = plan
