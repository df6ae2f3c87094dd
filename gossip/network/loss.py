"""Lost messages of synchronous rounds: which of a phase's messages arrive, and the plan without the rest.

Both ends of an arc draw its drop from the same key (:mod:`gossip.network`), so each process
knows, before it moves a byte, which of its sends and receives of a phase are lost. The engine
then hands the transport and the round a *delivered* :class:`~gossip.core.routing.MixPlan`:
the round's plan without the lost arcs (no send, no receive, no bytes counted for them; the
receiver's mix skips them) and with the self weights the algorithm's semantics asks for
(:attr:`gossip.algorithms.Algorithm.on_loss`, docs/network.md):

* ``"renormalize"``: the lost neighbor's weight goes to the receiver's own term,
  ``w_ii ← w_ii + Σ_{j lost} w_ij`` (the rows still sum to one; as if the receiver had heard
  its own value instead). For methods whose message is a value the receiver averages in.
* ``"drop"``: the message adds nothing and no weight moves. For methods whose message is an
  increment to a copy the receiver keeps (CHOCO's ``x̂``, LEAD's ``h``, …): the receiver's copy
  of the sender misses that increment while the sender's own copy has it.
* ``"keep-mass"``: the sender keeps the share it could not send, ``w_ii ← w_ii + Σ_{j lost}
  w_ji`` (the columns still sum to one: push-sum's mass ``Σ_i s_i`` and ``Σ_i w_i`` are kept).

* ``"ack"``: the algorithm sends one message per arc (an
  :class:`~gossip.core.routing.ArcPlan` phase) and reads which of them arrived. The delivered
  plan keeps every row but moves no bytes for the lost arcs (``remote_in`` / ``remote_out``
  without them, ``out_degree`` 0) and carries two masks from the same draws: ``out_delivered``
  (the block's own arcs, as the sender learns it from an acknowledgement in a real network;
  the acknowledgement is not counted in bits) and ``in_delivered`` (the arcs into the block);
  :meth:`~gossip.core.block.Block.decode_received` adds only the delivered ones. For methods
  whose sender and receiver keep the same per-arc copy (``choco-arcs``, ``lead-arcs``,
  ``prox-lead-arcs``, ``beer-arcs``, ``c-gt-arcs``: a :class:`~gossip.core.channel.Channel`
  with ``route="arcs"``; C-ECL's dual mirrors): both ends apply a delivered message, neither a
  lost one, so the copies never disagree.
* ``"edge"``: an edge sits out a phase, at both ends, when either of its two messages of that
  phase is lost (both ends know it from the same keyed draws, as for ``"ack"``). For methods
  whose exchange on an edge is one antisymmetric move of its two ends (PowerGossip's
  ``±(u_i − u_j)`` projections, on an :class:`~gossip.core.routing.ArcPlan` phase: the masks
  ``out_delivered`` / ``in_delivered`` are the edge's, not the arc's) or whose mixing matrix
  must stay symmetric (EXTRA, on a :class:`~gossip.core.routing.MixPlan` phase: a skipped
  edge's weight goes to the own term at both ends, so ``W_t`` stays symmetric and doubly
  stochastic). A message whose reverse was lost still moves and is counted (its sender did
  not know), but its receiver discards it.

* ``"running-sum"``: the message carries a running sum (everything its sender ever sent on
  the arc) and a counter (:class:`~gossip.core.running.RunningSums`); a lost one adds nothing
  and moves no weight (as ``"drop"``), and the next delivered one carries what it carried: the
  receiver adds the difference between the newest running sum it got and the one before. For
  methods built on running sums (``robust-push-sum``, ``robust-gt``): nothing is ever missed.

Under partial activation (``active=``, :mod:`gossip.network.activity`) every arc into or out of
a node inactive in the round is *silent*: removed as a lost one is, by the same policy, but not
counted in ``messages_lost``.

A phase without a lost message keeps the round's plan itself (nothing is built; its masks are
None: every message arrived). Per-arc phases of the other policies (the all-reduces) have no
loss semantics and are refused; an ``"ack"`` algorithm's phases must be per-arc ones. An
``"edge"`` algorithm needs an undirected graph.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from gossip.core.cache import IdentityCache
from gossip.core.routing import ArcPlan, MixPlan
from gossip.errors import ConfigError
from gossip.network.draws import LossDraws, arc_keys
from gossip.network.spec import Network

POLICIES = ("renormalize", "drop", "keep-mass", "ack", "edge", "running-sum")
"""What a lost message means to an algorithm (module doc)."""
ARC_POLICIES = ("ack", "edge")
"""The policies whose algorithms read which per-arc messages arrived (``out_delivered`` /
``in_delivered`` of an arc phase): they may keep state per arc under loss."""
ARC_STATE_POLICIES = (*ARC_POLICIES, "running-sum")
"""The policies under which an algorithm may keep per-arc state at all under loss or lags:
those that read which per-arc messages arrived, and running sums, whose receivers keep the
newest running sum and counter of each in-arc (:mod:`gossip.core.running`)."""


def _reverse(arcs: list[tuple[int, int]]) -> np.ndarray:
    """For every arc of the sorted list ``arcs``, the index of its reverse in it
    (:class:`ConfigError` for an arc without one: ``"edge"`` needs an undirected graph)."""
    index = {a: k for k, a in enumerate(arcs)}
    missing = [(i, j) for i, j in arcs if (j, i) not in index]
    if missing:
        i, j = missing[0]
        raise ConfigError(f"--network loss: this algorithm skips an edge at both ends when either "
                          f"of its messages is lost (on_loss 'edge'), but arc {i} -> {j} has no "
                          "reverse: it needs an undirected graph")
    return np.array([index[(j, i)] for i, j in arcs], dtype=np.int64)


class _PlanArcs:
    """A round plan's arcs as index tables into one sorted list of every arc into or out of
    the block (the rows of its :class:`~gossip.network.LossDraws`)."""

    def __init__(self, plan: MixPlan, topology: Any, ids: list[int], network: Network, seed: int,
                 edge: bool = False):
        m = plan.m
        device = plan.self_weight.device
        self.every = torch.arange(m, device=device)
        slot_arcs, ins = [], []  # ins: (receiver, sender, receiver's row, w_ij)
        for src, dst, ws in plan.slots:
            rows = range(m) if dst is None else dst.tolist()
            entries = [(ids[r], plan.sender_of[s], r, w)
                       for s, r, w in zip(src.tolist(), rows, ws.tolist())]
            slot_arcs.append([(j, i) for i, j, _, _ in entries])
            ins += entries
        ins.sort(key=lambda e: (e[0], e[1]))
        outs = []  # (sender, receiver, sender's row, w_ji)
        for r, i in enumerate(ids):
            view = topology.view(i)
            outs += [(i, j, r, w) for j, w in zip(view.out_neighbors, view.out_weights)]
        arcs = sorted({(j, i) for i, j, _, _ in ins} | {(i, j) for i, j, _, _ in outs})
        index = {a: k for k, a in enumerate(arcs)}
        self.keys = np.array(arc_keys(arcs), dtype=np.int64)
        self.draws = LossDraws(network.loss, seed, arc_keys(arcs)) if network.lossy else None
        self.rev = _reverse(arcs) if edge else None
        self.slot_idx = [np.array([index[a] for a in sa], dtype=np.int64) for sa in slot_arcs]
        # in-arcs sorted by (receiver, sender), out-arcs by (sender, receiver): the order in
        # which a node's self weight adds the weights of its lost arcs, the same everywhere
        self.in_idx = np.array([index[(j, i)] for i, j, _, _ in ins], dtype=np.int64)
        self.in_row = np.array([r for _, _, r, _ in ins], dtype=np.int64)
        self.in_w = [w for _, _, _, w in ins]
        self.out_idx = np.array([index[(i, j)] for i, j, _, _ in outs], dtype=np.int64)
        self.out_row = np.array([r for _, _, r, _ in outs], dtype=np.int64)
        self.out_w = [w for _, _, _, w in outs]
        self.remote_in_idx = np.array([index[(j, i)] for j, i, _ in plan.remote_in], dtype=np.int64)
        self.remote_out_idx = np.array([index[(ids[r], j)] for r, j in plan.remote_out],
                                       dtype=np.int64)

    def delivered(self, plan: MixPlan, lost: np.ndarray, policy: str) -> MixPlan:
        """``plan`` without the arcs ``lost`` marks, self weights moved per ``policy`` (``"edge"``:
        without the arcs of an edge either of whose messages is lost, moved as renormalized;
        the transfers of the arcs not lost themselves stay)."""
        keep = ~lost
        if policy == "edge":
            keep_transfer, lost = keep, lost | lost[self.rev]
            keep, policy = ~lost, "renormalize"
        else:
            keep_transfer = keep
        slots = []
        for (src, dst, w), idx in zip(plan.slots, self.slot_idx):
            k = keep[idx]
            if k.all():
                slots.append((src, dst, w))
            elif k.any():
                kt = torch.from_numpy(k).to(src.device)
                slots.append((src[kt], (self.every if dst is None else dst)[kt], w[kt]))
        self_weight = plan.self_weight
        moved = {"renormalize": (self.in_idx, self.in_row, self.in_w),
                 "keep-mass": (self.out_idx, self.out_row, self.out_w)}.get(policy)
        if moved is not None:
            idx, rows, weights = moved
            hit = lost[idx].nonzero()[0]
            if hit.size:
                values = self_weight.tolist()
                for e in hit.tolist():  # each node's lost arcs in neighbor order
                    values[rows[e]] += weights[e]
                self_weight = torch.tensor(values, dtype=torch.float64, device=self_weight.device)
        degree = list(plan.out_degree)
        for r in self.out_row[~keep_transfer[self.out_idx]].tolist():
            degree[r] -= 1
        return MixPlan(
            m=plan.m, self_weight=self_weight, slots=slots,
            remote_in=[e for e, k in zip(plan.remote_in, keep_transfer[self.remote_in_idx]) if k],
            remote_out=[e for e, k in zip(plan.remote_out, keep_transfer[self.remote_out_idx])
                        if k],
            out_degree=degree, sender_of=plan.sender_of, senders=plan.senders,
        )


class _ArcPlanArcs:
    """An :class:`~gossip.core.routing.ArcPlan`'s arcs (its own and its incoming ones) as index
    tables into one sorted list (the rows of its :class:`~gossip.network.LossDraws`)."""

    def __init__(self, plan: ArcPlan, network: Network, seed: int, edge: bool = False):
        arcs = sorted(set(plan.arcs) | set(plan.incoming))
        index = {a: k for k, a in enumerate(arcs)}
        self.keys = np.array(arc_keys(arcs), dtype=np.int64)
        self.draws = LossDraws(network.loss, seed, arc_keys(arcs)) if network.lossy else None
        self.rev = _reverse(arcs) if edge else None
        self.out_idx = np.array([index[a] for a in plan.arcs], dtype=np.int64)
        self.in_idx = np.array([index[a] for a in plan.incoming], dtype=np.int64)
        self.in_row = plan.in_dst.cpu().numpy().astype(np.int64)
        self.remote_in_idx = np.array([index[(j, i)] for j, i, _ in plan.remote_in], dtype=np.int64)
        self.remote_out_idx = np.array([index[plan.arcs[r]] for r, _ in plan.remote_out],
                                       dtype=np.int64)

    def delivered(self, plan: ArcPlan, lost: np.ndarray) -> ArcPlan:
        """``plan`` with every row, without the lost arcs' transfers, and its delivered masks
        (with ``rev``, policy ``"edge"``: an arc's mask is its edge's, delivered both ways)."""
        keep = ~lost
        both = keep if self.rev is None else keep & keep[self.rev]
        sent, got = both[self.out_idx], both[self.in_idx]
        device = plan.in_dst.device
        return replace(
            plan,
            remote_in=[e for e, k in zip(plan.remote_in, keep[self.remote_in_idx]) if k],
            remote_out=[e for e, k in zip(plan.remote_out, keep[self.remote_out_idx]) if k],
            out_degree=[int(k) for k in keep[self.out_idx]],
            out_delivered=torch.from_numpy(sent).to(device),
            in_delivered=torch.from_numpy(got).to(device),
        )


class Delivery:
    """The engine's message loss: per phase, the delivered plan and the count of lost messages
    per receiving node (module doc)."""

    def __init__(self, network: Network, seed: int, policy: str, ids: list[int],
                 activity: Any = None):
        if policy not in POLICIES:
            raise ConfigError(f"on_loss = {policy!r} is not one of {', '.join(POLICIES)}")
        self.network = network
        self.seed = seed
        self.policy = policy
        self.ids = ids
        self.lost_round = np.zeros(len(ids), dtype=np.int64)
        """Messages lost this round, per local receiving node (rows of the block)."""
        self.lost_total = np.zeros(len(ids), dtype=np.int64)
        """Messages lost since round 1, per local receiving node."""
        self._arcs = IdentityCache()
        self.activity = activity
        """The rounds' partial activation (:class:`gossip.network.activity.Activity`; None:
        every node takes part): an arc touching an inactive node is silent, as if lost."""

    def begin_round(self) -> None:
        self.lost_round[:] = 0

    def route(self, plan: Any, topology: Any, t: int, phase: int) -> MixPlan | ArcPlan:
        """The plan phase ``phase`` (0, 1, …) of round ``t`` is delivered on (``plan`` itself
        when none of its messages is lost)."""
        per_arc = isinstance(plan, ArcPlan)
        edge = self.policy == "edge"
        if per_arc and self.policy not in ARC_POLICIES:
            raise ConfigError(
                "--network loss: this algorithm sends a message per arc (an arc phase), for which "
                "lost messages have no defined meaning; run it without loss, or use choco-arcs "
                "(per-arc copies that both ends update only on delivery)")
        if not per_arc and self.policy == "ack":
            raise ConfigError(
                "--network loss: on_loss = 'ack' reads which per-arc messages were delivered, but "
                "this phase sends one message per node: send it per arc (block.arc_plan())")
        if per_arc:
            arcs = self._arcs.get(plan, lambda: _ArcPlanArcs(plan, self.network, self.seed, edge))
        else:
            arcs = self._arcs.get(plan, lambda: _PlanArcs(plan, topology, self.ids, self.network,
                                                          self.seed, edge))
        lost = arcs.draws.lost(t, phase) if arcs.draws is not None else None
        if lost is not None:  # counted: lost by the loss model, between two active nodes
            counted = lost if self.activity is None else lost & ~self.activity.silent(arcs.keys)
            rows = arcs.in_row[counted[arcs.in_idx]]
            np.add.at(self.lost_round, rows, 1)
            np.add.at(self.lost_total, rows, 1)
        if self.activity is not None and self.activity.count < len(self.activity.mask):
            silent = self.activity.silent(arcs.keys)
            lost = silent if lost is None else lost | silent
        if lost is None or not lost.any():
            return plan
        return arcs.delivered(plan, lost) if per_arc else arcs.delivered(plan, lost, self.policy)
