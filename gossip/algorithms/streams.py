"""Compressed streams: a vector whose mixed value neighbors rebuild from compressed differences.

One procedure shared by the compressed tracking, push-pull, push-sum and momentum-tracking
methods (LEAD's communication step, see :mod:`gossip.algorithms.lead`, with a free mixing matrix M).
For node i, a stream of values ``z_i`` keeps a public copy ``h_i`` that every out-neighbor
rebuilds, and its mixed copy ``hm_i = Σ_j m_ij h_j`` (j over in-neighbors and i itself)::

    q_i = C(z_i − h_i)                               # the only message, to out-neighbors
    ẑ_i = h_i + q_i;    ẑm_i = hm_i + Σ_j m_ij q_j
    h_i ← (1 − α) h_i + α ẑ_i;    hm_i ← (1 − α) hm_i + α ẑm_i

so ``hm = M h`` holds exactly at all times, and ``ẑ − ẑm`` is the compressed ``(I − M) z``.
With the identity compressor ``ẑ = z`` and ``ẑm = M z`` for any α.

``α = 0`` keeps no state: ``q = C(z)`` and ``ẑm = M ẑ`` come from this round's messages only,
which is what a time-varying graph (a different M every round) allows.

``α = 1`` is error feedback in its EF21 form: the copy moves by exactly what was sent, so what
the compressor dropped stays in ``z − h`` and goes out in later messages (the form for biased,
contractive compressors such as top-k). ``α < 1`` damps the copy (DIANA-style, for unbiased
compressors of large variance). An extra additive error memory would count the dropped part
twice (it is already in ``z − h``); measured, it diverged where these forms converge.

Streams run on blocks of nodes (:mod:`gossip.engine.block`): :class:`BlockStream` is the stream for
all of a process's nodes, its copies [m, d] tensors in ``block.state`` (``"sx.h"``,
``"sx.hm"``, mirrored into each ``node.state``, so checkpoints save and restore them in place),
and :func:`send_block_streams` packs every stream's rows into one phase. On a graph that changes
every round, :class:`BlockArcStream` keeps one copy per arc instead (``block.arc_state``
``"sx.out"``, ``"sx.in"``) and :func:`send_block_arc_streams` sends one packed message per
arc. A stream's own compressor is ``block.stream_compressor(name)``, which checkpoints save
too. The helpers hold scratch buffers only; algorithms keep them in ``block.workspace``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from gossip.engine.cache import IdentityCache
from gossip.engine.nodes import Node
from gossip.errors import ConfigError

Weights = Callable[[int], float]
"""``m(j)``: the weight node i gives to node j's value (j an in-neighbor, or i itself)."""



def pull_weights(node: Node) -> Weights:
    """Row-stochastic weights ``1/(1 + |N_in(i)|)`` on node i's in-neighbors and itself."""
    def m(j: int) -> float:
        return 1.0 / (1.0 + len(node.view.in_neighbors))
    return m


def check_stateless(name: str, compressor: Any) -> None:
    """Per-arc copies send one message per arc: refuse compressors that keep state per stream."""
    if getattr(compressor, "stateful", False):
        raise ConfigError(f"{name} keeps one copy per arc on a time-varying graph and sends one "
                          f"message per arc; '{compressor.spec}' keeps state per stream: use a "
                          "stateless compressor (topk, qsgd, lead, sign, ...)")


def schedule_plan(block: Any, topology: Any) -> Any:
    """The :class:`~gossip.engine.routing.ArcPlan` of every arc into or out of the block's nodes over
    the whole schedule (:func:`arcs_over_schedule`): the rows of per-arc copies."""
    from gossip.engine.routing import ArcPlan

    arcs = []
    for i in block.ids:
        outs, ins = arcs_over_schedule(topology, i)
        arcs += [(i, j) for j in outs] + [(j, i) for j in ins]
    return ArcPlan.build(arcs, block.ids, block.x.device)


def arcs_over_schedule(topology: Any, i: int) -> tuple[list[int], list[int]]:
    """Node i's out- and in-neighbors over every round of ``topology`` (sorted).

    A static graph: its neighbors; a periodic time-varying one: the union over a period; one
    without a period (random matchings): every other node, since any arc may be drawn.
    """
    if not getattr(topology, "time_varying", False):
        view = topology.view(i)
        return sorted(view.out_neighbors), sorted(view.in_neighbors)
    if not topology.period:
        others = [j for j in range(topology.n) if j != i]
        return others, list(others)
    outs: set[int] = set()
    ins: set[int] = set()
    for t in range(1, topology.period + 1):
        view = topology.at_round(t).view(i)
        outs.update(view.out_neighbors)
        ins.update(view.in_neighbors)
    return sorted(outs), sorted(ins)


# -- streams of a block of nodes ---------------------------------------------------------------
class BlockStream:
    """One compressed stream of every node of a block (see the module docstring).

    The public copies are the [m, d] tensors ``block.state[name + ".h"]`` and
    ``block.state[name + ".hm"]`` (the engine mirrors their rows into each ``node.state``
    under the per-node keys, so checkpoints are the same); scratch buffers live here.

    Args:
        block: the block it belongs to.
        name: the stream's name: the prefix of its keys in ``block.state`` and, with
            ``own_compressor``, the name of its compressor.
        alpha: how far the public copy moves toward the reconstructed value, in [0, 1];
            0 keeps no state (time-varying graphs).
        weights: ``weights(node)`` gives node's mixing weights ``m(j)`` (None, or a None
            result for every node: the topology's ``w_ij``, i.e. ``block.plan``). Per-slot
            weights are built from them once per round plan, neighbors in sorted order as
            :class:`~gossip.engine.routing.MixPlan` orders them.
        own_compressor: use ``block.stream_compressor(name)`` instead of the block's main
            compressor (stateful compressors keep one state per stream of messages).
    """

    def __init__(self, block: Any, name: str, *, alpha: float,
                 weights: Callable[[Node], Weights | None] | None = None,
                 own_compressor: bool = False):
        x = block.x
        self.block = block
        self.name = name
        self.alpha = float(alpha)
        self.weights = weights
        self.compressor = block.stream_compressor(name) if own_compressor else block.compressor
        self.rng = block.stream_rng(name) if own_compressor else block.rng
        st = block.state
        if self.alpha > 0:
            for key in (f"{name}.h", f"{name}.hm"):
                if key not in st:
                    st[key] = torch.zeros_like(x)
        self.h = st.get(f"{name}.h") if self.alpha > 0 else None
        self.hm = st.get(f"{name}.hm") if self.alpha > 0 else None
        self.diff = torch.empty_like(x)
        self.z_hat, self.zm_hat = block.stacked(2)  # one decode for both (mix_into's copy=)
        self.q: Any = None
        self._plans = IdentityCache(limit=4)  # the weighted plan per round plan

    def encode(self, z: torch.Tensor) -> Any:
        """Compress every row of ``z − h``: the :class:`~gossip.engine.staging.Rows` of this stream."""
        d = torch.sub(z, self.h, out=self.diff) if self.h is not None else self.diff.copy_(z)
        return self.block.encode(d, self.compressor, self.rng)

    def plan(self) -> Any:
        """The round's :class:`~gossip.engine.routing.MixPlan` with this stream's weights."""
        block = self.block
        if self.weights is None:
            return block.plan
        return self._plans.get(block.plan, lambda: _weighted_plan(
            block, [self.weights(nd) for nd in block.nodes]))

    def receive(self, q: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ẑ, ẑm)`` for every row from this stream's part ``q`` of the exchanged rows
        (default: the part :func:`send_block_streams` left in ``self.q``), in
        the per-node order (own message, then the neighbors' in sorted order); buffers valid
        until the next call."""
        block, z_hat, zm_hat = self.block, self.z_hat, self.zm_hat
        q = self.q if q is None else q
        if self.h is None:
            z_hat.zero_()
            zm_hat.zero_()
        else:
            z_hat.copy_(self.h)
            zm_hat.copy_(self.hm)
        plan, saved = self.plan(), block.plan
        block.plan = plan
        try:
            block.mix_into(zm_hat, q, q, copy=z_hat)
        finally:
            block.plan = saved
        if self.h is not None:
            a = self.alpha
            self.h.mul_(1.0 - a).add_(z_hat, alpha=a)
            self.hm.mul_(1.0 - a).add_(zm_hat, alpha=a)
        return z_hat, zm_hat


def _weighted_plan(block: Any, weights: list[Weights | None]) -> Any:
    """``block.plan`` with the weights ``weights[r](j)`` of each row r (None: ``w_ij``)."""
    from gossip.engine.routing import MixPlan

    plan, ids, m = block.plan, block.ids, block.m
    if all(w is None for w in weights):
        return plan
    fns = [w or nd.weight for w, nd in zip(weights, block.nodes)]
    device = plan.self_weight.device
    self_w = torch.tensor([fns[r](ids[r]) for r in range(m)], dtype=torch.float64, device=device)
    slots = []
    for src, dst, _ in plan.slots:
        rows = range(m) if dst is None else dst.tolist()
        w = [fns[r](plan.sender_of[s]) for r, s in zip(rows, src.tolist())]
        slots.append((src, dst, torch.tensor(w, dtype=torch.float64, device=device)))
    return MixPlan(m=m, self_weight=self_w, slots=slots, remote_in=plan.remote_in,
                   remote_out=plan.remote_out, out_degree=plan.out_degree, sender_of=plan.sender_of,
                   senders=plan.senders)


def send_block_streams(block: Any, streams: Sequence[BlockStream], values: Sequence[torch.Tensor],
                       extra: Sequence[torch.Tensor] = ()) -> Any:
    """One phase carrying every stream's rows (then the raw
    [m, b] uint8 ``extra`` rows), the bytes a per-node round sends. Each stream's part is in
    ``stream.q`` (decode it with :meth:`BlockStream.receive` after the yield); the extras are
    ``packed.parts[len(streams):]``."""
    parts = [s.encode(v) for s, v in zip(streams, values)]
    packed = block.pack(parts + list(extra))
    for s, part in zip(streams, packed.parts):
        s.q = part
    return packed


class BlockArcStream:
    """Compressed gossip on graphs that change every round: one public copy per arc.

    Node i keeps, for every out-neighbor j it may send to, the copy ``o_ij`` of its value that
    j holds, and for every in-neighbor j the copy ``c_ji`` of j's value (all zero at the start;
    the arcs are those of a whole period, :func:`arcs_over_schedule`: on a one-peer exponential
    graph ⌈log₂ n⌉ of each). In a round with weights ``W(t)``::

        q_ij = C(z_i − o_ij) to each current out-neighbor j;   o_ij += q_ij;   c_ji += q_ji
        D_i = Σ_{j ∈ N_in(i)} w_ij c_ji − Σ_{j ∈ N_out(i)} w_ji o_ij

    ``D`` is the compressed ``(W(t) − I) z`` (exactly that with the identity compressor and a
    doubly stochastic W(t)), and ``Σ_i D_i = 0`` exactly, whatever the compressor: each arc's
    copy enters once with + at the receiver and once with − at the sender. So averages (or
    trackers) are preserved on time-varying graphs, where a single shared copy per node could
    not be kept up to date. Copies move by the whole message (EF21-style error feedback).
    One message per current arc (a per-arc phase, :meth:`~gossip.engine.block.Block.arc_plan`).

    The copies are per-arc state over the arcs of a whole period (``schedule``, an
    :class:`~gossip.engine.routing.ArcPlan` of :func:`arcs_over_schedule`'s arcs):
    ``block.arc_state[name + ".out"]`` has a row per arc the block's nodes may send on
    (``o_ij``), ``block.arc_state[name + ".in"]`` a row per arc they may receive on (``c_ji``);
    node i's ``state[name + ".out"]`` / ``[name + ".in"]`` are the [k, d] views of its arcs, in
    the order of its sorted out- / in-neighbors over the schedule, as the per-node lists were.
    A randomized compressor draws from the arc's stream (``block.arc_rng(route, name)``).

    Args:
        block: the block it belongs to.
        name: the prefix of its keys in ``block.arc_state`` (and its compressor's name with
            ``own_compressor``).
        schedule: the arcs of every round (into or out of the block), :func:`schedule_plan`.
        own_compressor: use ``block.stream_compressor(name)`` instead of the main compressor.
    """

    def __init__(self, block: Any, name: str, *, schedule: Any, own_compressor: bool = False):
        x = block.x
        self.block = block
        self.name = name
        self.schedule = schedule
        self.compressor = block.stream_compressor(name) if own_compressor else block.compressor
        st = block.arc_state
        for key, rows, incoming in ((f"{name}.out", len(schedule.arcs), False),
                                    (f"{name}.in", len(schedule.incoming), True)):
            if key not in st:
                st[key] = x.new_zeros(rows, x.shape[1])
            block.arc_routes[key] = (schedule, incoming)
        self.out, self.inc = st[f"{name}.out"], st[f"{name}.in"]
        self._out_row = {arc: a for a, arc in enumerate(schedule.arcs)}
        self._in_row = {arc: e for e, arc in enumerate(schedule.incoming)}
        self.mix = torch.empty_like(x)
        self._rounds = IdentityCache()
        self.q: Any = None

    def round_of(self, route: Any) -> _ArcRound:
        """The row maps and sums of a round's arcs (cached per route)."""
        return self._rounds.get(route, lambda: _ArcRound(self, route))

    def encode(self, z: torch.Tensor, route: Any) -> Any:
        """``C(z_i − o_ij)`` for every current arc (i, j) of ``route``: its :class:`Rows`."""
        rnd = self.round_of(route)
        d = torch.sub(z.index_select(0, rnd.src), self.out.index_select(0, rnd.out_rows))
        block = self.block
        return block.encode(d, self.compressor, block.arc_rng(route, self.name), route=route)

    def laplacian(self, q: Any = None) -> torch.Tensor:
        """Update the copies with the exchanged part ``q`` (default ``self.q``) and return
        ``D_i = Σ_in w_ij c_ji − Σ_out w_ji o_ij`` of every row, in the per-node order (the
        out-arcs, then the in-arcs, each sorted by neighbor); a buffer."""
        q = self.q if q is None else q
        block, rnd = self.block, self.round_of(q.route)
        out = self.out.index_select(0, rnd.out_rows)
        block.decode_add(out, q)  # o_ij += C(q_ij)
        self.out.index_copy_(0, rnd.out_rows, out)
        inc = self.inc.index_select(0, rnd.in_rows)
        block.decode_received(inc, q)  # c_ji += C(q_ji)
        self.inc.index_copy_(0, rnd.in_rows, inc)
        mix = self.mix.zero_()
        rnd.out_sums.add_(mix, out, rnd.out_weight)  # − w_ji o_ij
        rnd.in_sums.add_(mix, inc, rnd.in_weight)  # + w_ij c_ji
        return mix


class _ArcRound:
    """One round's arcs of a :class:`BlockArcStream`: their rows among the schedule's copies,
    senders, weights and per-node sums."""

    def __init__(self, stream: BlockArcStream, route: Any):
        from gossip.algorithms.arcs import RowSums

        block = stream.block
        device = block.x.device
        row_of = {i: r for r, i in enumerate(block.ids)}
        views = {nd.id: nd.view for nd in block.nodes}

        def rows(table: dict, arcs: list, kind: str) -> torch.Tensor:
            missing = [a for a in arcs if a not in table]
            if missing:
                i, j = missing[0]
                node, other = (i, j) if kind == "out" else (j, i)
                raise ConfigError(
                    f"node {node}: {kind}-arc with node {other} is not in the schedule's arcs; "
                    "the topology changed its graph beyond its period"
                )
            return torch.tensor([table[a] for a in arcs], dtype=torch.int64, device=device)

        self.out_rows = rows(stream._out_row, route.arcs, "out")
        self.in_rows = rows(stream._in_row, route.incoming, "in")
        src = [row_of[i] for i, _ in route.arcs]
        self.src = torch.tensor(src, dtype=torch.int64, device=device)
        dst = [row_of[i] for _, i in route.incoming]
        # − w_ji of out-arc (i, j) (the per-node mix.sub_(o, alpha=w_ji)); w_ij of in-arc (j, i)
        out_w = [-views[i].out_weights[views[i].out_neighbors.index(j)] for i, j in route.arcs]
        self.out_weight = torch.tensor(out_w, dtype=torch.float64, device=device)
        self.in_weight = torch.tensor([views[i].weight_of(j) for j, i in route.incoming],
                                      dtype=torch.float64, device=device)
        self.out_sums = RowSums(src, block.m, device)
        self.in_sums = RowSums(dst, block.m, device)


def send_block_arc_streams(block: Any, streams: Sequence[BlockArcStream],
                           values: Sequence[torch.Tensor],
                           extra: Sequence[torch.Tensor] = ()) -> Any:
    """One per-arc phase over this round's arcs
    (``block.arc_plan()``), each arc's row packing every stream's message and then the raw
    [m, b] uint8 ``extra`` rows of its sender, the bytes a per-node round sends. Each stream's
    part is in ``stream.q`` (:meth:`BlockArcStream.laplacian` decodes it after the yield); the
    extras are ``packed.parts[len(streams):]``, their received rows ``block.received_arcs``."""
    route = block.arc_plan()
    parts = [s.encode(v, route) for s, v in zip(streams, values)]
    src = streams[0].round_of(route).src
    packed = block.pack(parts + [e.index_select(0, src) for e in extra])
    for s, part in zip(streams, packed.parts):
        s.q = part
    return packed
