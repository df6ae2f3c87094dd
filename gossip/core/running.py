"""Running sums on arcs: messages that carry everything their sender has sent so far.

A message that carries an *increment* (push-sum's share, a tracker's share) is needed exactly
once: lost, its mass is gone; late, the receiver must apply it exactly once, whenever it comes.
A message that carries a *running sum* needs neither (Hadjicostis, Domínguez-García and Vaidya's
robust ratio consensus; the running sums of Spiridonoff, Olshevsky and Paschalidis' robust
asynchronous gradient-push and of R-FAST's buffers). Node j keeps

    σ_j(t) = Σ_{τ ≤ t} z_j(τ)          (everything it has pushed, unweighted)

and sends ``(σ_j(t), t)`` to every out-neighbor (one broadcast per node: the weight ``c_ij`` of
a static graph is known at the receiver, so one running sum serves every out-arc, as in the
broadcast form of the robust ratio consensus). Receiver i keeps, per in-arc (j, i), the
running sum ``ρ_ij`` and counter ``κ_ij`` of the newest message it got (zero before the
first). A message ``(σ, k)`` handed over with ``k > κ_ij`` adds ``c_ij (σ − ρ_ij)`` to what
node i receives and becomes ``(ρ_ij, κ_ij)``; one with ``k ≤ κ_ij`` is ignored (a later running
sum already carried everything it carried). So, on every arc at every instant::

    c_ij · (everything j pushed)  =  c_ij ρ_ij          (received, exactly once)
                                   + c_ij (σ_j − ρ_ij)   (in flight, or lost and superseded)

A lost message only delays what it carried to the next delivered one, a late one is either the
newest (and applied) or superseded (and ignored), and nothing is applied twice. The engine's
``on_loss = "running-sum"`` delivery (:mod:`gossip.network.loss`, :mod:`gossip.network.stale`)
drops lost messages without moving a weight and hands over late ones unordered (``due = t +
lag``), so a receiver does meet messages older than what it holds.

Precision (our choice). ``σ`` grows linearly with the rounds, so a running sum kept in the
model's dtype would lose a rounding of ``|σ|`` each round, which accumulates; the sums are kept
in float64 and each addition is a TwoSum: ``σ + carry`` is exactly ``Σ z`` (the rounding of
``σ`` is carried into the next round's addition, never lost), and ``σ − ρ`` at the receiver is a
difference of two nearby floats. The message is raw float64 rows ``[σ (width values), t]``
(``8·(width + 1)`` bytes per node and round), checked at the receiver: finite values and a
counter that is an integer in ``1..t``, else the run stops naming the sender.

Built for static graphs: the arcs of the running sums are the graph's.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.core.routing import ArcPlan, MixPlan, RowSums
from gossip.errors import ConfigError, ContractError, RowsError


class RunningSums:
    """One vector of every node pushed to its out-neighbors as running sums (module doc).

    Args:
        block: the block (:class:`~gossip.core.block.Block`); build it in ``setup`` and keep it
            in ``block.workspace``.
        name: prefix of its state keys: ``NAME.sigma`` and ``NAME.carry`` ([m, width] float64
            in ``block.state``: the running sums and their rounding carried forward),
            ``NAME.rho`` and ``NAME.count`` (``block.arc_state``, a row per in-arc sorted by
            (receiver, sender): the newest running sum and counter received on it),
            ``NAME.superseded`` ([m] count: messages handed over that were not the newest).
        width: values per node and message.

    A round: ``q = rs.send(z)``, ``inbox = yield q``, ``got = rs.receive(inbox)`` where
    ``got[i] = Σ_j c_ij (σ_j − ρ_ij)`` (float64, the in-neighbors in sorted order) is what
    node i received this round; the caller keeps ``c_ii z_i`` itself (:attr:`self_weight`).
    """

    def __init__(self, block: Any, name: str, width: int):
        topology = block.topology
        if getattr(topology, "time_varying", False):
            raise ConfigError(f"running sums '{name}': one running sum per node serves every "
                              "out-arc of a static graph (the receiver weighs it); this graph "
                              "changes every round: use a static topology")
        self.block = block
        self.name = name
        self.width = width
        m, device = block.m, block.x.device
        f64 = dict(dtype=torch.float64, device=device)
        st = block.state
        for key in (f"{name}.sigma", f"{name}.carry"):
            if key not in st:
                st[key] = torch.zeros(m, width, **f64)
        if f"{name}.superseded" not in st:
            st[f"{name}.superseded"] = torch.zeros(m, **f64)
        self.sigma, self.carry = st[f"{name}.sigma"], st[f"{name}.carry"]
        self.superseded = st[f"{name}.superseded"]
        ids = block.ids
        arcs = [(j, i) for i in ids for j in topology.view(i).in_neighbors]
        self.route = ArcPlan.build(arcs, ids, device)  # its incoming: sorted (receiver, sender)
        incoming = self.route.incoming
        ast = block.arc_state
        if f"{name}.rho" not in ast:
            ast[f"{name}.rho"] = torch.zeros(len(incoming), width, **f64)
            ast[f"{name}.count"] = torch.zeros(len(incoming), **f64)
        for key in (f"{name}.rho", f"{name}.count"):
            block.arc_routes[key] = (self.route, True)
        self.rho, self.count = ast[f"{name}.rho"], ast[f"{name}.count"]
        self.arc_of = {arc: e for e, arc in enumerate(incoming)}
        # in-arc (j, i) by key ``row(i) · span + j``, sorted: a message's arc in one search
        self._span = max([j for j, _ in incoming] + list(ids), default=0) + 1
        keys = self.route.in_dst * self._span + torch.tensor([j for j, _ in incoming],
                                                             dtype=torch.int64, device=device)
        self._keys, self._key_arc = torch.sort(keys)
        views = {nd.id: nd.view for nd in block.nodes}
        self.weight = torch.tensor([views[i].weight_of(j) for j, i in incoming], **f64)
        """``c_ij`` of every in-arc (j, i)."""
        self.self_weight = torch.tensor([views[i].self_weight for i in ids], **f64)
        """``c_ii`` of every row: the share of what it pushes a node keeps."""
        self.receivers = self.route.in_dst
        self.sums = RowSums(self.route.in_dst.tolist(), m, device)
        self.nbytes = 8 * (width + 1)
        self._terms: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, MixPlan]] = {}
        self._delta = torch.zeros(len(incoming), width, **f64)
        self._got = torch.zeros(m, width, **f64)

    # -- the sender ----------------------------------------------------------------------------
    def push(self, z: torch.Tensor) -> None:
        """``σ ← σ + z`` for every row, as a TwoSum: ``σ + carry`` stays exactly ``Σ z``."""
        u = torch.add(z.to(torch.float64), self.carry)
        new = torch.add(self.sigma, u)
        bb = new - self.sigma
        # carry = (σ − (new − bb)) + (u − bb): what the rounding of σ + u left out
        torch.add(self.sigma - (new - bb), u - bb, out=self.carry)
        self.sigma.copy_(new)

    def send(self, z: torch.Tensor) -> Any:
        """Push ``z`` ([m, width]) into the running sums and return the phase's message rows
        (``[σ, t]`` per node, raw float64) to ``yield``."""
        block = self.block
        if z.shape != (block.m, self.width):
            raise ConfigError(f"running sums '{self.name}': send {tuple(z.shape)} rows, "
                              f"expected {(block.m, self.width)}")
        self.push(z)
        rows = block.message_rows(self.nbytes)
        mine = rows.mine().view(torch.float64)
        mine[:, : self.width].copy_(self.sigma)
        mine[:, self.width] = float(block.round)
        return rows

    # -- the receiver --------------------------------------------------------------------------
    def _plan_terms(self, plan: MixPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The terms of the plan the messages were handed over on, in its slots' order: each
        term's in-arc, receiving row and staging row (cached per plan)."""
        hit = self._terms.get(id(plan))
        if hit is not None and hit[3] is plan:
            return hit[:3]
        device = self.block.x.device
        if plan.fused is None:
            staging = rows = arcs = torch.zeros(0, dtype=torch.int64, device=device)
        else:
            staging, rows = plan.fused[0], plan.fused[1]
            sender = torch.tensor(plan.sender_of, dtype=torch.int64, device=device)[staging]
            key = rows * self._span + sender
            at = torch.searchsorted(self._keys, key).clamp_(max=max(len(self._keys) - 1, 0))
            # a message on no in-arc; a sender past span would alias another row's key
            bad = (sender >= self._span) | (self._keys[at] != key if len(self._keys) else True)
            if bool(bad.any()):
                k = int(bad.nonzero()[0])
                raise ContractError(f"running sums '{self.name}': a message from node "
                                    f"{int(sender[k])} to node {self.block.ids[int(rows[k])]} "
                                    "on no arc of the graph the sums were built for")
            arcs = self._key_arc[at]
        if len(self._terms) > 64:
            self._terms.clear()
        self._terms[id(plan)] = (arcs, rows, staging, plan)
        return arcs, rows, staging

    def receive(self, inbox: Any) -> torch.Tensor:
        """``Σ_j c_ij (σ_j − ρ_ij)`` for every row from the messages handed over (``inbox``,
        what the ``yield`` gave back); the newest of each in-arc becomes its ``(ρ, κ)``, older
        ones are counted in ``NAME.superseded``. A buffer, valid until the next call.

        Vectorized over the messages: per in-arc, the newest is the message with the largest
        counter above ``κ`` (the first of equal ones, which no sender makes); every other
        message handed over is superseded."""
        plan = inbox.route
        if not isinstance(plan, MixPlan):
            raise ConfigError(f"running sums '{self.name}': a phase of one message per node")
        arcs, rows, staging = self._plan_terms(plan)
        delta, got = self._delta.zero_(), self._got.zero_()
        if not len(arcs):
            return got
        values = inbox.both().index_select(0, staging)[:, : self.nbytes].contiguous()
        values = values.view(torch.float64)
        self._check(values, plan, staging, rows)
        counters = values[:, self.width]
        fresh = counters > self.count.index_select(0, arcs)
        n_arcs, n_msg = len(self.count), len(arcs)
        top = torch.full((n_arcs,), -torch.inf, dtype=torch.float64, device=counters.device)
        top.scatter_reduce_(0, arcs, torch.where(fresh, counters, -torch.inf), "amax")
        newest = fresh & (counters == top.index_select(0, arcs))
        order = torch.arange(n_msg, device=counters.device)
        first = torch.full((n_arcs,), n_msg, dtype=torch.int64, device=counters.device)
        first.scatter_reduce_(0, arcs, torch.where(newest, order, n_msg), "amin")
        applied = first.index_select(0, arcs) == order  # message k is its arc's newest
        self.superseded.index_add_(0, rows, (~applied).to(torch.float64))
        e = (first < n_msg).nonzero().squeeze(1)
        if len(e):
            newest_rows = values.index_select(0, first.index_select(0, e))
            sig = newest_rows[:, : self.width]
            delta.index_copy_(0, e, sig - self.rho.index_select(0, e))
            self.rho.index_copy_(0, e, sig)
            self.count.index_copy_(0, e, newest_rows[:, self.width].contiguous())
            self.sums.add_(got, delta, self.weight)
        return got

    def _check(self, values: torch.Tensor, plan: MixPlan, staging: torch.Tensor,
               rows: torch.Tensor) -> None:
        """Refuse a message with a value that is not finite or a counter that no sender writes
        (not an integer in ``1..t``), naming its sender."""
        counters = values[:, self.width]
        bad = (~torch.isfinite(values).all(dim=1) | (counters < 1)
               | (counters > self.block.round) | (counters != torch.floor(counters)))
        if bad.any():
            k = int(bad.nonzero()[0])
            sender = plan.sender_of[int(staging[k])]
            receiver = self.block.ids[int(rows[k])]
            what = ("a value that is not finite" if not torch.isfinite(values[k]).all() else
                    f"counter {float(counters[k])!r} (expected an integer in 1..{self.block.round})")
            raise RowsError(f"round {self.block.round}: the running sum from node {sender} to "
                            f"node {receiver} was refused: {what}", sender=sender,
                            receiver=receiver)

    def in_flight(self) -> torch.Tensor:
        """``c_ij (σ_j + carry_j − ρ_ij)`` of every in-arc whose sender is in the block (what
        it pushed on the arc that the receiver has not applied yet: in flight, or lost and
        superseded), rows of in-arcs from other processes zero: for checks and tests."""
        row_of = {i: r for r, i in enumerate(self.block.ids)}
        out = torch.zeros_like(self.rho)
        for e, (j, _) in enumerate(self.route.incoming):
            r = row_of.get(j)
            if r is not None:
                out[e] = (self.sigma[r] + self.carry[r] - self.rho[e]) * self.weight[e]
        return out
