"""The block: the m nodes one process hosts, as the rows of [m, d] tensors, and the operations
an algorithm's round uses on them.

An algorithm's round runs for all of a process's nodes at once: its tensor ops broadcast over
rows, a compressor encodes the block into message rows (one message per row), and mixing adds,
for every node, its in-neighbors' messages in sorted order (one degree slot at a time, or all
slots in one ordered decode). Every node's sums therefore run in the same order wherever the
node sits, so a run gives the same bits in one process, one node per MPI rank, or several per
rank. Routing lives in :mod:`gossip.core.routing`, message buffers in
:mod:`gossip.core.staging`.

The model ``x`` is allocated in message rows (:meth:`Block.message_tensor`), so it goes out
with the ``none`` compressor without an encode's copy: only the 8-byte headers are written.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import increment_version

from gossip.compress import Compressor, dispatch
from gossip.compress import fused as _fused
from gossip.compress.base import row_stride
from gossip.compress.checks import unchecked
from gossip.compress.rows import header_int64, section
from gossip.core.cache import IdentityCache
from gossip.core.routing import ArcPlan, MixPlan
from gossip.core.staging import ALIGN, PackedParts, PackedRows, Rows, message_buffer, pack_header
from gossip.errors import CompressionError, ConfigError, ContractError, RowsError
from gossip.rng import Stream


class Block:
    """The nodes of one process as rows: what an algorithm's ``setup`` and ``step`` read and change.

    ``x`` ([m, d]) holds the models (row r is node ``ids[r]``). ``state`` holds the algorithm's
    [m, ...] tensors that a resumed run needs (checkpointed: each node saves its rows);
    ``workspace`` holds scratch buffers and anything derived at setup (never checkpointed);
    ``hparams`` the run's resolved hyper-parameters (the constructor's values, with defaults an
    algorithm derives from the compressor or graph filled in at setup: the algorithm object
    itself never changes, so one instance serves several runs). ``arc_state`` holds [A, ...]
    tensors with a row per arc of :meth:`arc_plan` (node i saves the rows of its out-arcs,
    sorted by receiver; an entry may be a list of tensors, and a key with ``{j}`` gives node i
    one entry per out-arc (i, j), named with j: per-neighbor state such as PowerGossip's
    ``P{j}``). ``plan`` is the round's :class:`~gossip.core.routing.MixPlan` that mixing
    reads (its weights; after an exchange with lost messages, the plan of what was delivered,
    :mod:`gossip.network.loss`), ``routing`` the round's whole plan that messages are encoded
    for, ``topology`` the run's graph, ``nodes`` the per-node objects (oracles, generators, ids).
    """

    def __init__(self, nodes: list[Any], x: torch.Tensor | None, compressor: Compressor,
                 new_compressor: Callable[[], Compressor], seed: int = 0, topology: Any = None,
                 hparams: dict[str, Any] | None = None):
        self.nodes = nodes
        ids = getattr(nodes, "ids", None)  # a NodeRows: its ids, without making its nodes
        self.ids = list(ids) if ids is not None else [nd.id for nd in nodes]
        self.m = len(nodes)
        self.x = x
        self.topology = topology
        self.hparams: dict[str, Any] = dict(hparams or {})
        self.state: dict[str, torch.Tensor] = {}
        self.workspace: dict[str, Any] = {}
        self.arc_state: dict[str, torch.Tensor | list[torch.Tensor]] = {}
        self.arc_routes: dict[str, tuple[ArcPlan, bool]] = {}
        """``arc_state`` keys whose rows follow another plan than :meth:`arc_plan`: ``(plan,
        incoming)``, rows ``plan.arcs`` (node i's: its out-arcs) or, with ``incoming``,
        ``plan.incoming`` (node i's: its in-arcs, sorted by sender, a ``{j}`` key named by
        the sender); e.g. the arcs of a time-varying graph's whole period."""
        self.compressor = compressor
        self.seed = seed
        self.rng = Stream(seed, self.ids, 0)
        """The nodes' main random streams as one (row r draws node ``ids[r]``'s numbers)."""
        self.round = 0
        self.plan: MixPlan | None = None
        self.routing: MixPlan | None = None
        self._new_compressor = new_compressor
        self._streams: dict[str, Compressor] = {}
        self._stream_rngs: dict[str, Stream] = {}
        self._cache = IdentityCache()
        self._staging: dict[tuple[int, bool], torch.Tensor] = {}
        self._message_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._finite: dict[int, int] = {}  # message tensor -> version the mix kernel checked
        self._in_place: dict[tuple, _InPlace] = {}  # phases sent from a tensor's own memory
        self._dense_checks: dict[tuple, tuple] = {}  # dense_mix's choices (_dense_mix, _dense_check)
        self._last_dense: _DenseRepeat | None = None  # the last dense mix_into, for its repeat
        self._last_in_rows: tuple | None = None  # the last tensor in_message_rows found
        self._last_check: tuple | None = None  # (compressor, like, switches, _dense_check's answer)
        self._scratches: dict[Any, torch.Tensor] = {}
        self._prefetched: tuple[torch.Tensor, int, str] | None = None  # (gradients, x's version, by)
        self._stand_in = False
        self._oracle_keys: tuple[list[Any], list[Any]] | None = None  # the last _ask_oracles's
        self.active_rows: list[int] | None = None
        """The rows whose nodes are active this round under partial activation (``--network
        active=``, :mod:`gossip.network.activity`): :meth:`gradients` asks only their oracles;
        None: every node is."""
        self.active_nodes: Any = None
        """Which nodes of the whole network are active this round (a [n] numpy bool array, the
        same on every process; None: every node is), set with :attr:`active_rows`: a per-arc
        sum leaves out the arcs with a sleeping end (:class:`gossip.core.channel._ArcCopies`)."""
        self._stacks: dict[int, torch.Tensor] = {}
        self._calls = 0
        self.replay: StaticPhase | None = None
        """The phase the engine replays this round (:meth:`static_phase`; None: none): while it
        is set, :meth:`encode`, :meth:`check_received` and :meth:`mix_into` answer the calls it
        recorded, the same objects again, from it; any other call clears it."""
        self._sent_again: tuple[_InPlace, Rows, int] | None = None  # the last send of x as it was
        self._mixed_again: Rows | None = None  # the last inbox a repeated dense mix read

    @property
    def has_oracle(self) -> bool:
        """Whether the block's nodes have gradients (a federated server has none, its clients do)."""
        known = getattr(self.nodes, "any_oracle", None)  # a NodeRows knows (a node made on
        if known is not None:  # reading has none)
            return known
        return any(nd.oracle is not None for nd in self.nodes)

    @property
    def self_weight(self) -> torch.Tensor:
        """``W_ii`` of every row ([m] float64)."""
        return self.plan.self_weight

    def begin_round(self, t: int, plan: MixPlan) -> None:
        self.round = t
        self.plan = self.routing = plan
        self._calls = 0
        self.rng.begin_round(t)
        for rng in self._stream_rngs.values():  # callers keep these handles across rounds
            rng.begin_round(t)
        for value in self._cache.values():
            if isinstance(value, Stream):
                value.begin_round(t)

    def _current(self, rng: Stream) -> Stream:
        """``rng`` entered into this round (a stream made during it starts at round 0)."""
        if rng.round != self.round:
            rng.begin_round(self.round)
        return rng

    def stream_compressor(self, stream: str) -> Compressor:
        """The block's compressor for the extra message stream ``stream`` (one per name)."""
        comp = self._streams.get(stream)
        if comp is None:
            comp = self._streams[stream] = self._new_compressor()
        return comp

    def stream_rng(self, stream: str) -> Stream:
        """The nodes' random streams for the message stream ``stream`` (one per name)."""
        rng = self._stream_rngs.get(stream)
        if rng is None:
            rng = self._stream_rngs[stream] = Stream(self.seed, self.ids, stream)
        return self._current(rng)

    def arc_plan(self, arcs: Any = None) -> ArcPlan:
        """The routing of a phase with one message per arc, over ``arcs`` ((sender, receiver)
        pairs; default: every arc of this round's graph into or out of the block). Cached."""
        def build() -> ArcPlan:
            chosen = arcs
            if chosen is None:
                views = [nd.view for nd in self.nodes]
                chosen = [(i, j) for i, v in zip(self.ids, views) for j in v.out_neighbors]
                chosen += [(j, i) for i, v in zip(self.ids, views) for j in v.in_neighbors]
            device = self.x.device if self.x is not None else torch.device("cpu")
            return ArcPlan.build(chosen, self.ids, device)

        key = ("arc_plan", None if arcs is None else tuple(sorted(arcs)))
        return self._cache.get(self.routing, build, key)

    def arc_rng(self, route: ArcPlan, stream: str = "arc", undirected: bool = False) -> Stream:
        """Random streams for ``route``'s own rows, keyed by the arc (placement-independent).
        ``undirected``: keyed by the unordered pair under ``stream``, so with ``stream="edge"``
        both ends of an edge draw the same numbers."""
        def build() -> Stream:
            pair = ((lambda i, j: min(i, j) << 32 | max(i, j)) if undirected
                    else (lambda i, j: i << 32 | j))
            return Stream(self.seed, [pair(i, j) for i, j in route.arcs], stream)

        return self._current(self._cache.get(route, build, ("arc_rng", stream, undirected)))

    # -- messages ------------------------------------------------------------------------------
    def message_tensor(self, d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [m, d] tensor whose rows sit in message rows, so the ``none`` compressor sends it
        as it is (only the 8 header bytes before each row are written). Every row starts
        64-byte aligned, as a node's own tensor would (oracles' kernels round by alignment);
        the rows are padded, so the tensor is not contiguous as a whole (each row is)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        pitch = -(-(ALIGN + d * itemsize) // ALIGN) * ALIGN
        buf = message_buffer((self.m, pitch), device, align=ALIGN)
        X = buf[:, ALIGN : ALIGN + d * itemsize].view(dtype)
        self._message_rows[X.data_ptr()] = (buf[:, ALIGN - 8 :], X)  # messages start 8 before
        return X

    def in_message_rows(self, X: torch.Tensor) -> bool:
        """Whether ``X`` is a :meth:`message_tensor` (``x`` is one): the ``none`` compressor
        sends it from its own memory."""
        last = self._last_in_rows  # the tensor asked about last time (x, every round)
        if last is not None and last[0] is X and last[1] == X.data_ptr() and last[2] == X.shape:
            return True
        rows = self._message_rows.get(X.data_ptr())
        found = rows is not None and rows[1].shape == X.shape and rows[1].stride() == X.stride()
        if found:
            self._last_in_rows = (X, X.data_ptr(), X.shape)
        return found

    def encode(self, X: torch.Tensor, compressor: Compressor | None = None,
               rng: Stream | None = None, route: Any = None) -> Rows:
        """Encode every row of ``X`` into this phase's message rows (see the module doc);
        randomized compressors draw from ``rng`` (default: the block's main streams).
        ``route`` is the round's :class:`MixPlan` (default: one message per node, to all its
        out-neighbors) or an :class:`ArcPlan` (``X`` has a row per arc, :meth:`arc_rng` draws).

        With ``none``, ``block.x`` is sent from its own memory, so those messages read the
        model as it is when they are decoded: decode (``decode_add``, ``mix_into``) before
        changing ``x``. A decode after ``x`` changed is refused with a :class:`ContractError`
        (the tensor's version is noted at send time)."""
        comp = compressor or self.compressor
        route = route or self.routing
        phase = self.replay
        if phase is not None:  # the recorded send: its guards only (see StaticPhase)
            again = phase.sent
            if (X is again.X and comp is again.compressor and route is again.route
                    and self._calls == phase.calls and X.data_ptr() == again.ptr
                    and self._known_finite(X, again.ptr, comp)):
                self._calls += 1
                phase.rows = rows = again.send(X)
                return rows
            self.replay = None  # another call: the round goes the generic way from here
        again = self._in_place.get((id(route), id(comp), id(X), self._calls))
        if (again is not None and again.X is X and again.route is route and again.compressor is comp
                and X.data_ptr() == again.ptr and self._known_finite(X, again.ptr, comp)):
            calls = self._calls
            self._calls += 1
            rows = again.send(X)
            self._sent_again = (again, rows, calls)
            return rows
        rng = rng or self.rng
        rows = len(route.senders)
        if X.shape[0] != rows:
            raise ConfigError(f"{X.shape[0]} rows to encode for a phase of {rows} messages: "
                              "encode one row per node (or per arc of the route)")
        like = X[0] if rows else X.new_empty(X.shape[1:])  # a phase this block sends nothing in
        nbytes = comp.nbytes_rows(like)
        pitch = row_stride(nbytes)
        remote = len(route.remote_in)
        in_place = self._message_rows.get(X.data_ptr()) if self.in_message_rows(X) else None
        checked = False
        if in_place is not None and comp.sends_values_in_place and in_place[0].shape[1] >= nbytes:
            own = in_place[0]
            checked = self._finite.get(X.data_ptr()) == X._version  # unchanged since the kernel
            recv = self._buffer((remote, pitch), X.device, recv_only=True)
            both = None
        else:
            both = self._buffer((rows + remote, pitch), X.device)
            own, recv = both[:rows], both[rows:]
        self._calls += 1
        mine = own[:, :nbytes]
        if rows == 0:  # this block sends nothing in the phase (e.g. no sampled client here)
            pass
        elif comp.stateful:
            if route is not self.routing:
                raise CompressionError(f"'{comp.spec}' keeps state per node and cannot encode one "
                                       "message per arc: use a stateless compressor")
            self._encode_per_node(comp, X, mine, rng)
        else:
            try:
                with unchecked(comp) if checked else contextlib.nullcontext():
                    block = comp.encode_rows(X, rng, out=mine)
            except CompressionError as exc:
                row = getattr(exc, "row", None)
                who = f"node {route.senders[row]}" if row is not None else "a node"
                raise CompressionError(f"{who} could not encode its message: {exc}") from exc
            if block.data_ptr() != mine.data_ptr():
                mine.copy_(block)
        out = Rows(own, recv, nbytes, comp, like, both, route)
        if both is None:  # sent from X's own memory
            out.source = (X, X._version)
            if rows and not comp.stateful and comp.sends_values_in_place:
                if len(self._in_place) > 64:
                    self._in_place.clear()
                self._in_place[(id(route), id(comp), id(X), self._calls - 1)] = _InPlace(
                    route, comp, X, own, recv, nbytes, like)
        return out

    def _known_finite(self, X: torch.Tensor, ptr: int, comp: Compressor) -> bool:
        """Whether ``X`` (a :meth:`message_tensor` at ``ptr``) may be sent from its own memory
        without the compressor's NaN/Inf pass: the mix kernel found it finite at this version,
        or one summing pass does now (a model changed after its mix, as D-PSGD's local step
        changes it: a finite sum means every entry is finite; a sum that is not, an overflow
        included, leaves the check to the compressor's encode), or the compressor checks
        nothing (``check_finite`` off)."""
        if self._finite.get(ptr) == X._version:
            return True
        if not comp.check_finite:
            return True
        if not math.isfinite(float(torch.sum(X.detach() if X.requires_grad else X))):
            return False
        self._finite[ptr] = X._version
        return True

    def message_rows(self, nbytes: int, route: Any = None) -> Rows:
        """Empty message rows of ``nbytes`` raw bytes each, to fill through ``rows.mine()`` and
        ``yield`` (values an algorithm lays out itself, e.g. exact float sketches); the
        transport checks only their length."""
        route = route or self.routing
        rows = len(route.senders)
        both = self._buffer((rows + len(route.remote_in), row_stride(nbytes)), self.x.device)
        self._calls += 1
        return Rows(both[:rows], both[rows:], nbytes, None, None, both, route)

    def _buffer(self, shape: tuple[int, int], device: torch.device,
                recv_only: bool = False) -> torch.Tensor:
        """This phase's reused staging buffer (one per phase of a round)."""
        key = (self._calls, recv_only)
        buf = self._staging.get(key)
        if buf is None or buf.shape != shape or buf.device != device:
            buf = self._staging[key] = message_buffer(shape, device)
        return buf

    def _encode_per_node(self, comp: Compressor, X: torch.Tensor, mine: torch.Tensor,
                         rng: Stream) -> None:
        """Stateful compressors keep per-node state: each node encodes with its own instance
        (the main stream's is the node's ``compressor``, an extra stream's its
        ``stream_compressor``)."""
        main = comp is self.compressor
        name = next((k for k, c in self._streams.items() if c is comp), None)
        streams = [rng.row(r) for r in range(self.m)]
        for r, nd in enumerate(self.nodes):
            c = nd.compressor if main else nd.stream_compressor(name) if name else comp
            mine[r].copy_(c.encode(X[r], streams[r]).to_bytes())
        if streams:
            rng.sync(streams[0])

    def decode(self, rows: Rows, out: torch.Tensor) -> torch.Tensor:
        """``out[r] = C(q_r)``: every node's own message decoded (``0 + C(q)``: equal to the
        decoded values, a ``-0.0`` entry aside)."""
        return self.decode_add(out.zero_(), rows)

    def decode_add(self, out: torch.Tensor, rows: Rows, weight: float = 1.0,
                   only: torch.Tensor | None = None) -> torch.Tensor:
        """``out[r] += weight·C(q_r)``: every own row adds its own message (e.g. a node to its
        public copy, an arc to its sender's copy of what it sent). ``only`` ([rows] bool, e.g.
        an arc phase's ``rows.route.out_delivered``): those rows only (None: all)."""
        _check_source(rows)
        arcs = rows.route.arcs if isinstance(rows.route, ArcPlan) else None
        msgs, dst = rows.mine(), None
        if only is not None:
            dst = only.nonzero().view(-1)
            msgs = msgs.index_select(0, dst)
            arcs = None if arcs is None else [arcs[a] for a in dst.tolist()]
        self._decode_add(rows.compressor, out, msgs, float(weight), dst, None, arcs)
        return out

    def received_arcs(self, rows: Rows) -> torch.Tensor:
        """[E, nbytes]: the messages of an :class:`ArcPlan` phase this block received, one per
        arc of ``route.incoming`` (sorted by receiver, then sender)."""
        route = rows.route
        if getattr(route, "in_late", None) is not None:
            raise ContractError("this phase's messages were held under stale=: decode what is "
                                "handed over with decode_received / decode_acked")
        return rows.gather(route.in_src, route.in_span)

    def decode_received(self, out: torch.Tensor, rows: Rows, weight: Any = 1.0,
                        dst: torch.Tensor | None = None) -> torch.Tensor:
        """``out[e] += weight·C(q_e)`` for every arc e of ``rows.route.incoming``; with ``dst``
        (e.g. ``route.in_dst``, the receivers' rows) into row ``dst[e]`` of ``out`` instead.
        Under message loss only the arcs whose message arrived (``route.in_delivered``); under
        ``stale=`` (``route.in_late``) the messages handed over this round instead, each arc's
        in send order (:meth:`_decode_late`)."""
        route = rows.route
        w = weight if isinstance(weight, torch.Tensor) else float(weight)
        if route.in_late is not None:
            return self._decode_late(out, rows, route.in_late, route.incoming, w, dst)
        msgs, arcs = self.received_arcs(rows), route.incoming
        got, keep = route.in_delivered, None
        if got is not None:
            keep = got.nonzero().view(-1)
            msgs = msgs.index_select(0, keep)
            dst = keep if dst is None else dst.index_select(0, keep)
            if isinstance(w, torch.Tensor) and w.numel() == len(arcs):
                w = w.reshape(-1).index_select(0, keep)
            arcs = [arcs[e] for e in keep.tolist()]
        self._decode_add(rows.compressor, out, msgs, w, dst, None, arcs)
        if rows.noise is not None:  # a noisy channel: w_e·σ z_e on each received message
            rows.noise.add_received(out, route, w, keep, dst)
        return out

    def decode_acked(self, out: torch.Tensor, rows: Rows, weight: Any = 1.0) -> torch.Tensor:
        """``out[a] += weight·C(q)`` for every own message of an :class:`ArcPlan` phase that its
        receiver is handed this round (``route.out_late``, under ``stale=``), each arc's in send
        order: the sender's copy of what its receivers have applied (the same messages, decoded
        in the same order, as the receivers' :meth:`decode_received`)."""
        route = rows.route
        if route.out_late is None:
            raise ContractError("decode_acked reads the messages handed over late (route.out_late"
                                "), which only a phase held under stale= carries")
        w = weight if isinstance(weight, torch.Tensor) else float(weight)
        return self._decode_late(out, rows, route.out_late, route.arcs, w, None)

    def _decode_late(self, out: torch.Tensor, rows: Rows,
                     layers: tuple[tuple[torch.Tensor, torch.Tensor], ...],
                     arcs: list[tuple[int, int]], w: Any, dst: torch.Tensor | None
                     ) -> torch.Tensor:
        """Decode the late ``layers`` (``(arc indices, staging rows)``, one message per arc a
        layer, in send order) into rows ``dst[arc]`` of ``out`` (``arc`` without ``dst``)."""
        data = rows.both()
        nb = rows.nbytes
        for idx, src in layers:
            msgs = data.index_select(0, src)[:, :nb]
            wl = w.reshape(-1).index_select(0, idx) if (isinstance(w, torch.Tensor)
                                                         and w.numel() == len(arcs)) else w
            self._decode_add(rows.compressor, out, msgs, wl,
                             idx if dst is None else dst.index_select(0, idx), None,
                             [arcs[e] for e in idx.tolist()])
        return out

    def stacked(self, k: int) -> list[torch.Tensor]:
        """``k`` zero [m, d] tensors (``x``'s dtype and device) stored as one [k·m, d] tensor:
        a public copy and its mix held this way are updated in one decode by
        :meth:`mix_into`'s ``copy=``."""
        base = torch.zeros((k * self.m, self.x.shape[1]), dtype=self.x.dtype, device=self.x.device)
        self._stacks[base.data_ptr()] = base
        return list(base.view(k, self.m, -1).unbind(0))

    def _stacked_rows(self, *parts: torch.Tensor) -> tuple[torch.Tensor, list[int]] | None:
        """The :meth:`stacked` tensor holding every one of ``parts`` and their first rows
        (memoized: the same tensors come back every round)."""
        key = ("stacked", tuple((t.data_ptr(), t.shape, t.stride()) for t in parts))
        return self._cache.get(self, lambda: self._find_stacked_rows(parts), key)

    def _find_stacked_rows(self, parts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, list[int]] | None:
        base = self._stacks.get(parts[0].untyped_storage().data_ptr())
        if base is None:
            return None
        row = base.stride(0) * base.element_size()
        firsts = []
        for t in parts:
            off = t.data_ptr() - base.data_ptr()
            if (t.untyped_storage().data_ptr() != base.data_ptr() or t.shape != (self.m, base.shape[1])
                    or not t.is_contiguous() or off % row):
                return None
            firsts.append(off // row)
        return base, firsts

    def mix_into(self, out: torch.Tensor, own: Rows | None, inbox: Rows, *,
                 own_weight: torch.Tensor | None = None, scale: float = 1.0,
                 copy: torch.Tensor | None = None, plan: MixPlan | None = None,
                 add: bool = True, alpha: float | None = None) -> torch.Tensor:
        """:meth:`_mix` (its doc says what it computes); on a noisy channel (``inbox.noise``,
        ``--network noise=``) each received message's decoded values carry their noise, so
        ``Σ_j w_ij·σ z_ji`` (times ``scale``, and ``alpha``) is added after the noiseless sum
        (:mod:`gossip.network.noise`)."""
        self._mix(out, own, inbox, own_weight=own_weight, scale=scale, copy=copy, plan=plan,
                  add=add, alpha=alpha)
        if inbox.noise is not None:
            inbox.noise.add_mixed(out, plan or self.plan, scale * (1.0 if alpha is None else alpha))
        return out

    def _mix(self, out: torch.Tensor, own: Rows | None, inbox: Rows, *,
             own_weight: torch.Tensor | None = None, scale: float = 1.0,
             copy: torch.Tensor | None = None, plan: MixPlan | None = None,
             add: bool = True, alpha: float | None = None) -> torch.Tensor:
        """``out += scale·(w_ii·C(own) + Σ_j w_ij·C(q_j))`` for every row, neighbors in sorted
        order (the order a per-node loop sums in); with ``copy`` (and ``own``) also
        ``copy += C(own)``, a public copy such as CHOCO's x̂. ``plan``: the round's plan with
        other weights (a :class:`~gossip.core.channel.Channel`'s; default ``self.plan``).
        ``add=False`` writes the sum into ``out`` instead (``0 + …``: the same bits as zeroing
        ``out`` first, without the pass over it). ``alpha`` adds ``alpha·sum`` to ``out``: a
        model's own update ``x ← x + α·(mix)``, where ``out`` may be the model the messages were
        sent from. Dense messages (``none``, sent from that memory) add it as
        ``out.add_(sum, alpha=alpha)`` rounds it, the sum first; compressed ones fold ``alpha``
        into the weights and decode each term straight into ``out``.

        Dense messages (``none``) of long CPU rows are summed by one kernel
        (:mod:`gossip.compress.fused`) that also tells which results are finite, so the
        received messages are looked at for NaN/Inf only when a result is not.

        The own term decodes the block's rows in place; the neighbors' messages are gathered
        once (a view when they sit in consecutive rows, e.g. one node per rank) and decoded in
        one call when the compressor adds repeated targets in row order on this device, else
        one degree slot at a time. That one call also updates ``copy`` when ``copy`` and
        ``out`` are parts of one :meth:`stacked` tensor."""
        _check_source(inbox)
        phase = self.replay
        if phase is not None:  # the recorded mix: the same objects, so the same kernel call
            last = phase.mixed
            if (inbox is phase.rows and own is inbox and out is last.out and copy is None
                    and (plan or self.plan) is last.plan and own_weight is last.own_weight
                    and last.mode == (scale, add, alpha) and not out.requires_grad):
                w_own = last.w_own
                if w_own is None:
                    w_own = last.plan.self_weight if own_weight is None else own_weight
                    w_own = w_own * scale if scale != 1.0 else w_own
                return self._mix_dense(out, own, inbox, w_own, last.plan, scale, add, alpha, last)
            self.replay = None
        if own is not None and own is not inbox:
            _check_source(own)
        plan = plan or self.plan
        last = self._last_dense
        if (last is not None and last.out is out and last.plan is plan and copy is None
                and last.own is (None if own is None else own.own) and last.inbox is inbox.own
                and last.recv is inbox.recv and last.nbytes == inbox.nbytes
                and last.compressor is inbox.compressor and last.own_weight is own_weight
                and last.mode == (scale, add, alpha) and last.switches == dispatch.switches()
                and not out.requires_grad):  # the same call as the last one: its choices hold
            w_own = last.w_own
            if w_own is None and own is not None:
                w_own = plan.self_weight if own_weight is None else own_weight
                w_own = w_own * scale if scale != 1.0 else w_own
            self._mixed_again = inbox
            return self._mix_dense(out, own, inbox, w_own, plan, scale, add, alpha, last)
        comp, m = inbox.compressor, self.m
        fused = plan.fused
        ordered = comp.ordered_rows and out.is_cpu
        w_own = None
        if own is not None:
            w_own = plan.self_weight if own_weight is None else own_weight
            w_own = w_own * scale if scale != 1.0 else w_own
        if self._dense_mix(comp, out, alpha):
            if copy is not None:
                self._decode_add(comp, copy, own.mine(), 1.0, None, None)
                return self._mix_dense(out, own, inbox, w_own, plan, scale, add, alpha)
            self._last_dense = last = _DenseRepeat(out, own, inbox, plan, own_weight,
                                                   (scale, add, alpha))
            if own_weight is None and own is not None and scale == 1.0:
                last.w_own = w_own  # the plan's own weights: the same object every round
            return self._mix_dense(out, own, inbox, w_own, plan, scale, add, alpha, last)
        if alpha is not None and not comp.sends_values_in_place:  # messages apart from out
            return self._mix(out, own, inbox, own_weight=own_weight, scale=scale * alpha,
                             copy=copy, plan=plan)
        if alpha is not None:  # the sum apart (the messages may read out), then added
            total = self._mix(self._scratch(out, "mix_into.alpha"), own, inbox,
                              own_weight=own_weight, scale=scale, copy=copy, plan=plan,
                              add=False)
            return out.add_(total, alpha=alpha)
        if not add:
            out.zero_()
        if (own is inbox and ordered and fused is not None and fused[3] is None
                and not comp.sends_values_in_place):  # own and neighbors in one call
            src, dst = plan.with_own
            stack = self._stacked_rows(copy, out) if copy is not None else None
            if stack is None and copy is not None:
                self._decode_add(comp, copy, own.mine(), 1.0, None, None)
            plain = own_weight is None and scale == 1.0  # the plan's weights: cached
            key = ("own", tuple(stack[1]) if stack else None)
            hit = plan.cache.get(key) if plain else None
            if hit is None:
                w = torch.cat((w_own, fused[2] * scale if scale != 1.0 else fused[2]))
                if stack is not None:  # the copy's rows too: one decode for both
                    (c0, o0), every = stack[1], torch.arange(m, device=src.device)
                    src, dst = torch.cat((every, src)), torch.cat((every + c0, dst + o0))
                    w = torch.cat((torch.ones(m, dtype=w.dtype, device=w.device), w))
                hit = (src, dst, w)
                if plain:
                    plan.cache[key] = hit
            src, dst, w = hit
            target = out if stack is None else stack[0]
            self._decode_from(comp, target, inbox, src, None, w, dst)
            return out
        if copy is not None:
            self._decode_add(comp, copy, own.mine(), 1.0, None, None)
        if own is not None:
            self._decode_add(comp, out, own.mine(), w_own, None, None)
        if fused is None:
            return out
        if ordered or len(plan.slots) == 1:
            src, dst, w, span = fused
            self._decode_from(comp, out, inbox, src, span, w * scale if scale != 1.0 else w,
                              dst if dst.numel() != m or len(plan.slots) > 1 else None)
            return out
        for src, dst, w in plan.slots:
            self._decode_from(comp, out, inbox, src, None, w * scale if scale != 1.0 else w, dst)
        return out

    def _decode_from(self, comp: Compressor, out: torch.Tensor, inbox: Rows, src: torch.Tensor,
                     span: slice | None, w: torch.Tensor, dst: torch.Tensor | None) -> None:
        """Decode-add staging rows ``src`` of ``inbox`` into rows ``dst`` of ``out`` (None: rows
        0..k−1), in order. Long CPU rows go one message at a time from views of the staging
        rows: gathering them first would copy every message once per receiver (most of an
        exact gossip round at d = 10⁶), and a batched decode gains nothing on rows that long."""
        if span is not None or not dispatch.loop_decode(out):
            self._decode_add(comp, out, inbox.gather(src, span), w, dst, src)
            return
        targets = dst if dst is not None else torch.arange(src.numel(), device=src.device)
        for i, s in enumerate(src.tolist()):
            self._decode_add(comp, out, inbox.gather(src[i : i + 1], slice(s, s + 1)), w[i : i + 1],
                             targets[i : i + 1], src[i : i + 1])

    def _mix_dense(self, out: torch.Tensor, own: Rows | None, inbox: Rows,
                   w_own: torch.Tensor | None, plan: MixPlan, scale: float, add: bool,
                   alpha: float | None, last: _DenseRepeat | None = None) -> torch.Tensor:
        """:meth:`mix_into` of dense messages by :func:`gossip.compress.fused.mix_rows_`; the
        received rows' pending check runs only when a result is not finite (to name the
        sender) or a header is not the expected one. What depends only on the tensors (the
        kernel's arguments, the received headers' view) is kept in the plan's cache, and
        ``last`` (the call repeated, see :class:`_DenseRepeat`) holds it too."""
        ptr = out.data_ptr()
        hit = None if last is None else last.hit
        if hit is None or hit[8] != ptr:
            mine = None if own is None else own.own
            key = ("dense", scale, id(out), id(mine), id(inbox.own), id(inbox.recv), inbox.nbytes)
            hit = plan.cache.get(key)  # the same tensor objects come back every round
            if (hit is None or hit[4] is not out or hit[5] is not mine or hit[6] is not inbox.own
                    or hit[7] is not inbox.recv or hit[8] != ptr):
                # the kernel's arguments for these tensors (held, so their ids stay theirs)
                hit = plan.cache[key] = (*self._dense_call(out, own, inbox, plan, scale), out,
                                         mine, inbox.own, inbox.recv, ptr)
            if last is not None:
                last.hit = hit
        call, heads, headers, in_rows = hit[:4]
        if own is not None and not isinstance(w_own, torch.Tensor):
            w_own = torch.full((self.m,), float(w_own), dtype=torch.float64)
        ok = call(w_own, add=add, alpha=alpha)
        increment_version(out)  # written through numpy: torch's version counter must still move
        fine = all(ok.tolist())  # (a few rows: faster as a list than by numpy's reductions)
        if in_rows:  # its next send needs no NaN/Inf pass if it is finite
            if fine:
                self._finite[ptr] = out._version
            else:
                self._finite.pop(ptr, None)
        if inbox.pending is not None:
            if not fine or heads.tolist() != headers:
                inbox.settle()  # names the sender of a bad message, if one is
            inbox.pending = None
        return out

    def _dense_call(self, out: torch.Tensor, own: Rows | None, inbox: Rows, plan: MixPlan,
                    scale: float) -> tuple[_fused.DenseMix, np.ndarray, list[int], bool]:
        """:meth:`_mix_dense`'s kernel call for these tensors, the received rows' headers (a
        numpy view), the headers they must hold, and whether ``out`` sits in message rows."""
        comp, nb = inbox.compressor, inbox.nbytes
        cplan = comp.plan(inbox.like)
        own_rows = None if own is None else own.mine()
        terms = None
        if plan.fused is not None:
            src, dst, w, _ = plan.fused
            terms = _fused.Terms(self.m, src, dst, w * scale, out.dtype)
        call = _fused.DenseMix(
            out, None if own is None else section(own_rows, cplan, "values"), terms,
            section(inbox.own[:, :nb], cplan, "values"),
            section(inbox.recv[:, :nb], cplan, "values"))
        heads = inbox.recv[:, :8].numpy().view(np.int64)[:, 0]  # a view: rows are 8-aligned
        return call, heads, [header_int64(cplan)] * heads.size, self.in_message_rows(out)

    def check_received(self, rows: Rows) -> None:
        """Validate the messages that came from other processes (rows ``m..``), once per phase;
        the block's own rows were checked when they were encoded. For dense messages that the
        fused kernel mixes, the check waits for their reading (:attr:`Rows.pending`)."""
        phase = self.replay
        if phase is not None and rows is phase.rows:  # the recorded phase: checked as it was
            rows.pending = phase.check
            return
        remote = rows.route.remote_in
        if not remote or rows.compressor is None:
            return
        if type(rows) is Rows and rows.like is not None and self._dense_check(rows):
            rows.pending = lambda: self._check_received(rows)
            return
        self._check_received(rows)

    def static_phase(self, rows: Rows) -> StaticPhase | None:
        """The phase ``rows`` as a :class:`StaticPhase` when the round just ended sent it from a
        tensor's own memory as a repeat (:class:`_InPlace`: only its headers written) and
        mixed it by a repeated dense kernel call (:class:`_DenseRepeat`), its own messages and
        the received ones together; None otherwise. The engine replays such a round while
        its guards hold (:class:`gossip.engine.engine.StaticRound`)."""
        sent, mixed, last = self._sent_again, self._mixed_again, self._last_dense
        self._sent_again = self._mixed_again = None
        if (sent is None or sent[1] is not rows or mixed is not rows or last is None
                or last.own is not rows.own or last.inbox is not rows.own or last.hit is None
                or not sent[0].host or rows.noise is not None):
            return None
        return StaticPhase(self, sent[0], last, sent[2])

    def _dense_mix(self, comp: Compressor, out: torch.Tensor, alpha: float | None) -> bool:
        """:func:`~gossip.compress.dispatch.dense_mix` for ``out``, remembered per tensor layout
        (and the dispatcher's switches): a round asks it again for the same tensors."""
        key = ("mix", id(comp), id(out), out.requires_grad, alpha, dispatch.NUMPY, dispatch.JIT,
               dispatch.REFERENCE)
        hit = self._dense_checks.get(key)
        if hit is None or hit[0] is not comp or hit[2] is not out or hit[3] != out.data_ptr():
            if len(self._dense_checks) > 64:
                self._dense_checks.clear()
            hit = self._dense_checks[key] = (comp, dispatch.dense_mix(comp, out, alpha), out,
                                             out.data_ptr())
        return hit[1]

    def _dense_check(self, rows: Rows) -> bool:
        """Whether the fused kernel would mix these messages into the block's rows (then it
        checks their sums, and the messages are looked at only when one is not finite):
        :func:`~gossip.compress.dispatch.dense_mix` for [m, d] rows like ``rows.like``,
        remembered per kind of message (and the dispatcher's switches)."""
        comp, like = rows.compressor, rows.like
        last, switches = self._last_check, dispatch.switches()
        if last is not None and last[0] is comp and last[1] is like and last[2] == switches:
            return last[3]  # the same messages as the last phase (a static round)
        key = (id(comp), like.shape, like.dtype, like.device, *switches)
        hit = self._dense_checks.get(key)
        if hit is None or hit[0] is not comp:
            if len(self._dense_checks) > 64:
                self._dense_checks.clear()
            rowish = like.reshape(1, -1).expand(self.m, -1)
            hit = self._dense_checks[key] = (comp, dispatch.dense_mix(comp, rowish))
        self._last_check = (comp, like, switches, hit[1])
        return hit[1]

    def _check_received(self, rows: Rows) -> None:
        """The check of :meth:`check_received`, now: the first bad row raises, naming its sender."""
        remote = rows.route.remote_in
        received = rows.received()
        if len(remote) != received.shape[0]:  # messages were lost: the delivered rows only
            own = len(rows.route.senders)
            received = received[[s - own for _, _, s in remote]]
        try:
            rows.compressor.check_rows(received, rows.like)
        except CompressionError as exc:
            sender, receiver, _ = remote[exc.row]
            raise RowsError(f"the message from node {sender} to node {receiver} was refused: "
                            f"{exc}", sender=sender, receiver=receiver) from exc

    def _decode_add(self, comp: Compressor, out: torch.Tensor, msgs: torch.Tensor,
                    weight: torch.Tensor | float, dst: torch.Tensor | None,
                    src: torch.Tensor | None, arcs: list[tuple[int, int]] | None = None) -> None:
        """``decode_add_rows_`` of ``msgs`` (staging rows ``src``; None: the block's own) into
        rows ``dst`` of ``out``, an error naming the sender and the receiver (``arcs[row]``
        when the rows are arcs)."""
        try:
            comp.decode_add_rows_(out, msgs, weight, rows=dst, check=False)
        except CompressionError as exc:
            row = getattr(exc, "row", None)
            if row is None:
                raise
            if arcs is not None:
                sender, receiver = arcs[row]
            else:
                sender = self.plan.sender_of[int(src[row]) if src is not None else row]
                receiver = self.ids[(int(dst[row]) if dst is not None else row) % self.m]
            raise RowsError(f"the message from node {sender} to node {receiver} was refused: "
                            f"{exc}", sender=sender, receiver=receiver) from exc

    # -- local work ------------------------------------------------------------------------------
    def gradients(self, out: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        """Every node's gradient at its row of ``x``, into the rows of ``out`` (through
        :meth:`oracle_call`: the bits do not depend on a row's place in the block); the
        prefetched ones when the last round computed them (:meth:`prefetch_gradients`).
        ``rows``: only those rows' nodes compute (a federated round's sampled clients); the
        other rows of ``out`` are left as they are. Under partial activation
        (:attr:`active_rows`) only the active ones among them do (the inactive rows of ``out``
        are zero)."""
        if self.active_rows is not None and not self._stand_in:
            active = set(self.active_rows)
            for r in range(self.m) if rows is None else rows:
                if r not in active:
                    out[r].zero_()
            rows = [r for r in (range(self.m) if rows is None else rows) if r in active]
        if self._stand_in:
            for r in range(self.m) if rows is None else rows:
                out[r].zero_()
            return out
        if rows is not None:
            self._ask_oracles(rows, out)
            return out
        ahead = self._prefetched
        if ahead is not None:
            self._prefetched = None
            grads, version, name = ahead
            if self.x._version != version:
                raise ContractError(
                    f"{name} declares overlaps but changed x after its round's messages "
                    "were sent, so the gradients computed while they travelled are stale: set "
                    "overlaps = None on it, or run without --overlap")
            return out.copy_(grads)
        self._ask_oracles(range(self.m), out)
        return out

    def _ask_oracles(self, rows: Sequence[int], out: torch.Tensor) -> None:
        """Each row's oracle at its row of ``x``, into its row of ``out``: a run of consecutive
        rows whose oracles share a :meth:`~gossip.problems.oracles.Oracle.block_group` in one
        call of their class's block path (``grad_block``: the same bits as node by node, so
        a node computes the same whatever block it is in), any other row through
        :meth:`oracle_call`. Oracles held as one object (``NodeRows.serve``) are asked a run
        of consecutive rows at a time, without a per-node object."""
        grouped = getattr(self.nodes, "grouped", None)
        group = grouped(rows) if grouped is not None else None
        if group is not None:
            for lo, hi in _runs(rows):
                group.grad_rows(lo, hi, self.x[lo:hi], out[lo:hi])
            return
        oracles = [self.nodes[r].oracle for r in rows]
        seen = self._oracle_keys
        if seen is not None and seen[0] == oracles:  # the same oracles as last time (identity)
            keys = seen[1]
        else:
            grouped = {t for t in set(map(type, oracles)) if hasattr(t, "block_group")}
            keys = [o.block_group() if type(o) in grouped else None for o in oracles]
            self._oracle_keys = (oracles, keys)
        n = len(rows)
        if n and keys[0] is not None and keys.count(keys[0]) == n and rows[-1] - rows[0] == n - 1 \
                and (isinstance(rows, range) or list(rows) == list(range(rows[0], rows[0] + n))):
            lo = rows[0]
            type(oracles[0]).grad_block(oracles, self.x[lo:lo + n], out[lo:lo + n])
            return
        k = 0
        while k < n:
            key = keys[k]
            if key is None:
                self.oracle_call(oracles[k].grad, self.x[rows[k]], out=out[rows[k]])
                k += 1
                continue
            e = k + 1
            while e < n and keys[e] == key and rows[e] == rows[e - 1] + 1:
                e += 1
            lo, hi = rows[k], rows[e - 1] + 1
            type(oracles[k]).grad_block(oracles[k:e], self.x[lo:hi], out[lo:hi])
            k = e

    @contextlib.contextmanager
    def stand_in_gradients(self, on: bool = True) -> Iterator[None]:
        """While on, :meth:`gradients` gives zeros and asks no oracle (a setup whose state a
        checkpoint overwrites next: the oracles must not draw a batch for it)."""
        self._stand_in = on
        try:
            yield
        finally:
            self._stand_in = False

    def prefetch_gradients(self, algorithm: str) -> None:
        """The next round's gradients at ``x`` as it stands now, kept for the next call of
        :meth:`gradients` (``--overlap``: computed while this round's messages travel). x's
        version is noted, so a round that changes x after its send is caught, not mixed in."""
        grads = self._scratch(self.x, "prefetched")
        self.gradients(grads)
        self._prefetched = (grads, self.x._version, algorithm)

    def computing_rows(self) -> list[int] | range:
        """The rows whose nodes compute this round: every row, or under partial activation
        (:attr:`active_rows`) the active ones; a round that calls its nodes' oracles itself (a
        prox, a local solve) loops over these."""
        return range(self.m) if self.active_rows is None else self.active_rows

    def oracle_call(self, fn: Callable[..., torch.Tensor], *rows: Any,
                    out: torch.Tensor) -> torch.Tensor:
        """``out = fn(*rows, out)`` with every row tensor 64-byte aligned, as a node's own
        tensors are: BLAS kernels round differently at other alignments, and a row's alignment
        depends on its place in the block, so misaligned rows go through aligned copies."""
        args = [self._aligned(a, k) if isinstance(a, torch.Tensor) else a
                for k, a in enumerate(rows)]
        dst = out if out.data_ptr() % ALIGN == 0 else self._scratch(out, "out")
        g = fn(*args, dst)
        if g.data_ptr() != out.data_ptr():
            out.copy_(g)
        return out

    def loss(self, r: int, x: torch.Tensor) -> float:
        """Row ``r``'s node's local loss at ``x`` (its oracle's ``loss``, through an aligned
        copy as :meth:`oracle_call`): a federated round's power-of-choice selection."""
        fn = getattr(self.nodes[r].oracle, "loss", None)
        if fn is None:
            raise ConfigError(f"node {self.ids[r]}'s oracle ({type(self.nodes[r].oracle).__name__}) "
                              "has no loss(x), which selection 'power' ranks clients by: give "
                              "it one or use selection 'sampled'")
        return float(fn(self._aligned(x, "loss")))

    def _aligned(self, row: torch.Tensor, k: Any) -> torch.Tensor:
        return row if row.data_ptr() % ALIGN == 0 else self._scratch(row, k).copy_(row)

    def _scratch(self, like: torch.Tensor, key: Any) -> torch.Tensor:
        t = self._scratches.get(key)
        if t is None or t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
            t = self._scratches[key] = torch.empty_like(like, memory_format=torch.contiguous_format)
        return t

    def local_step(self, grad: torch.Tensor, eta: float, rows: list[int] | None = None) -> None:
        """``x ← x − η g`` for every row, or each node's own optimizer step when it has one;
        ``rows``: only those rows step (a federated round's sampled clients)."""
        if rows is not None:
            for r in rows:
                apply = getattr(self.nodes[r].oracle, "apply_step", None)
                if apply is not None:
                    apply(self.x[r], grad[r], self.round)
                else:
                    self.x[r].add_(grad[r], alpha=-eta)
            return
        grouped = getattr(self.nodes, "grouped", None)
        if grouped is not None and grouped(range(self.m)) is not None:  # (no optimizer steps)
            self.x.add_(grad, alpha=-eta)
            return
        apply = [getattr(nd.oracle, "apply_step", None) for nd in self.nodes]
        if all(a is None for a in apply):
            self.x.add_(grad, alpha=-eta)
            return
        for r, a in enumerate(apply):
            if a is not None:
                a(self.x[r], grad[r], self.round)
            else:
                self.x[r].add_(grad[r], alpha=-eta)

    def check_arc_state(self) -> None:
        """Refuse an ``arc_state`` entry whose rows do not match its route's arcs (at setup;
        :meth:`node_state` gives a node its views when asked)."""
        default = self.arc_plan() if set(self.arc_state) - set(self.arc_routes) else None
        for key, value in self.arc_state.items():
            route, incoming = self.arc_routes.get(key, (default, False))
            arcs = route.incoming if incoming else route.arcs
            for part in value if isinstance(value, list) else [value]:
                if part.shape[0] != len(arcs):
                    raise ConfigError(f"arc_state[{key!r}] has {part.shape[0]} rows for "
                                      f"{len(arcs)} arcs")

    def node_state(self, r: int) -> dict[str, Any]:
        """Row ``r``'s node's views of ``state`` and its arcs' rows of ``arc_state`` (what
        checkpoints save and restore; ``node.state``), made when asked: a block of 10⁶ nodes
        keeps no per-node dictionaries."""
        out: dict[str, Any] = {}
        for key, value in self.state.items():
            out[key] = value[r]
        if not self.arc_state:
            return out
        default = self.arc_plan() if set(self.arc_state) - set(self.arc_routes) else None
        i = self.ids[r]
        for key, value in self.arc_state.items():
            route, incoming = self.arc_routes.get(key, (default, False))
            arcs = route.incoming if incoming else route.arcs
            parts = value if isinstance(value, list) else [value]
            rows = route.in_rows(i) if incoming else route.out_rows(i)
            if "{j}" not in key:
                out[key] = value[rows] if parts is not value else [p[rows] for p in parts]
                continue
            for a in range(rows.start, rows.stop):  # one entry per arc, named by the neighbor
                view = [p[a] for p in parts] if parts is value else value[a]
                out[key.format(j=arcs[a][0] if incoming else arcs[a][1])] = view
        return out

    # -- messages of several parts --------------------------------------------------------
    def pack(self, parts: list[Rows | torch.Tensor]) -> PackedRows:
        """Several messages of one phase sent as one (framed by
        :func:`~gossip.core.staging.pack_header`); what the engine does with messages yielded
        together (``qa, qb = yield qa, qb``). Each part is :class:`Rows` from :meth:`encode` or
        a raw [m, b] uint8 tensor (e.g. push-sum's weight); ``yield`` the result, then decode
        ``packed.parts[k]`` as if that part had been sent alone. The parts share one route
        (that of the :class:`Rows` parts; the round's plan for raw tensors)."""
        sizes = [p.nbytes if isinstance(p, Rows) else int(p.shape[1]) for p in parts]
        route = next((p.route for p in parts if isinstance(p, Rows)), self.routing)
        header = pack_header(sizes)
        head = header.numel()
        nbytes = head + sum(sizes)
        pitch = row_stride(nbytes)
        device = self.x.device
        m = len(route.senders)
        both = self._buffer((m + len(route.remote_in), pitch), device)
        self._calls += 1
        both[:m, :head].copy_(header.to(device).expand(m, head))
        views, offsets, pos = [], [], head
        for p, nb in zip(parts, sizes):
            both[:m, pos : pos + nb].copy_(p.mine() if isinstance(p, Rows) else p)
            comp, like = (p.compressor, p.like) if isinstance(p, Rows) else (None, None)
            views.append(Rows(both[:m, pos : pos + nb], both[m:, pos : pos + nb], nb, comp, like,
                              both[:, pos : pos + nb], route))
            offsets.append(pos)
            pos += nb
        packed = PackedRows(both[:m], both[m:], nbytes, PackedParts(header, views, offsets),
                            None, both, route)
        packed.parts = views
        return packed


def _runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """``rows`` as runs of consecutive ascending rows, ``(lo, hi)`` each: one for a range."""
    if isinstance(rows, range) and rows.step == 1:
        return [(rows.start, rows.stop)] if len(rows) else []
    idx = np.asarray(rows, dtype=np.int64)
    if idx.size == 0:
        return []
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [idx.size]))
    return [(int(idx[a]), int(idx[b - 1]) + 1) for a, b in zip(starts, ends)]


def _check_source(rows: Rows) -> None:
    """Refuse to decode messages sent from a tensor's own memory after it changed: they would
    read the new values, not the ones sent (``none`` sends ``block.x`` where it is)."""
    src = rows.source
    if src is not None and src[0]._version != src[1]:
        raise ContractError(
            "the model was changed after its message was sent from its own memory (compressor "
            "'none') and before that message was decoded: mix or decode the round's messages "
            "first, then change x (or send a copy of x)")


class _DenseRepeat:
    """The arguments of the last dense :meth:`Block.mix_into` (the objects themselves) and the
    kernel call they chose: a round that repeats mixes the same tensors with the same plan and
    weights, and then skips the choice of the kernel (:func:`~gossip.compress.dispatch.dense_mix`)
    and the lookup of its arguments. Only the model's memory (``out.data_ptr()``), its
    ``requires_grad`` and the dispatcher's switches are looked at again."""

    __slots__ = ("out", "own", "inbox", "recv", "nbytes", "compressor", "plan", "own_weight",
                 "mode", "switches", "w_own", "hit")

    def __init__(self, out: torch.Tensor, own: Rows | None, inbox: Rows, plan: MixPlan,
                 own_weight: Any, mode: tuple):
        self.out, self.own, self.plan = out, None if own is None else own.own, plan
        self.inbox, self.recv, self.nbytes = inbox.own, inbox.recv, inbox.nbytes
        self.compressor, self.own_weight, self.mode = inbox.compressor, own_weight, mode
        self.switches = dispatch.switches()
        self.w_own: Any = None  # the own weights when they are the plan's (the same object)
        self.hit: tuple | None = None


class _InPlace:
    """A phase sent from the memory of a :meth:`Block.message_tensor` by a compressor that
    sends values in place (``none``), remembered by :meth:`Block.encode`: while the tensor
    is the one the mix kernel last wrote and found finite (its version unchanged), encoding it
    again is writing the rows' headers, which is all this does (no pass over the values, no
    views made again)."""

    __slots__ = ("route", "compressor", "X", "ptr", "own", "recv", "nbytes", "like", "heads",
                 "header", "host")

    def __init__(self, route: Any, compressor: Compressor, X: torch.Tensor, own: torch.Tensor,
                 recv: torch.Tensor, nbytes: int, like: torch.Tensor):
        self.route, self.compressor = route, compressor
        self.X, self.ptr = X, X.data_ptr()  # that tensor object, where it was
        self.own, self.recv, self.nbytes, self.like = own, recv, nbytes, like
        heads = own[:, :8].view(torch.int64)  # [m, 1]: each row's 8 header bytes
        self.host = heads.is_cpu
        self.heads = heads.numpy() if self.host else heads
        self.header = header_int64(compressor.plan(like))

    def send(self, X: torch.Tensor) -> Rows:
        if self.host:
            self.heads[:] = self.header
        else:
            self.heads.fill_(self.header)
        out = Rows(self.own, self.recv, self.nbytes, self.compressor, self.like, None, self.route)
        out.source = (X, X._version)
        return out


class StaticPhase:
    """A phase of a round that repeats, recorded by :meth:`Block.static_phase`: a tensor sent
    from its own memory (``sent``, an :class:`_InPlace`: the send writes only the headers) and
    mixed, own and received messages together, by the dense kernel (``mixed``, the
    :class:`_DenseRepeat` of that call). While :attr:`Block.replay` holds it, the block answers
    the recorded calls, the same objects again, with the guards that cannot be known from one
    round to the next only: the tensor's memory and version (still the one the kernel found
    finite), the model changed between send and mix (:func:`_check_source`), ``requires_grad``.
    What stays with the objects (the plan, the staging rows, the kernel's arguments, the
    dispatcher's choices) is checked once per round by the engine, which sets it."""

    __slots__ = ("block", "sent", "mixed", "calls", "rows")

    def __init__(self, block: Block, sent: _InPlace, mixed: _DenseRepeat, calls: int):
        self.block, self.sent, self.mixed, self.calls = block, sent, mixed, calls
        self.rows: Rows | None = None  # this round's messages, once sent

    def check(self) -> None:
        """The check of the received rows (:attr:`Rows.pending`), when the kernel's result
        says it must run."""
        self.block._check_received(self.rows)
