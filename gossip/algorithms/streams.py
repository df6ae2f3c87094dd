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

Where things live: the copies are tensors in ``node.state`` under the stream's name
(``"sx.h"``, ``"sx.hm"``; per-arc copies as lists ``"sx.out"``, ``"sx.in"``), so checkpoints
save and restore them in place; a stream's own compressor is ``node.stream_compressor(name)``,
which checkpoints save too. :class:`Stream` and :class:`ArcStream` are thin helpers bound to
``(node, name)`` holding scratch buffers only; algorithms keep them in a :class:`PerNode`.

Blocks of nodes (:mod:`gossip.block`): :class:`BlockStream` is the same stream for all of a
process's nodes, its copies [m, d] tensors in ``block.state`` under the same names (mirrored
into each ``node.state``), and :func:`send_block_streams` packs every stream's rows into one
phase. Per-arc copies have no block form: they send a different message to each out-neighbor,
and a block phase sends one row per node.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from gossip.algorithms.base import (
    ConfigError,
    Exchange,
    Inbox,
    Node,
    pack,
    packed_capacity,
    received,
    unpack_inbox,
)

Weights = Callable[[int], float]
"""``m(j)``: the weight node i gives to node j's value (j an in-neighbor, or i itself)."""

T = TypeVar("T")


class PerNode(Generic[T]):
    """What an algorithm keeps per node *outside* ``node.state``: stream helpers, scratch buffers.

    ``node.state`` holds the tensors a checkpoint restores (in place); helpers bound to a node
    and scratch memory reused across rounds live here, keyed by node id, and ``build(node)``
    rebuilds them whenever the node is not the one they were built for (another engine).

    Args:
        build: makes the helpers of a node; called by the algorithm's ``setup`` first (so the
            state tensors the helpers allocate exist before the engine checks them).
    """

    def __init__(self, build: Callable[[Node], T]):
        self._build = build
        self._items: dict[int, tuple[weakref.ref, T]] = {}

    def __call__(self, node: Node) -> T:
        item = self._items.get(node.id)
        if item is None or item[0]() is not node:
            item = (weakref.ref(node), self._build(node))
            self._items[node.id] = item
        return item[1]


def state_tensor(node: Node, key: str) -> torch.Tensor:
    """``node.state[key]``, created at zero (shaped as the model) the first time."""
    t = node.state.get(key)
    if t is None:
        t = node.state[key] = torch.zeros_like(node.x)
    return t


class Stream:
    """One compressed stream of a node (see the module docstring).

    A thin helper bound to ``(node, name)``: the public copies are the tensors
    ``node.state[name + ".h"]`` and ``node.state[name + ".hm"]`` (none for α = 0), so
    checkpoints save them; the helper itself only holds scratch buffers and the message of the
    current round, and can be rebuilt at any time (keep it in a :class:`PerNode`).

    Args:
        node: the node it belongs to (its shape, device, state and compressors).
        name: the stream's name: the prefix of its keys in ``node.state`` and, with
            ``own_compressor``, the name of its compressor.
        alpha: how far the public copy moves toward the reconstructed value, in [0, 1];
            0 keeps no state (time-varying graphs).
        weights: the stream's mixing weights ``m(j)`` (default: the topology's ``w_ij``); looked
            up every round, so they follow the node's current view.
        own_compressor: use ``node.stream_compressor(name)`` instead of the node's main
            compressor (stateful compressors keep one state per stream of messages, and
            checkpoints save it).
    """

    def __init__(
        self,
        node: Node,
        name: str,
        *,
        alpha: float,
        weights: Weights | None = None,
        own_compressor: bool = False,
    ):
        x = node.x
        self.node = node
        self.name = name
        self.alpha = float(alpha)
        self.weights = weights or node.weight
        self.compressor = node.stream_compressor(name) if own_compressor else node.compressor
        self.rng = node.stream_rng(name) if own_compressor else node.rng
        self.h = state_tensor(node, f"{name}.h") if self.alpha > 0 else None
        self.hm = state_tensor(node, f"{name}.hm") if self.alpha > 0 else None
        self.diff = torch.empty_like(x)
        self.z_hat = torch.empty_like(x)
        self.zm_hat = torch.empty_like(x)
        self._q: Any = None

    def encode(self, z: torch.Tensor) -> torch.Tensor:
        """Compress ``z − h``; returns the message bytes (kept for :meth:`receive`)."""
        d = self.diff.copy_(z)
        if self.h is not None:
            d.sub_(self.h)
        self._q = self.compressor.encode(d, self.rng)
        return self._q.to_bytes()

    def capacity(self) -> int:
        """The largest message a neighbor may send on this stream."""
        return self.compressor.max_nbytes(self.node.x)

    def receive(self, inbox: Inbox) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ẑ_i, ẑm_i)`` from this node's last message and the neighbors' ones (sorted by sender).

        The returned tensors are this stream's buffers, valid until the next call.
        """
        comp, q, m = self.compressor, self._q, self.weights
        z_hat, zm_hat = self.z_hat, self.zm_hat
        if self.h is None:
            z_hat.zero_()
            zm_hat.zero_()
        else:
            z_hat.copy_(self.h)
            zm_hat.copy_(self.hm)
        comp.decode_add_(z_hat, q, 1.0)
        comp.decode_add_(zm_hat, q, m(self.node.id))
        for j in sorted(inbox):
            comp.decode_add_(zm_hat, received(comp, inbox, j, zm_hat), m(j))
        if self.h is not None:
            a = self.alpha
            self.h.mul_(1.0 - a).add_(z_hat, alpha=a)
            self.hm.mul_(1.0 - a).add_(zm_hat, alpha=a)
        return z_hat, zm_hat


def send_streams(streams: Sequence[Stream], values: Sequence[torch.Tensor],
                 extra: Sequence[torch.Tensor] = ()) -> Exchange:
    """One exchange carrying every stream's message (and small extra byte buffers), packed."""
    parts = [s.encode(v) for s, v in zip(streams, values)] + list(extra)
    caps = [s.capacity() for s in streams] + [p.numel() for p in extra]
    return Exchange(pack(parts), packed_capacity(caps))


def split_inbox(inbox: Inbox, streams: Sequence[Stream], extra: Sequence[int] = ()) -> list[Inbox]:
    """The per-stream (then per-extra-part) inboxes of a :func:`send_streams` exchange."""
    caps = [s.capacity() for s in streams] + list(extra)
    return unpack_inbox(inbox, len(caps), caps)


def pull_weights(node: Node) -> Weights:
    """Row-stochastic weights ``1/(1 + |N_in(i)|)`` on node i's in-neighbors and itself."""
    def m(j: int) -> float:
        return 1.0 / (1.0 + len(node.view.in_neighbors))
    return m


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


class ArcStream:
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

    The copies are the lists of tensors ``node.state[name + ".out"]`` and
    ``node.state[name + ".in"]``, one per arc in the order of ``outs`` and ``ins``; the helper
    holds scratch buffers only.

    Args:
        node: the node it belongs to.
        name: the prefix of its keys in ``node.state`` (and its compressor's name with
            ``own_compressor``).
        outs: every out-neighbor the node may ever send to (sorted).
        ins: every in-neighbor it may ever receive from (sorted).
        own_compressor: use ``node.stream_compressor(name)`` instead of the main compressor.
    """

    def __init__(self, node: Node, name: str, *, outs: Sequence[int], ins: Sequence[int],
                 own_compressor: bool = False):
        self.node = node
        self.name = name
        self.compressor = node.stream_compressor(name) if own_compressor else node.compressor
        self.rng = node.stream_rng(name) if own_compressor else node.rng
        st = node.state
        for key, ids in ((f"{name}.out", outs), (f"{name}.in", ins)):
            if key not in st:
                st[key] = [torch.zeros_like(node.x) for _ in ids]
        self.out = dict(zip(outs, st[f"{name}.out"], strict=True))
        self.inc = dict(zip(ins, st[f"{name}.in"], strict=True))
        self.diff = torch.empty_like(node.x)
        self.mix = torch.empty_like(node.x)
        self._q: dict[int, Any] = {}

    def _copy(self, table: dict[int, torch.Tensor], j: int, kind: str) -> torch.Tensor:
        copy = table.get(j)
        if copy is None:
            raise ConfigError(
                f"node {self.node.id}: {kind}-arc with node {j} is not in the schedule's arcs "
                f"{sorted(table)}; the topology changed its graph beyond its period"
            )
        return copy

    def encode(self, z: torch.Tensor) -> dict[int, torch.Tensor]:
        """``{j: bytes of C(z − o_ij)}`` for the current out-neighbors."""
        self._q = {}
        out = {}
        for j in self.node.view.out_neighbors:
            d = torch.sub(z, self._copy(self.out, j, "out"), out=self.diff)
            self._q[j] = self.compressor.encode(d, self.rng)
            out[j] = self._q[j].to_bytes()
        return out

    def capacity(self) -> int:
        return self.compressor.max_nbytes(self.node.x)

    def laplacian(self, inbox: Inbox) -> torch.Tensor:
        """Update the copies with this round's messages and return ``D_i`` (a buffer)."""
        comp, view, mix = self.compressor, self.node.view, self.mix.zero_()
        for j, w in zip(view.out_neighbors, view.out_weights):
            o = self._copy(self.out, j, "out")
            comp.decode_add_(o, self._q[j], 1.0)
            mix.sub_(o, alpha=w)
        for j in sorted(inbox):
            c = self._copy(self.inc, j, "in")
            comp.decode_add_(c, received(comp, inbox, j, c), 1.0)
            mix.add_(c, alpha=self.node.weight(j))
        return mix


def send_arc_streams(streams: Sequence[ArcStream], values: Sequence[torch.Tensor],
                     extra: Sequence[torch.Tensor] = ()) -> Exchange:
    """One exchange with a packed message per out-neighbor (one part per arc stream, then the
    small extra byte buffers, the same for every out-neighbor)."""
    per_stream = [s.encode(v) for s, v in zip(streams, values)]
    caps = [s.capacity() for s in streams] + [p.numel() for p in extra]
    send = {j: pack([msgs[j] for msgs in per_stream] + list(extra)) for j in per_stream[0]}
    return Exchange(send, packed_capacity(caps))


# -- blocks of nodes (gossip/block.py) ---------------------------------------------------------
class PerBlock(Generic[T]):
    """What an algorithm keeps per :class:`~gossip.block.Block` outside ``block.state``
    (stream helpers, scratch buffers): ``build(block)`` runs once per block (weakly keyed, so
    another engine's block gets its own)."""

    def __init__(self, build: Callable[[Any], T]):
        self._build = build
        self._items: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, block: Any) -> T:
        item = self._items.get(block)
        if item is None:
            item = self._items[block] = self._build(block)
        return item


class BlockStream:
    """:class:`Stream` for a block of nodes: the same round, every row at once.

    The public copies are the [m, d] tensors ``block.state[name + ".h"]`` and
    ``block.state[name + ".hm"]`` (the engine mirrors their rows into each ``node.state``
    under the per-node keys, so checkpoints are the same); scratch buffers live here.

    Args:
        block: the block it belongs to.
        name: as for :class:`Stream`.
        alpha: as for :class:`Stream`.
        weights: ``weights(node)`` gives node's mixing weights ``m(j)`` (None, or a None
            result for every node: the topology's ``w_ij``, i.e. ``block.plan``). Per-slot
            weights are built from them once per round plan, neighbors in sorted order as
            :class:`~gossip.block.MixPlan` orders them.
        own_compressor: as for :class:`Stream` (``block.stream_compressor(name)``).
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
        self._plan_for: Any = None
        self._plan: Any = None

    def encode(self, z: torch.Tensor) -> Any:
        """Compress every row of ``z − h``: the :class:`~gossip.block.Rows` of this stream."""
        d = torch.sub(z, self.h, out=self.diff) if self.h is not None else self.diff.copy_(z)
        return self.block.encode(d, self.compressor, self.rng)

    def plan(self) -> Any:
        """The round's :class:`~gossip.block.MixPlan` with this stream's weights."""
        block = self.block
        if self.weights is None:
            return block.plan
        if self._plan_for is not block.plan:
            self._plan = _weighted_plan(block, [self.weights(nd) for nd in block.nodes])
            self._plan_for = block.plan
        return self._plan

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
    from gossip.block import MixPlan

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
    """:func:`send_streams` for a block: one phase carrying every stream's rows (then the raw
    [m, b] uint8 ``extra`` rows), the bytes a per-node round sends. Each stream's part is in
    ``stream.q`` (decode it with :meth:`BlockStream.receive` after the yield); the extras are
    ``packed.parts[len(streams):]``."""
    parts = [s.encode(v) for s, v in zip(streams, values)]
    packed = block.pack(parts + list(extra))
    for s, part in zip(streams, packed.parts):
        s.q = part
    return packed
