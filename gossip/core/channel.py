"""Channels: one vector of every node, sent compressed to its neighbors and mixed.

A :class:`Channel` is what an algorithm's round sends and mixes: the compressor and random
stream it encodes with, the memory it keeps (public copies that neighbors rebuild), the mixing
weights and the route (one message per node to all out-neighbors, or one per arc). It owns its
state keys in ``block.state`` (or ``block.arc_state``), so checkpoints save them, and its
buffers: the message is built in the channel's own rows, never in a caller's tensor, so a
caller may change what it sent (``x``, say) before the exchange is decoded; and a copy and its
mix sit in one :meth:`~gossip.core.block.Block.stacked` tensor, so one decode updates both.
A round is::

    q = ch.send(z)                  # q_i = C(z_i − h_i), or C(z_i) without memory
    inbox = yield q                 # (several channels' messages: qa, qb = yield qa, qb)
    z_hat, z_mix = ch.mix(inbox)    # ẑ_i = h_i + q_i,  ẑm_i = hm_i + Σ_j m_ij q_j

For node i the copies are ``h_i`` (public: every out-neighbor rebuilds it from the messages)
and ``hm_i = Σ_j m_ij h_j`` (j over in-neighbors and i itself). After the exchange::

    ẑ_i = h_i + q_i;    ẑm_i = hm_i + Σ_j m_ij q_j
    h_i ← (1 − α) h_i + α ẑ_i;    hm_i ← (1 − α) hm_i + α ẑm_i

so ``hm = M h`` holds exactly at all times and ``ẑm − ẑ`` (:meth:`Channel.gap`) is the
compressed ``(M − I) z``. The channel keeps ``h`` and the gap ``g = hm − h`` rather than ``hm``
itself, and moves them by increments only::

    h_i ← h_i + α q_i;    g_i ← g_i + α (Σ_{j≠i} m_ij q_j + (m_ii − 1) q_i)

``hm`` is of the size of the model while its increments shrink with the consensus error, so a
running ``hm`` loses a rounding of ``‖hm‖`` per round, which accumulates without bound (in
float32 CHOCO's consensus error crept back up as t² after converging); ``g`` shrinks with the
consensus error, so its roundings shrink too, and the gap, the only thing the methods read,
is never a difference of two large numbers. The memory is α:

* ``None`` (or 0): no copies, ``q = C(z)``, ``ẑ = C(z)`` and ``ẑm = M C(z)`` from this round's
  messages only; what a graph that changes every round allows (DIGing, EXTRA, DCD, ECD);
* ``"choco"`` or ``"ef21"`` (α = 1; two names for one update): the copy moves by exactly what
  was sent, so what the compressor dropped stays in ``z − h`` and goes out later (CHOCO's
  public copy ``x̂`` with ``s − x̂ = Σ_j w_ij x̂_j − x̂``; EF21 error feedback in BEER, for biased
  compressors such as top-k). One decode updates both copies in place;
* a float α in (0, 1): the copy is damped (LEAD's and DIANA's state, for unbiased compressors
  of large variance). An extra additive error memory would count the dropped part twice (it
  is already in ``z − h``); measured, it diverged where these forms converge.

With the identity compressor ``ẑ = z`` and ``ẑm = M z`` for any α.

A round in which only some nodes send (an event trigger) is ``inbox = yield from
ch.send_if(z, sending)``, then :meth:`Channel.update`: a silent node's copy stays where it is,
at its neighbors too (one flag byte per arc first, so receivers know which messages come).

On a graph that changes every round, or on a network that loses messages, ``route="arcs"``
(or an :class:`ArcRoute` with its options) keeps one copy per arc instead
(``block.arc_state[name + ".out"]``, ``[name + ".in"]``), held by both ends of the arc and
updated by both only when its message is delivered (acknowledged), and sends one message per
current arc: see :class:`_ArcCopies`; there :meth:`Channel.gap` is the compressed
``(W(t) − I) z`` and its sum over the nodes is zero whatever was lost. The same round code
runs either route: a method's robust per-arc form (``choco-arcs``, ...) is its channels built
with ``route=self.route(...)`` (:meth:`gossip.core.algorithm.Algorithm.route`).

Precision. The node sum of the gaps, ``Σ_i g_i``, is zero in exact arithmetic (``M`` is column
stochastic); what rounding leaves of it stays in ``g`` for good, and a method that integrates
the gap (CHOCO's model, LEAD's dual, a tracker) moves by it every round: the average of a
consensus wanders off, an exact method's optimum drifts. So the increments are summed, and
``h`` and ``g`` kept, in a wider dtype than a 16- or 32-bit model's (:data:`WIDER`): every
message is decoded once in the model's dtype, then weighted and added in the wider one
(:class:`_WideMix`); what is left is a rounding of the wider dtype, far below anything the
model sees. Methods read the gap in the model's dtype. Float64 models have no wider dtype:
their error stays flat too, their average may move by about an ulp of the model per round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import increment_version

from gossip.compress import dispatch, jit
from gossip.core.cache import IdentityCache
from gossip.core.routing import ArcPlan, MixPlan, RowSums
from gossip.errors import ConfigError
from gossip.rng import Stream

Weights = Callable[[int], float]
"""``m(j)``: the weight node i gives to node j's value (j an in-neighbor, or i itself)."""

WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}
"""The dtype a channel keeps its copies and sums its gap in, per model dtype."""

MEMORY = {"choco": 1.0, "ef21": 1.0}
"""The named memories (both: the copy moves by the whole message)."""


def _alpha(memory: float | str | None) -> float:
    if memory is None:
        return 0.0
    if isinstance(memory, str):
        if memory not in MEMORY:
            raise ConfigError(f"memory {memory!r} is not one of None, 'choco', 'ef21' or a "
                              "number in [0, 1]")
        return MEMORY[memory]
    alpha = float(memory)
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"memory alpha = {alpha} is outside [0, 1]")
    return alpha


@dataclasses.dataclass(frozen=True)
class ArcRoute:
    """A channel routed per arc (``Channel(route=ArcRoute(...))``; ``route="arcs"`` is
    ``ArcRoute()``): one copy per arc, held by both ends and moved by both only when its
    message is delivered, and one message per arc (:class:`_ArcCopies`).

    Attributes:
        keys: the ``block.arc_state`` keys of the out- and in-arc copies (default
            ``name + ".out"``, ``name + ".in"``; a ``{j}`` in a key names a node's checkpoint
            entry by the neighbor, as :meth:`~gossip.core.block.Block.node_state` does).
        draws: what a randomized compressor draws from: ``"arc"`` (the arc's own stream) or
            ``"sender"`` (the sender's numbers of the channel's node stream, shared by its
            arcs: without loss the copies of a node's out-arcs stay equal and the run is the
            broadcast channel's to rounding).
        stream: the name of the arcs' streams with ``draws="arc"`` (default: the channel's).
    """

    keys: tuple[str, str] | None = None
    draws: str = "arc"
    stream: str | None = None

    def __post_init__(self) -> None:
        if self.draws not in ("arc", "sender"):
            raise ConfigError(f"ArcRoute(draws={self.draws!r}): use 'arc' or 'sender'")


class Channel:
    """One compressed vector of every node of a block (see the module docstring).

    Args:
        block: the block it belongs to (:class:`~gossip.core.block.Block`); build channels in
            ``setup`` and keep them in ``block.workspace``.
        name: the channel's name: the prefix of its default state keys, the name of its
            compressor and random stream with ``own_compressor``, and of its arcs' streams.
        memory: ``None``, ``"choco"``, ``"ef21"`` or α in [0, 1] (module docstring).
        keys: the ``block.state`` keys of the copy ``h`` and the gap ``g = hm − h`` (default
            ``name + ".h"``, ``name + ".gap"``), with the broadcast route; a per-arc route
            names its copies itself (:attr:`ArcRoute.keys`). Tensors already under these keys
            are used as they are.
        weights: ``weights(node)`` gives node's mixing weights ``m(j)`` (None, or a None result
            for every node: the topology's ``w_ij``). The weighted plan is built once per round
            plan, neighbors in sorted order as :class:`~gossip.core.routing.MixPlan` orders them.
        own_compressor: encode with ``block.stream_compressor(name)`` and
            ``block.stream_rng(name)`` instead of the block's main compressor and streams
            (stateful compressors keep one state per stream of messages).
        route: ``"broadcast"`` (one message per node to all its out-neighbors), ``"arcs"`` or
            an :class:`ArcRoute` (one copy and one message per arc, shared by its two ends:
            for graphs that change every round, and for lossy networks, where both ends apply
            a message only when it was delivered; the topology's weights, a stateless
            compressor).

        compressor: a stateless compressor of this channel's own instead of the run's (e.g.
            ``make("none")`` for a phase of exact values, as DCD's replicas start), drawing
            from the block's main streams.
    """

    def __init__(self, block: Any, name: str, *, memory: float | str | None = None,
                 keys: tuple[str, str] | None = None,
                 weights: Callable[[Any], Weights | None] | None = None,
                 own_compressor: bool = False, route: str | ArcRoute = "broadcast",
                 compressor: Any = None):
        self.block = block
        self.name = name
        self.alpha = _alpha(memory)
        self.weights = weights
        if compressor is not None and own_compressor:
            raise ConfigError(f"channel {name!r}: give compressor= or own_compressor=True, not both")
        self.compressor = (compressor if compressor is not None else
                           block.stream_compressor(name) if own_compressor else block.compressor)
        self.rng = block.stream_rng(name) if own_compressor else block.rng
        self.arcs: _ArcCopies | None = None
        self.wide: torch.dtype | None = WIDER.get(block.x.dtype)
        """The dtype the copies and the gap are kept and summed in when it is wider than the
        model's (module docstring: "Precision"); None for float64 models."""
        self.copy: torch.Tensor | None = None
        """``h``, the public copies ([m, d], in ``block.state``; None without memory)."""
        self.diff: torch.Tensor | None = None
        """``g = hm − h = (M − I) h``, the gap of the mixed copies ([m, d], in ``block.state``;
        None without memory)."""
        if route == "arcs":
            route = ArcRoute()
        if isinstance(route, ArcRoute):
            if weights is not None and any(weights(nd) is not None for nd in block.nodes):
                raise ConfigError(f"channel {name!r}: per-arc copies mix with the topology's "
                                  "weights")
            self.arcs = _ArcCopies(self, route.keys or (f"{name}.out", f"{name}.in"),
                                   route.draws, route.stream or name)
        elif route != "broadcast":
            raise ConfigError(f"channel {name!r}: route {route!r} is not 'broadcast', 'arcs' or "
                              "an ArcRoute")
        elif self.alpha > 0:
            self.copy, self.diff = self._copies(keys or (f"{name}.h", f"{name}.gap"))
        self._send: torch.Tensor | None = None  # the rows a message is built in
        self._pair: list[torch.Tensor] | None = None  # decoded terms (memoryless: ẑ, ẑm)
        self._hat: torch.Tensor | None = None  # ẑ, ẑm returned by mix() of a channel with copies
        self._mixed: torch.Tensor | None = None
        self._gap: torch.Tensor | None = None
        self._own: torch.Tensor | None = None
        self._plans = IdentityCache(limit=4)  # the weighted plan per round plan
        self._gap_plans = IdentityCache(limit=4)  # its gap plan (own weight m_ii − 1)
        self._wide_mixes = IdentityCache(limit=4)  # per gap plan, with a wider dtype

    def _copies(self, keys: tuple[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``h`` and ``g`` under ``keys`` in ``block.state``, allocated zero if absent: as one
        :meth:`~gossip.core.block.Block.stacked` tensor when α = 1, where one decode moves
        both in place."""
        st = self.block.state
        if keys[0] not in st or keys[1] not in st:
            if self.wide:
                st[keys[0]], st[keys[1]] = (torch.zeros_like(self.block.x, dtype=self.wide)
                                            for _ in range(2))
            elif self.alpha == 1.0:
                st[keys[0]], st[keys[1]] = self.block.stacked(2)
            else:
                st[keys[0]], st[keys[1]] = (torch.zeros_like(self.block.x) for _ in range(2))
        return st[keys[0]], st[keys[1]]

    def _buffer(self, attr: str, like: torch.Tensor | None = None) -> torch.Tensor:
        """The channel's [m, d] buffer ``attr`` (allocated on first use, contiguous, in the
        dtype of ``like``: default the model's)."""
        buf = getattr(self, attr)
        if buf is None:
            x = self.block.x
            buf = torch.empty(x.shape, dtype=(x if like is None else like).dtype, device=x.device)
            setattr(self, attr, buf)
        return buf

    def _send_rows(self) -> torch.Tensor:
        """Where a message is built: rows of its own (contiguous, as a fresh [m, d] tensor, so
        a compressor sees the layout it would see in a per-node run); message rows when the
        compressor sends values in place (``none``), so only the headers are written."""
        if self._send is None:
            x = self.block.x
            if self.compressor.sends_values_in_place:
                self._send = self.block.message_tensor(x.shape[1], x.dtype, x.device)
            else:
                self._send = self._buffer("_send")
        return self._send

    # -- a round ---------------------------------------------------------------------------
    def send(self, z: torch.Tensor) -> Any:
        """Encode every row of ``z − h`` (``z`` without memory): the
        :class:`~gossip.core.staging.Rows` to ``yield`` (alone or with other channels').

        The message is built in the channel's own rows, so ``z`` may change right away. A
        contiguous, 64-byte aligned ``z`` of a memoryless channel (a fresh tensor's layout) is
        encoded where it is when the compressor copies it into the message anyway; and with
        ``none``, ``block.x`` (already in message rows) goes out from its own memory, so
        decode (:meth:`mix`) before changing it, as :meth:`Block.encode` says."""
        if self.arcs is not None:
            return self.arcs.send(z)
        block = self.block
        if self.copy is not None and self.wide:  # z − h with h rounded to z's dtype
            d = self._send_rows().copy_(self.copy)
            torch.sub(z, d, out=d)
        elif self.copy is not None:
            d = torch.sub(z, self.copy, out=self._send_rows())
        elif block.in_message_rows(z):
            d = z  # block.x: with none only the headers are written, else it is encoded as it is
        elif (self.compressor.sends_values_in_place or not z.is_contiguous()
              or z.data_ptr() % 64):
            d = self._send_rows().copy_(z)
        else:
            d = z
        return block.encode(d, self.compressor, self.rng)

    def send_if(self, z: torch.Tensor, sending: list[bool]) -> Any:
        """A round in which only some nodes send (an event trigger): a generator, ``inbox =
        yield from ch.send_if(z, sending)``, then :meth:`update` or :meth:`gap` as usual.

        ``sending[r]`` says whether row r sends ``C(z_r − h_r)`` this round; a node that does
        not send leaves its copy ``h_r`` where it is, at its neighbors too (the same as a zero
        message, without its bytes). Receivers must know which messages come, so the round has
        two phases: one byte per arc of the graph (the sender's flag), then one message per arc
        out of the nodes that send, every arc of a node carrying the same message (drawn from
        the sender's numbers of the channel's stream, as a broadcast would). The flags' bytes
        count with the messages'. Broadcast channels with ``"choco"``/``"ef21"`` memory and the
        topology's weights only."""
        block = self.block
        if self.arcs is not None or self.alpha != 1.0 or self.weights is not None:
            raise ConfigError(f"channel {self.name!r}: send_if needs a broadcast channel with "
                              "'choco' or 'ef21' memory and the topology's weights")
        if len(sending) != block.m:
            raise ConfigError(f"send_if: {len(sending)} flags for {block.m} rows")
        flags = block.arc_plan()
        rows = block.message_rows(1, flags)
        row_of = {i: r for r, i in enumerate(block.ids)}
        for a, (i, _) in enumerate(flags.arcs):
            rows.mine()[a, 0] = int(bool(sending[row_of[i]]))
        got = yield rows
        on = {i for i, r in row_of.items() if sending[r]}
        on.update(j for (j, _), f in zip(flags.incoming, block.received_arcs(got)[:, 0].tolist(),
                                         strict=True) if f)
        route = block.arc_plan([a for a in flags.arcs + flags.incoming if a[0] in on])
        if self.wide:  # z − h with h rounded to z's dtype, as send() builds it
            d = self._send_rows().copy_(self.copy)
            torch.sub(z, d, out=d)
        else:
            d = torch.sub(z, self.copy, out=self._send_rows())
        if self.compressor.stateful:  # each sender's own instance, once, copied to its arcs
            return (yield self._stateful_rows(d, route, row_of))
        src = torch.tensor([row_of[i] for i in route.senders], dtype=torch.int64,
                           device=z.device)
        rng = Stream(block.seed, list(route.senders), self.rng.stream)
        rng.sync(self.rng)  # the senders' numbers at the node stream's (round, call)
        return (yield block.encode(d.index_select(0, src), self.compressor, rng, route=route))

    def _stateful_rows(self, d: torch.Tensor, route: ArcPlan, row_of: dict[int, int]) -> Any:
        """:meth:`send_if`'s messages with a compressor that keeps state per node (low-rank):
        each sender encodes with its own instance (only senders advance their state) and its
        message is copied to its arcs, as raw rows."""
        block, comp = self.block, self.compressor
        rows = block.message_rows(comp.nbytes_rows(d[0]), route)
        mine = rows.mine()
        for i in sorted(set(route.senders)):
            r = row_of[i]
            nd = block.nodes[r]
            c = nd.compressor if comp is block.compressor else nd.stream_compressor(self.name)
            mine[route.out_rows(i)] = c.encode(d[r], self.rng.row(r)).to_bytes()
        return rows

    def _move_some(self, q: Any) -> None:
        """:meth:`_move` for the messages of :meth:`send_if`: ``h_i += C(q_i)`` and
        ``g_i += (w_ii − 1) C(q_i)`` for the rows that sent (decoded from their first arc),
        then ``g_i += w_ij C(q_j)`` for each message that came in, in sorted order; weighted
        and summed in the copies' dtype."""
        block, route, comp = self.block, q.route, self.compressor
        x = block.x
        row_of = {i: r for r, i in enumerate(block.ids)}
        first: dict[int, int] = {}
        for a, i in enumerate(route.senders):
            first.setdefault(i, a)
        wide = self.copy.dtype
        if first:
            own = torch.tensor(list(first.values()), dtype=torch.int64, device=x.device)
            rows = torch.tensor([row_of[i] for i in first], dtype=torch.int64, device=x.device)
            dec = torch.zeros((len(first), x.shape[1]), dtype=x.dtype, device=x.device)
            comp.decode_add_rows_(dec, q.mine().index_select(0, own), check=False)
            dec = dec.to(wide)
            self.copy.index_add_(0, rows, dec)
            w_own = self.plan().self_weight.index_select(0, rows.cpu()).to(wide) - 1.0
            self.diff.index_add_(0, rows, dec.mul_(w_own.to(x.device).view(-1, 1)))
        if route.incoming:
            W = block.topology.W
            dec = torch.zeros((len(route.incoming), x.shape[1]), dtype=x.dtype, device=x.device)
            comp.decode_add_rows_(dec, block.received_arcs(q))  # checked: raw rows are not
            w = torch.tensor([float(W[i, j]) for j, i in route.incoming], dtype=torch.float64)
            dec = dec.to(wide).mul_(w.to(device=x.device, dtype=wide).view(-1, 1))
            self.diff.index_add_(0, route.in_dst, dec)

    def mix(self, inbox: Any, *, into: tuple[torch.Tensor | None, torch.Tensor] | None = None,
            scale: float = 1.0, own_weight: torch.Tensor | None = None, add: bool = True,
            alpha: float | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(ẑ, ẑm)`` for every row from this channel's exchanged messages ``inbox`` (what the
        ``yield`` gave back for its part), the own message first, then the neighbors' in sorted
        order; the copies move by α. Buffers of the channel valid until its next :meth:`mix`:
        read them, do not write into them. A channel with copies that needs only the gap, or
        nothing, calls :meth:`gap` or :meth:`update` instead (no pass to build ``ẑm``).

        ``into=(a, b)`` (memoryless channels) adds instead ``C(q_i)`` to ``a`` (None: skipped)
        and ``scale·(m_ii·C(q_i) + Σ_j m_ij·C(q_j))`` to ``b`` (``own_weight`` replaces
        ``m_ii``), straight into the caller's tensors: DCD's ``x += ẑ``, ``s += ẑm``; with
        ``add=False`` that sum is written into ``b`` instead of added to it; with ``alpha``,
        ``alpha·sum`` is added to ``b``, which may be the tensor the messages were sent from
        (gossip's ``x ← x + γ·(mix)``: one pass in place for dense rows; the roundings are
        :meth:`Block.mix_into`'s)."""
        if self.arcs is not None:
            raise ConfigError(f"channel {self.name!r} keeps copies per arc: it has no ẑ, ẑm "
                              "per node; use gap(inbox)")
        block, plan = self.block, self.plan()
        if into is not None:
            if self.copy is not None:
                raise ConfigError(f"channel {self.name!r} keeps copies: mix(into=) is for "
                                  "memoryless channels")
            a, b = into
            block.mix_into(b, inbox, inbox, copy=a, scale=scale, own_weight=own_weight, plan=plan,
                           add=add, alpha=alpha)
            return a, b
        if scale != 1.0 or own_weight is not None or not add or alpha is not None:
            raise ConfigError("scale, own_weight, add and alpha go with into=")
        if self.copy is None:
            if self._pair is None:
                self._pair = block.stacked(2)  # one decode for both (mix_into's copy=)
            z_hat, z_mix = self._pair
            z_hat.zero_()
            block.mix_into(z_mix, inbox, inbox, copy=z_hat, plan=plan, add=False)
            return z_hat, z_mix
        # ẑ = h + C(q_i), ẑm = ẑ + g + Σ_j m_ij C(q_j) − C(q_i), from the copies before the move
        z_hat, z_mix = self._buffer("_hat"), self._buffer("_mixed")
        if self.alpha == 1.0:
            gap = self.gap(inbox)  # moves the copies
            z_hat.copy_(self.copy)
        else:  # ẑ = h + C(q_i) with the copy before it moves
            d_hat, d_gap = self.increments(inbox)
            z_hat.copy_(self.copy).add_(z_mix.copy_(d_hat))
            gap = self._move_gap(d_hat, d_gap)
        return z_hat, torch.add(z_hat, gap, out=z_mix)

    def update(self, inbox: Any) -> None:
        """Move the copies by this channel's exchanged messages ``inbox`` and nothing else:
        CHOCO's order, whose next round mixes the copies as they are (:meth:`gap` without
        inbox). Per arc, both ends' copies of the delivered arcs only."""
        if self.arcs is not None:
            self.arcs.update(inbox)
        elif self.copy is None:
            raise ConfigError(f"channel {self.name!r} keeps no copies: there is nothing to update")
        elif isinstance(inbox.route, ArcPlan):  # the messages of send_if
            self._move_some(inbox)
        else:
            self._move(inbox)

    def gap(self, inbox: Any = None) -> torch.Tensor:
        """``ẑm − ẑ``, the compressed ``(M − I) z``, after moving the copies by ``inbox``
        (:meth:`mix`); per arc, ``Σ_in w_ij ĉ_ji − Σ_out w_ji ô_ij`` (:class:`_ArcCopies`).
        Without ``inbox``: the gap ``g = hm − h`` of the copies as they are, per arc
        ``Σ_in w_ij c_ji − Σ_out w_ji o_ij`` (CHOCO's consensus step with the last round's
        copies). Read it, do not write into it: the copies' own gap when α = 1 or without
        ``inbox``, else a buffer of the channel valid until its next ``send``, ``mix`` or
        ``gap``."""
        if self.arcs is not None:
            return self.arcs.laplacian(inbox)
        if inbox is None:
            if self.copy is None:
                raise ConfigError(f"channel {self.name!r} keeps no copies: gap() needs the inbox")
            return self._narrow(self.diff)
        if self.copy is None and not self.wide:  # Σ_{j≠i} m_ij C(q_j) + (m_ii − 1) C(q_i)
            out = self._buffer("_gap")
            self.block.mix_into(out, inbox, inbox, plan=self.gap_plan(), add=False)
            return out
        if self.copy is None:
            return self._narrow(self.increments(inbox)[1])
        if self.alpha == 1.0:
            self._move(inbox)
            return self._narrow(self.diff)
        return self._move_gap(*self.increments(inbox))

    def _move_gap(self, d_hat: torch.Tensor, d_gap: torch.Tensor) -> torch.Tensor:
        """Move the copies by α of the increments (:meth:`increments`); returns ``ẑm − ẑ``
        (``g`` + the increment) in the model's dtype."""
        out = d_gap.add_(self.diff)
        self.copy.add_(d_hat, alpha=self.alpha)
        self.diff.lerp_(out, self.alpha)  # g + α·increment (a rounding of the small gap)
        return self._narrow(out)

    def _narrow(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in the model's dtype: itself, or rounded into a buffer of the channel."""
        if t.dtype == self.block.x.dtype:
            return t
        return self._buffer("_gap").copy_(t)

    def _move(self, inbox: Any) -> None:
        """Move ``h`` by ``α·C(q_i)`` and ``g`` by ``α·(Σ_{j≠i} m_ij C(q_j) + (m_ii − 1) C(q_i))``:
        with α = 1 (and the copies in the model's dtype) decoded straight into both, in one
        decode when they are one stacked tensor."""
        if self.alpha == 1.0 and self.wide:
            self._wide_mix()(inbox, into=(self.copy, self.diff))
        elif self.alpha == 1.0:
            self.block.mix_into(self.diff, inbox, inbox, copy=self.copy, plan=self.gap_plan())
        else:
            self._move_gap(*self.increments(inbox))

    def increments(self, inbox: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``C(q_i)`` and ``Σ_{j≠i} m_ij C(q_j) + (m_ii − 1) C(q_i)`` of every row, in buffers of
        the channel valid until the next decode: with a wider dtype (:attr:`wide`) every message
        is decoded once in the model's dtype and the weighted sums are taken in the wider one
        (:class:`_WideMix`), else both are decoded in the model's dtype."""
        if self.wide:
            return self._wide_mix()(inbox)
        if self._pair is None:
            self._pair = self.block.stacked(2)
        d_hat, d_gap = self._pair
        d_hat.zero_()
        self.block.mix_into(d_gap, inbox, inbox, copy=d_hat, plan=self.gap_plan(), add=False)
        return d_hat, d_gap

    def _wide_mix(self) -> _WideMix:
        """The round's :class:`_WideMix` (cached per gap plan)."""
        return self._wide_mixes.get(self.gap_plan(), lambda: _WideMix(self))

    def decoded(self, q: Any) -> torch.Tensor:
        """``C(q_i)``: every node's own message of ``q`` decoded (e.g. DeepSqueeze's error
        ``v − C(v)`` at send time); a buffer of the channel, valid until the next call."""
        return self.block.decode(q, out=self._buffer("_own"))

    def rows_of(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s rows laid out as this channel's messages: ``t`` itself (one per node), or,
        per arc, the sender's row for every current arc (raw rows sent with the message, e.g.
        push-sum's weights: ``yield ch.send(s), ch.rows_of(w)``)."""
        if self.arcs is None:
            return t
        return t.index_select(0, self.arcs.round_of(self.block.arc_plan()).src)

    def plan(self) -> MixPlan:
        """The round's :class:`~gossip.core.routing.MixPlan` with this channel's weights."""
        block = self.block
        if self.weights is None:
            return block.plan
        return self._plans.get(block.plan, lambda: _weighted_plan(
            block, [self.weights(nd) for nd in block.nodes]))

    def gap_plan(self) -> MixPlan:
        """:meth:`plan` with every own weight ``m_ii − 1``: its mix is ``(M − I)`` applied to the
        messages, the increment of the gap ``g``."""
        plan = self.plan()
        return self._gap_plans.get(plan, lambda: dataclasses.replace(
            plan, self_weight=plan.self_weight - 1.0, cache={}))



class _WideMix:
    """A round's :meth:`Channel._increments` summed in the channel's wider dtype.

    Every message the round's gap plan uses (the block's own and the received ones) is decoded
    once, unweighted, in the model's dtype; then, per row, ``(m_ii − 1)·C(q_i)`` and each
    neighbor's ``m_ij·C(q_j)`` in sorted order are multiplied and added in the wider dtype (the
    order of a per-node run: in process and under MPI the same numbers). The node sum of the
    increments, zero in exact arithmetic (``M`` is column stochastic), is then off by a rounding
    of the wider dtype, which a dual or tracker fed by the gap can integrate for 10⁸ rounds and
    more before a float32 model sees it.
    """

    def __init__(self, channel: Channel):
        block, plan = channel.block, channel.gap_plan()
        m, x = block.m, block.x
        device = x.device
        srcs = [s for s, _, _ in plan.slots]
        used = torch.unique(torch.cat([torch.arange(m, device=device), *srcs]))  # sorted
        pos = torch.full((int(used.max()) + 1,), -1, dtype=torch.int64, device=device)
        pos[used] = torch.arange(used.numel(), device=device)
        first = int(used[0])
        self.span = (slice(first, first + used.numel())
                     if torch.equal(used.cpu(), torch.arange(first, first + used.numel())) else None)
        self.used = used
        self.ones = torch.ones(used.numel(), dtype=torch.float64, device=device)
        self.slots = [(pos[s], d, w[:, None]) for s, d, w in plan.slots]
        self.own_weight = plan.self_weight[:, None]
        self.block = block
        self.plan = plan
        self.wide = channel.wide
        self.decoded = torch.empty((used.numel(), x.shape[1]), dtype=x.dtype, device=device)
        self.rows = torch.empty((m, x.shape[1]), dtype=x.dtype, device=device)
        self.term = torch.empty((m, x.shape[1]), dtype=self.wide, device=device)
        self._out: tuple[torch.Tensor, torch.Tensor] | None = None
        self.kernel = None  # the numba kernel, for long float32 rows on the CPU
        if device.type == "cpu" and x.dtype == torch.float32 and dispatch.jit_long(x.shape[1]):
            self.kernel = dispatch.jit_kernel("wide_gap")
            every = torch.arange(m, device=device)
            src = torch.cat([p for p, _, _ in self.slots] or [every[:0]])
            dst = torch.cat([every if d is None else d for _, d, _ in self.slots] or [every[:0]])
            w = torch.cat([w.reshape(-1) for _, _, w in self.slots] or [plan.self_weight[:0]])
            order = torch.sort(dst, stable=True).indices  # per row, its terms in slot order
            indptr = torch.zeros(m + 1, dtype=torch.int64)
            indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=m), 0)
            self.csr = (plan.self_weight.numpy(), indptr.numpy(), src[order].numpy(),
                        w[order].numpy())

    def __call__(self, inbox: Any, into: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(C(q_i), Σ_{j≠i} m_ij C(q_j) + (m_ii − 1) C(q_i))`` in the wider dtype: written into
        buffers of its own, or added to the tensors ``into`` (the copies ``h``, ``g`` when they
        move by the whole message). Each product is rounded, then each sum, in the order of a
        per-node run (own term, then the neighbors sorted); the numba kernel
        (:func:`gossip.compress.jitkernels.wide_gap`) does it in one pass per term, its torch
        twin with operands of one dtype only (torch's mixed-dtype kernels run 10-30x slower)."""
        dec, block, term = self.decoded, self.block, self.term
        dec.zero_()
        block._decode_from(inbox.compressor, dec, inbox, self.used, self.span, self.ones, None)
        if into is None:
            if self._out is None:
                self._out = (torch.empty_like(term), torch.empty_like(term))
            hat, gap = self._out
        else:
            hat, gap = into
        if self.kernel is not None and hat.is_contiguous() and gap.is_contiguous():
            own_w, indptr, src, w = self.csr
            self.kernel(dec.numpy().reshape(-1), own_w, indptr, src, w, hat.numpy().reshape(-1),
                        gap.numpy().reshape(-1), dec.shape[1], into is not None, jit.TOPK_CHUNK)
            increment_version(hat)
            increment_version(gap)
            if inbox.noise is not None:  # a noisy channel (Block.mix_into's)
                inbox.noise.add_mixed(gap, self.plan, 1.0)
            return hat, gap
        own = dec[: block.m]  # the own rows come first among the used ones
        if into is None:
            hat.copy_(own)
            torch.mul(hat, self.own_weight, out=gap)
        else:
            own = term.copy_(own)
            hat.add_(own)
            gap.add_(own.mul_(self.own_weight))
        for src, dst, w in self.slots:
            k = src.numel()
            wide = term[:k].copy_(torch.index_select(dec, 0, src, out=self.rows[:k])).mul_(w)
            if dst is None:  # every row has a k-th neighbor
                gap.add_(wide)
            else:
                gap.index_add_(0, dst, wide)
        if inbox.noise is not None:  # a noisy channel: Σ_j m_ij σ z_ji (Block.mix_into's)
            inbox.noise.add_mixed(gap, self.plan, 1.0)
        return hat, gap


def _weighted_plan(block: Any, weights: list[Weights | None]) -> MixPlan:
    """``block.plan`` with the weights ``weights[r](j)`` of each row r (None: ``w_ij``)."""
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


# -- per-arc copies ----------------------------------------------------------------------------
def check_stateless(name: str, compressor: Any) -> None:
    """Per-arc channels send one message per arc: refuse compressors that keep state per
    stream (an algorithm's ``validate``, before any message)."""
    if getattr(compressor, "stateful", False):
        raise ConfigError(f"{name} keeps one copy per arc and sends one message per arc; "
                          f"'{compressor.spec}' keeps state per stream: use a stateless "
                          "compressor (topk, qsgd, lead, sign, ...)")


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


def schedule_plan(block: Any, topology: Any) -> ArcPlan:
    """The :class:`~gossip.core.routing.ArcPlan` of every arc into or out of the block's
    nodes over the whole schedule (:func:`arcs_over_schedule`): the rows of per-arc copies."""
    arcs = []
    for i in block.ids:
        outs, ins = arcs_over_schedule(topology, i)
        arcs += [(i, j) for j in outs] + [(j, i) for j in ins]
    return ArcPlan.build(arcs, block.ids, block.x.device)


class _ArcCopies:
    """A channel's copies kept per arc: one public copy per arc, shared by its two ends.

    Node i keeps, for every out-neighbor j it may send to, the copy ``o_ij`` of its value that
    j holds, and for every in-neighbor j the copy ``c_ji`` of j's value (all zero at the start;
    the arcs are those of a whole period, :func:`arcs_over_schedule`: on a one-peer exponential
    graph ⌈log₂ n⌉ of each; on a static graph its neighbors). In a round with weights ``W(t)``,
    ``δ_ij`` = 1 when the message of arc (i, j) is delivered (always, without loss), 0 when lost::

        q_ij = C(z_i − o_ij) to each current out-neighbor j
        ô_ij = o_ij + δ_ij q_ij;   ĉ_ji = c_ji + δ_ji q_ji         (the reconstructions)
        o_ij ← (1 − α) o_ij + α ô_ij;   c_ji ← (1 − α) c_ji + α ĉ_ji
        D_i = Σ_{j ∈ N_in(i)} w_ij ĉ_ji − Σ_{j ∈ N_out(i)} w_ji ô_ij

    A lost message changes neither end (the engine's ``"ack"`` delivery: the sender reads
    ``route.out_delivered``, the receiver decodes only what arrived), so ``o_ij`` at i and
    ``c_ij`` at j are always the same value. Under partial activation an arc with a sleeping
    end (:attr:`~gossip.core.block.Block.active_nodes`) is left out of ``D`` at its active end
    as well (a silent arc is not delivered, so neither copy moves):
    the sleeping end's round is undone (:mod:`gossip.network.activity`), so its term would
    enter one end's sum only. ``D`` is the compressed ``(W(t) − I) z`` (exactly
    that with the identity compressor, a doubly stochastic W(t) and no loss), and
    ``Σ_i D_i = 0`` whatever the compressor and the losses: each arc's reconstruction enters
    once with + at the receiver and once with − at the sender, with the same weight. So
    averages (or trackers, or LEAD's dual sum) are preserved on time-varying graphs, where a
    single shared copy per node could not be kept up to date, and on lossy networks. The
    memory α is the channel's (1: the copies move by the whole message, EF21-style).
    One message per current arc (a per-arc phase, :meth:`~gossip.core.block.Block.arc_plan`).

    The copies are per-arc state over the arcs of a whole period (:func:`schedule_plan`):
    ``block.arc_state[keys[0]]`` has a row per arc the block's nodes may send on (``o_ij``),
    ``block.arc_state[keys[1]]`` a row per arc they may receive on (``c_ji``); node i's
    ``state[keys[0]]`` / ``[keys[1]]`` are the [k, d] views of its arcs, in the order of its
    sorted out- / in-neighbors over the schedule. A randomized compressor draws, with
    ``draws="arc"``, from the arc's stream (``block.arc_rng(route, stream)``, ``stream`` the
    :class:`ArcRoute`'s, by default the channel's name); with
    ``draws="sender"``, every arc of node i draws node i's numbers of the channel's node stream
    (the draws a broadcast channel would make, shared by i's arcs: without loss the copies of
    i's out-arcs stay equal and the run is the broadcast channel's to rounding).

    Late messages (``stale=``, :mod:`gossip.network.stale`). A message sent in round s is handed
    to its receiver in a later round, and messages on an arc are handed over in the order they
    were sent (its sequence number is its send round s). The sender then keeps two copies per
    out-arc: the *sent* copy ``o_ij``, moved at send time by every delivered message (what the
    messages are computed against: ``q_ij = C(z_i − o_ij)``, the receiver's copy plus the
    increments in flight), and the *acknowledged* copy ``a_ij`` (:attr:`acked`), moved by a
    message in the round its receiver is handed it (both ends compute that round from the same
    keyed lag draws, as they know a loss). At the end of every round, with ``F_ij`` the
    messages of arc (i, j) delivered and not yet handed over::

        c_ij (at j) = a_ij (at i)                      bit for bit
        o_ij        = c_ij + α Σ_{q ∈ F_ij} C(q)       to rounding

    A lost message moves none of them, so its content stays in ``z_i − o_ij`` and the next
    message carries it. A round hands over ``Δ_ij``, the sum of the messages due (none, one or
    several): ``ĉ_ij = c_ij + Δ_ij``, ``c_ij ← c_ij + α Δ_ij``, and ``â_ij``, ``a_ij`` alike;
    ``D_i`` sums ``ĉ`` and ``â``, so ``Σ_i D_i = 0`` still holds every round.
    """

    def __init__(self, channel: Channel, keys: tuple[str, str], draws: str, stream: str):
        block = channel.block
        x = block.x
        self.channel = channel
        self.draws = draws
        self.stream = stream
        self.schedule = schedule = schedule_plan(block, block.topology)
        st = block.arc_state
        for key, rows, incoming in ((keys[0], len(schedule.arcs), False),
                                    (keys[1], len(schedule.incoming), True)):
            if key not in st:
                st[key] = x.new_zeros(rows, x.shape[1])
            block.arc_routes[key] = (schedule, incoming)
        self.out, self.inc = st[keys[0]], st[keys[1]]
        self._out_row = {arc: a for a, arc in enumerate(schedule.arcs)}
        self._in_row = {arc: e for e, arc in enumerate(schedule.incoming)}
        self.mix = torch.empty_like(x)
        self.acked: torch.Tensor | None = None
        """``a_ij``, the copy of each out-arc its receiver holds, under ``stale=`` only (class
        docstring, "Late messages"; None otherwise, where it is ``o_ij`` itself)."""
        self._rounds = IdentityCache()
        self._senders = IdentityCache()

    def round_of(self, route: ArcPlan) -> _ArcRound:
        """The row maps and sums of a round's arcs (cached per route)."""
        return self._rounds.get(route, lambda: _ArcRound(self, route))

    def _rng(self, route: ArcPlan) -> Stream:
        """The stream a round's messages draw from (class docstring, ``draws``)."""
        ch = self.channel
        if self.draws == "arc":
            return ch.block.arc_rng(route, self.stream)
        rng = self._senders.get(route, lambda: Stream(ch.block.seed, list(route.senders),
                                                      ch.rng.stream))
        rng.sync(ch.rng)  # the node stream's current (round, call)
        return rng

    def send(self, z: torch.Tensor) -> Any:
        """``C(z_i − o_ij)`` for every current arc (i, j) of this round: its :class:`Rows`."""
        ch = self.channel
        block = ch.block
        route = block.arc_plan()
        rnd = self.round_of(route)
        out = self.out if rnd.whole_out else self.out.index_select(0, rnd.out_rows)
        d = torch.sub(z.index_select(0, rnd.src), out)
        rng = self._rng(route)
        rows = block.encode(d, ch.compressor, rng, route=route)
        if self.draws == "sender":
            ch.rng.sync(rng)  # the node stream moves past the call its arcs drew
        return rows

    def _apply(self, copies: torch.Tensor, rows: torch.Tensor, whole: bool,
               decode: Callable[[torch.Tensor], Any]) -> torch.Tensor:
        """Add the delivered messages to ``copies`` (its ``rows``, or all when ``whole``) as the
        memory says; returns the reconstructions (``copies`` itself, or its rows, when α = 1)."""
        alpha = self.channel.alpha
        if alpha == 1.0:
            if whole:
                decode(copies)
                return copies
            cur = copies.index_select(0, rows)
            decode(cur)
            copies.index_copy_(0, rows, cur)
            return cur
        hat = copies.clone() if whole else copies.index_select(0, rows)
        decode(hat)  # lost arcs: hat is the copy itself, and the lerp leaves it as it is
        if whole:
            copies.lerp_(hat, alpha)
        else:
            copies.index_copy_(0, rows, torch.lerp(copies.index_select(0, rows), hat, alpha))
        return hat

    def update(self, q: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Update both ends' copies with the exchanged part ``q`` (delivered messages only):
        the reconstructions ``(ô, ĉ)`` of this round's out- and in-arcs. Under ``stale=``
        (``q.route.out_late`` set) ``(â, ĉ)``: the sent copies move by this round's delivered
        messages, the acknowledged and the receivers' copies by the messages handed over
        (class docstring, "Late messages")."""
        block = self.channel.block
        rnd = self.round_of(block.arc_plan())  # the round's rows; q.route: what was delivered
        route = q.route
        if route.out_late is not None and self.acked is None:
            self.acked = self.out.clone()  # nothing handed over yet: a_ij = o_ij
        sent = route.out_delivered
        out = self._apply(self.out, rnd.out_rows, rnd.whole_out,
                          lambda t: block.decode_add(t, q, only=sent))  # o_ij += C(q_ij) if acked
        if route.out_late is not None:  # a_ij += C(q) of the messages handed over, in order
            out = self._apply(self.acked, rnd.out_rows, rnd.whole_out,
                              lambda t: block.decode_acked(t, q))
        inc = self._apply(self.inc, rnd.in_rows, rnd.whole_in,
                          lambda t: block.decode_received(t, q))  # c_ji += C(q_ji) if arrived
        return out, inc

    def laplacian(self, q: Any = None) -> torch.Tensor:
        """Update the copies with the exchanged part ``q`` and return
        ``D_i = Σ_in w_ij ĉ_ji − Σ_out w_ji ô_ij`` of every row, in the per-node order (the
        out-arcs, then the in-arcs, each sorted by neighbor); a buffer. Without ``q``: the
        same sum over the copies as they are (no update)."""
        block = self.channel.block
        rnd = self.round_of(block.arc_plan())
        out_w, in_w = rnd.out_weight, rnd.in_weight
        if q is None:
            held = self.out if self.acked is None else self.acked  # what the receivers hold
            out = held if rnd.whole_out else held.index_select(0, rnd.out_rows)
            inc = self.inc if rnd.whole_in else self.inc.index_select(0, rnd.in_rows)
        else:
            out, inc = self.update(q)
        if block.active_nodes is not None:  # an arc with a sleeping end sits out at both ends
            out_w, in_w = rnd.live_weights(block.active_nodes)
        mix = self.mix.zero_()
        rnd.out_sums.add_(mix, out, out_w)  # − w_ji ô_ij
        rnd.in_sums.add_(mix, inc, in_w)  # + w_ij ĉ_ji
        return mix


class _ArcRound:
    """One round's arcs of :class:`_ArcCopies`: their rows among the schedule's copies,
    senders, weights and per-node sums."""

    def __init__(self, copies: _ArcCopies, route: ArcPlan):
        block = copies.channel.block
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

        self.out_rows = rows(copies._out_row, route.arcs, "out")
        self.in_rows = rows(copies._in_row, route.incoming, "in")
        # the round's arcs are every arc of the schedule, in its order (a static graph): the
        # copies are used as they are, without gathering and scattering their rows
        self.whole_out = self.out_rows.tolist() == list(range(copies.out.shape[0]))
        self.whole_in = self.in_rows.tolist() == list(range(copies.inc.shape[0]))
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
        self._out_ends = np.array(route.arcs, dtype=np.int64).reshape(-1, 2)
        self._in_ends = np.array(route.incoming, dtype=np.int64).reshape(-1, 2)

    def live_weights(self, active: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The out- and in-arc weights with the arcs that touch a node inactive this round
        (``active``: every node's flag) set to 0: those arcs sit the round out at both ends."""
        def live(ends: np.ndarray, weight: torch.Tensor) -> torch.Tensor:
            keep = active[ends[:, 0]] & active[ends[:, 1]]
            return weight * torch.from_numpy(keep).to(weight.device)
        return live(self._out_ends, self.out_weight), live(self._in_ends, self.in_weight)
