"""Blocks of nodes: the m nodes one process hosts, as the rows of [m, d] tensors.

A block algorithm (one that defines :meth:`Algorithm.block_step`) runs a round for all of a
process's nodes at once: its tensor ops broadcast over rows, a compressor encodes the block
into an [m, nbytes] uint8 tensor whose rows are the messages, and mixing is a loop over
*degree slots*: slot k adds, for every node, the k-th of its in-neighbors in sorted order
(one gather and one weighted decode-add per slot). Every node's sums therefore run in exactly
the order a per-node loop uses, so a run gives the same bits whether its nodes sit in one
process, one per MPI rank, or several per rank.

A phase's messages are a :class:`Rows`: ``own`` ([m, pitch] uint8, 8-aligned rows) holds this
block's messages and ``recv`` ([R, pitch]) receives the R messages that arrive from other
processes (one per remote in-edge, sorted by (sender, receiver)); staging row index ``m + e``
means ``recv[e]``. Usually both are one staging buffer. The transport sends row views and
receives into rows in place, so nothing is copied between encode, wire and decode; and a model
allocated in message rows (:meth:`Block.message_tensor`, as ``block.x`` is) goes out with the
``none`` compressor without even the encode's copy: only the 8-byte headers are written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gossip.compress import Compressor
from gossip.compress.base import CompressionError, row_stride
from gossip.compress.rows import LOOP_FROM
from gossip.rng import Stream


class IdentityCache:
    """Values derived from objects (a round's topology, a route), kept while that very object
    comes back: keyed by identity, the object held so its id cannot be reused, at most
    ``limit`` entries (a graph that changes every round brings a new object each round)."""

    def __init__(self, limit: int = 64) -> None:
        self._items: dict[int, tuple[Any, Any]] = {}
        self.limit = limit

    def get(self, obj: Any, make: Callable[[], Any]) -> Any:
        """The value for ``obj``, from ``make()`` the first time."""
        hit = self._items.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        if len(self._items) > self.limit:
            self._items.clear()
        value = make()
        self._items[id(obj)] = (obj, value)
        return value


class RowsError(CompressionError):
    """A message of a block phase was refused; ``sender``/``receiver`` name the nodes."""


@dataclass
class MixPlan:
    """One round's routing for a block, as row indices (built once per topology round).

    ``slots[k] = (src, dst, weight)``: for the nodes ``dst`` (local rows, None = all rows)
    the k-th in-neighbor's message is staging row ``src`` and weighs ``weight`` (float64).
    """

    m: int
    self_weight: torch.Tensor  # [m] float64, W_ii
    slots: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]
    remote_in: list[tuple[int, int, int]]  # (sender id, receiver id, staging row), sorted
    remote_out: list[tuple[int, int]]  # (sender row, receiver id), sorted by (sender, receiver)
    out_degree: list[int]  # messages each row sends (local and remote), for byte counts
    sender_of: list[int]  # staging row -> sender node id
    senders: list[int]  # own row -> its node id (the block's ids)
    fused: tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice | None] | None = None
    with_own: tuple[torch.Tensor, torch.Tensor] | None = None
    """``fused``'s (src, dst) with every node's own row first (own term, then the slots)."""
    cache: dict[Any, Any] = field(default_factory=dict)
    """Index tensors derived from the plan (e.g. :meth:`Block.mix_into`'s ``copy=`` targets)."""
    """Every slot in one (src, dst, weight, src as a slice when it is a range), slot-major: a
    decode that adds repeated targets in row order sums each node's neighbors in sorted order."""

    def __post_init__(self) -> None:
        if not self.slots:
            return
        src = torch.cat([s for s, _, _ in self.slots])
        device = src.device
        every = torch.arange(self.m, device=device)
        dst = torch.cat([every if d is None else d for _, d, _ in self.slots])
        w = torch.cat([w for _, _, w in self.slots])
        first = int(src[0])
        rng = None
        if torch.equal(src.cpu(), torch.arange(first, first + src.numel())):
            rng = slice(first, first + src.numel())
        self.fused = (src, dst, w, rng)
        self.with_own = (torch.cat((every, src)), torch.cat((every, dst)))

    @classmethod
    def build(cls, topology: Any, ids: list[int], is_local: Callable[[int], bool],
              device: torch.device) -> MixPlan:
        m = len(ids)
        row_of = {i: r for r, i in enumerate(ids)}
        views = [topology.view(i) for i in ids]
        remote_in = sorted((j, i) for i, v in zip(ids, views) for j in v.in_neighbors
                           if not is_local(j))
        staging_of = {edge: m + e for e, edge in enumerate(remote_in)}
        deg = max((len(v.in_neighbors) for v in views), default=0)
        slots = []
        for k in range(deg):
            src, dst, w = [], [], []
            for r, (i, v) in enumerate(zip(ids, views)):
                if k < len(v.in_neighbors):
                    j = v.in_neighbors[k]
                    src.append(row_of[j] if j in row_of else staging_of[(j, i)])
                    dst.append(r)
                    w.append(v.in_weights[k])
            as_long = torch.tensor(src, dtype=torch.int64, device=device)
            rows = None if len(dst) == m else torch.tensor(dst, dtype=torch.int64, device=device)
            slots.append((as_long, rows, torch.tensor(w, dtype=torch.float64, device=device)))
        remote_out = sorted((row_of[i], j) for i, v in zip(ids, views) for j in v.out_neighbors
                            if not is_local(j))
        return cls(
            m=m,
            self_weight=torch.tensor([v.self_weight for v in views], dtype=torch.float64,
                                     device=device),
            slots=slots,
            remote_in=[(j, i, staging_of[(j, i)]) for j, i in remote_in],
            remote_out=[(r, j) for r, j in sorted(remote_out, key=lambda e: (ids[e[0]], e[1]))],
            out_degree=[len(v.out_neighbors) for v in views],
            sender_of=list(ids) + [j for j, _ in remote_in],
            senders=list(ids),
        )


@dataclass
class ArcPlan:
    """The routing of a phase that sends a different message along each arc (per-edge methods:
    PowerGossip's sketches, C-ECL's duals, an all-reduce's chunks); built by
    :meth:`Block.arc_plan`.

    Own row a is the message of ``arcs[a] = (sender, receiver)``, the arcs this block sends,
    sorted; staging row ``A + e`` (A = own rows) is ``recv[e]``, the e-th of ``remote_in``.
    ``incoming`` are the arcs this block receives, sorted by (receiver, sender): ``in_src``
    are their staging rows (``in_span`` as a slice when consecutive), ``in_dst`` the local rows
    of their receivers. Byte counts and transports read the same fields as a :class:`MixPlan`.
    """

    arcs: list[tuple[int, int]]
    incoming: list[tuple[int, int]]
    in_src: torch.Tensor
    in_dst: torch.Tensor
    in_span: slice | None
    remote_in: list[tuple[int, int, int]]  # (sender id, receiver id, staging row), sorted
    remote_out: list[tuple[int, int]]  # (own row, receiver id)
    sender_of: list[int]  # staging row -> sender node id
    senders: list[int]  # own row -> sender node id
    out_degree: list[int]  # messages per own row (one)
    receivers: list[int] = field(default_factory=list)  # incoming arc -> receiver node id

    def out_rows(self, i: int) -> slice:
        """The own rows of node ``i``'s arcs (consecutive: sorted by receiver)."""
        import bisect

        return slice(bisect.bisect_left(self.senders, i), bisect.bisect_right(self.senders, i))

    def in_rows(self, i: int) -> slice:
        """The positions in ``incoming`` of the arcs into node ``i`` (consecutive: sorted by
        sender)."""
        import bisect

        if len(self.receivers) != len(self.incoming):
            self.receivers = [r for _, r in self.incoming]
        return slice(bisect.bisect_left(self.receivers, i), bisect.bisect_right(self.receivers, i))

    @classmethod
    def build(cls, arcs: Any, ids: list[int], device: torch.device) -> ArcPlan:
        """The plan of ``arcs`` ((sender, receiver) pairs; those that touch none of ``ids``, the
        block's nodes, are dropped) for the block of ``ids``."""
        local = set(ids)
        row_of = {i: r for r, i in enumerate(ids)}
        arcs = {(int(i), int(j)) for i, j in arcs if i != j and (i in local or j in local)}
        own = sorted(a for a in arcs if a[0] in local)
        incoming = sorted((a for a in arcs if a[1] in local), key=lambda a: (a[1], a[0]))
        remote_in = sorted(a for a in incoming if a[0] not in local)
        own_row = {a: r for r, a in enumerate(own)}
        staging = {a: len(own) + e for e, a in enumerate(remote_in)}
        src = [own_row[a] if a in own_row else staging[a] for a in incoming]
        span = None
        if src and src == list(range(src[0], src[0] + len(src))):
            span = slice(src[0], src[0] + len(src))
        return cls(
            arcs=own,
            incoming=incoming,
            in_src=torch.tensor(src, dtype=torch.int64, device=device),
            in_dst=torch.tensor([row_of[i] for _, i in incoming], dtype=torch.int64, device=device),
            in_span=span,
            remote_in=[(j, i, staging[(j, i)]) for j, i in remote_in],
            remote_out=[(own_row[(i, j)], j) for i, j in own if j not in local],
            sender_of=[i for i, _ in own] + [j for j, _ in remote_in],
            senders=[i for i, _ in own],
            out_degree=[1] * len(own),
            receivers=[i for _, i in incoming],
        )


class Rows:
    """One phase's messages (see the module doc): ``own`` and ``recv`` are [rows, pitch] uint8
    with ``nbytes`` of each row used; ``compressor`` and ``like`` (a [d] row) decode them
    (None for raw bytes); ``route`` (a :class:`MixPlan` or :class:`ArcPlan`) says where they go."""

    __slots__ = ("own", "recv", "nbytes", "compressor", "like", "route", "_all")

    def __init__(self, own: torch.Tensor, recv: torch.Tensor, nbytes: int, compressor: Any,
                 like: torch.Tensor | None, both: torch.Tensor | None = None, route: Any = None):
        self.own = own
        self.recv = recv
        self.nbytes = nbytes
        self.compressor = compressor
        self.like = like
        self.route = route
        self._all = both  # own and recv as one buffer, when they are one

    def mine(self) -> torch.Tensor:
        """[m, nbytes]: the block's own messages."""
        return self.own[:, : self.nbytes]

    def received(self) -> torch.Tensor:
        """[R, nbytes]: what the other processes sent (``plan.remote_in`` order)."""
        return self.recv[:, : self.nbytes]

    def gather(self, src: torch.Tensor, span: slice | None) -> torch.Tensor:
        """The messages of staging rows ``src`` as [k, nbytes] with 8-aligned rows: a view when
        they are consecutive (``span``) in one buffer, else one gather."""
        m, nb = self.own.shape[0], self.nbytes
        if span is not None:
            if span.stop <= m:
                return self.own[span, :nb]
            if span.start >= m:
                return self.recv[span.start - m : span.stop - m, :nb]
        return self.both().index_select(0, src)[:, :nb]

    def both(self) -> torch.Tensor:
        """[m + R, pitch]: own rows then received rows (concatenated once if they are apart)."""
        if self._all is None:
            if not self.recv.shape[0]:
                self._all = self.own
            else:  # own rows may be wider (a model's message rows): the common 8-aligned width
                width = row_stride(self.nbytes)
                self._all = torch.cat([self.own[:, :width], self.recv[:, :width]])
        return self._all


class Block:
    """The nodes of one process as rows; what a block algorithm's round reads and changes.

    ``x`` ([m, d]) is the models (``nodes[r].x`` is a view of row r), ``state`` the algorithm's
    [m, ...] tensors (each node's ``state`` holds its row views, for checkpoints), ``arc_state``
    its [A, ...] tensors with a row per arc of :meth:`arc_plan` (static graphs; node i's
    ``state`` holds the rows of its out-arcs, sorted by receiver), ``nodes`` the per-node objects
    (oracles, generators, ids), ``plan`` the round's :class:`MixPlan`. An ``arc_state`` entry
    may be a list of [A, ...] tensors (a node gets the list of their rows), and a key with
    ``{j}`` gives node i one entry per out-arc (i, j), named with j, of that arc's row (or
    rows): per-neighbor state such as PowerGossip's ``P{j}``.
    """

    def __init__(self, nodes: list[Any], x: torch.Tensor | None, compressor: Compressor,
                 new_compressor: Callable[[], Compressor], seed: int = 0):
        self.nodes = nodes
        self.ids = [nd.id for nd in nodes]
        self.m = len(nodes)
        self.x = x
        self.state: dict[str, torch.Tensor] = {}
        self.arc_state: dict[str, torch.Tensor | list[torch.Tensor]] = {}
        self.arc_routes: dict[str, tuple[ArcPlan, bool]] = {}
        """``arc_state`` keys whose rows follow another plan than :meth:`arc_plan`: ``(plan,
        incoming)``, rows ``plan.arcs`` (node i's: its out-arcs) or, with ``incoming``,
        ``plan.incoming`` (node i's: its in-arcs, sorted by sender, a ``{j}`` key named by
        the sender); e.g. the arcs of a time-varying graph's whole period."""
        self.compressor = compressor
        self.seed = seed
        self.rng = Stream(seed, self.ids, 0)
        """The nodes' random streams as one (row r draws what node r's ``node.rng`` would)."""
        self._rngs: dict[Any, Stream | tuple[ArcPlan, Stream]] = {}
        self._arc_plans: dict[Any, tuple[MixPlan | None, ArcPlan]] = {}
        self.round = 0
        self.plan: MixPlan | None = None
        self._new_compressor = new_compressor
        self._streams: dict[str, Compressor] = {}
        self._staging: dict[tuple[int, bool], torch.Tensor] = {}
        self._message_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._scratches: dict[Any, torch.Tensor] = {}
        self._stacks: dict[int, torch.Tensor] = {}
        self._stacked_hits: dict[Any, tuple[torch.Tensor, list[int]] | None] = {}
        self._calls = 0

    @property
    def has_oracle(self) -> bool:
        return self.m > 0 and self.nodes[0].oracle is not None

    @property
    def self_weight(self) -> torch.Tensor:
        """``W_ii`` of every row ([m] float64)."""
        return self.plan.self_weight

    def begin_round(self, t: int, plan: MixPlan) -> None:
        self.round = t
        self.plan = plan
        self._calls = 0
        self.rng.begin_round(t)
        for rng in self._rngs.values():
            (rng[1] if isinstance(rng, tuple) else rng).begin_round(t)

    def stream_compressor(self, stream: str) -> Compressor:
        """The block's compressor for the extra message stream ``stream`` (one per name)."""
        comp = self._streams.get(stream)
        if comp is None:
            comp = self._streams[stream] = self._new_compressor()
        return comp

    def stream_rng(self, stream: str) -> Stream:
        """The nodes' random streams for the message stream ``stream`` (rows as ``node.stream_rng``)."""
        rng = self._rngs.get(stream)
        if rng is None:
            rng = self._rngs[stream] = Stream(self.seed, self.ids, stream)
            rng.begin_round(self.round)
        return rng

    def arc_plan(self, arcs: Any = None) -> ArcPlan:
        """The routing of a phase with one message per arc, over ``arcs`` ((sender, receiver)
        pairs; default: every arc of this round's graph into or out of the block). Cached."""
        key = (id(self.plan), None if arcs is None else tuple(sorted(arcs)))
        hit = self._arc_plans.get(key)
        if hit is not None and hit[0] is self.plan:
            return hit[1]
        if arcs is None:
            views = [nd.view for nd in self.nodes]
            arcs = [(i, j) for i, v in zip(self.ids, views) for j in v.out_neighbors]
            arcs += [(j, i) for i, v in zip(self.ids, views) for j in v.in_neighbors]
        if len(self._arc_plans) > 64:
            self._arc_plans.clear()
        device = self.x.device if self.x is not None else torch.device("cpu")
        plan = ArcPlan.build(arcs, self.ids, device)
        self._arc_plans[key] = (self.plan, plan)
        return plan

    def arc_rng(self, route: ArcPlan, stream: str = "arc", undirected: bool = False) -> Stream:
        """Random streams for ``route``'s own rows, keyed by the arc (placement-independent).
        ``undirected``: keyed by the unordered pair under ``stream``; with ``stream="edge"``
        row a draws what ``node.edge_rng(j)`` draws for arc a = (node, j)."""
        key = (id(route), stream, undirected)
        hit = self._rngs.get(key)
        if hit is not None and hit[0] is route:
            return hit[1]
        pair = (lambda i, j: (min(i, j) << 32 | max(i, j))) if undirected else (lambda i, j: i << 32 | j)
        rng = Stream(self.seed, [pair(i, j) for i, j in route.arcs], stream)
        arc_keys = [k for k, v in self._rngs.items() if isinstance(v, tuple)]
        if len(arc_keys) > 64:  # a graph that changes every round makes a route per round
            for k in arc_keys:
                del self._rngs[k]
        rng.begin_round(self.round)
        self._rngs[key] = (route, rng)
        return rng

    # -- messages ------------------------------------------------------------------------------
    def message_tensor(self, d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [m, d] tensor whose rows sit in message rows, so the ``none`` compressor sends it
        as it is (only the 8 header bytes before each row are written). Every row starts
        64-byte aligned, as a node's own tensor would (oracles' kernels round by alignment);
        the rows are padded, so the tensor is not contiguous as a whole (each row is)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        pitch = -(-(_ALIGN + d * itemsize) // _ALIGN) * _ALIGN
        buf = _message_buffer((self.m, pitch), device, align=_ALIGN)
        X = buf[:, _ALIGN : _ALIGN + d * itemsize].view(dtype)
        self._message_rows[X.data_ptr()] = (buf[:, _ALIGN - 8 :], X)  # messages start 8 before
        return X

    def encode(self, X: torch.Tensor, compressor: Compressor | None = None,
               rng: Stream | None = None, route: Any = None) -> Rows:
        """Encode every row of ``X`` into this phase's message rows (see the module doc);
        randomized compressors draw from ``rng`` (default: the block's main streams).
        ``route`` is the round's :class:`MixPlan` (default: one message per node, to all its
        out-neighbors) or an :class:`ArcPlan` (``X`` has a row per arc, :meth:`arc_rng` draws).

        With ``none``, ``block.x`` is sent from its own memory, so those messages read the
        model as it is when they are decoded: decode (``decode_add``, ``mix_into``) before
        changing ``x``, as every algorithm here does."""
        comp = compressor or self.compressor
        route = route or self.plan
        rng = rng or self.rng
        rows = len(route.senders)
        if X.shape[0] != rows:
            raise ValueError(f"{X.shape[0]} rows to encode for a phase of {rows} messages")
        like = X[0] if rows else X[:1].reshape(X.shape[1:])
        nbytes = comp.nbytes_rows(like)
        pitch = row_stride(nbytes)
        remote = len(route.remote_in)
        in_place = self._message_rows.get(X.data_ptr())
        if (in_place is not None and in_place[1].shape == X.shape and in_place[1].stride() == X.stride()
                and comp.sends_values_in_place and in_place[0].shape[1] >= nbytes):
            own = in_place[0]
            recv = self._buffer((remote, pitch), X.device, recv_only=True)
            both = None
        else:
            both = self._buffer((rows + remote, pitch), X.device)
            own, recv = both[:rows], both[rows:]
        self._calls += 1
        mine = own[:, :nbytes]
        if comp.stateful:
            if route is not self.plan:
                raise CompressionError(f"'{comp.spec}' keeps state per node and cannot encode one "
                                       "message per arc: use a stateless compressor")
            self._encode_per_node(comp, X, mine, rng)
        else:
            try:
                block = comp.encode_rows(X, rng, out=mine)
            except CompressionError as exc:
                row = getattr(exc, "row", None)
                who = f"node {route.senders[row]}" if row is not None else "a node"
                raise CompressionError(f"{who} could not encode its message: {exc}") from exc
            if block.data_ptr() != mine.data_ptr():
                mine.copy_(block)
        return Rows(own, recv, nbytes, comp, like, both, route)

    def message_rows(self, nbytes: int, route: Any = None) -> Rows:
        """Empty message rows of ``nbytes`` raw bytes each, to fill through ``rows.mine()`` and
        ``yield`` (values an algorithm lays out itself, e.g. exact float sketches); the
        transport checks only their length."""
        route = route or self.plan
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
            buf = self._staging[key] = _message_buffer(shape, device)
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

    def decode_add(self, out: torch.Tensor, rows: Rows, weight: float = 1.0) -> torch.Tensor:
        """``out[r] += weight·C(q_r)``: every own row adds its own message (e.g. a node to its
        public copy, an arc to its sender's copy of what it sent)."""
        self._decode_add(rows.compressor, out, rows.mine(), float(weight), None, None,
                         rows.route.arcs if isinstance(rows.route, ArcPlan) else None)
        return out

    def received_arcs(self, rows: Rows) -> torch.Tensor:
        """[E, nbytes]: the messages of an :class:`ArcPlan` phase this block received, one per
        arc of ``route.incoming`` (sorted by receiver, then sender)."""
        route = rows.route
        return rows.gather(route.in_src, route.in_span)

    def decode_received(self, out: torch.Tensor, rows: Rows, weight: Any = 1.0) -> torch.Tensor:
        """``out[e] += weight·C(q_e)`` for every arc e of ``rows.route.incoming``."""
        route = rows.route
        w = weight if isinstance(weight, torch.Tensor) else float(weight)
        self._decode_add(rows.compressor, out, self.received_arcs(rows), w, None, None,
                         route.incoming)
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
        key = tuple((t.data_ptr(), t.shape, t.stride()) for t in parts)
        if key not in self._stacked_hits:
            if len(self._stacked_hits) > 64:
                self._stacked_hits.clear()
            self._stacked_hits[key] = self._find_stacked_rows(parts)
        return self._stacked_hits[key]

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
                 copy: torch.Tensor | None = None) -> torch.Tensor:
        """``out += scale·(w_ii·C(own) + Σ_j w_ij·C(q_j))`` for every row, neighbors in sorted
        order (the order a per-node loop sums in); with ``copy`` (and ``own``) also
        ``copy += C(own)``, a public copy such as CHOCO's x̂.

        The own term decodes the block's rows in place; the neighbors' messages are gathered
        once (a view when they sit in consecutive rows, e.g. one node per rank) and decoded in
        one call when the compressor adds repeated targets in row order on this device, else
        one degree slot at a time. That one call also updates ``copy`` when ``copy`` and
        ``out`` are parts of one :meth:`stacked` tensor."""
        comp, m = inbox.compressor, self.m
        fused = self.plan.fused
        ordered = comp.ordered_rows and out.device.type == "cpu"
        w_own = None
        if own is not None:
            w_own = self.plan.self_weight if own_weight is None else own_weight
            w_own = w_own * scale if scale != 1.0 else w_own
        if (own is inbox and ordered and fused is not None and fused[3] is None
                and not comp.sends_values_in_place):  # own and neighbors in one call
            src, dst = self.plan.with_own
            stack = self._stacked_rows(copy, out) if copy is not None else None
            if stack is None and copy is not None:
                self._decode_add(comp, copy, own.mine(), 1.0, None, None)
            plain = own_weight is None and scale == 1.0  # the plan's weights: cached
            key = ("own", tuple(stack[1]) if stack else None)
            hit = self.plan.cache.get(key) if plain else None
            if hit is None:
                w = torch.cat((w_own, fused[2] * scale if scale != 1.0 else fused[2]))
                if stack is not None:  # the copy's rows too: one decode for both
                    (c0, o0), every = stack[1], torch.arange(m, device=src.device)
                    src, dst = torch.cat((every, src)), torch.cat((every + c0, dst + o0))
                    w = torch.cat((torch.ones(m, dtype=w.dtype, device=w.device), w))
                hit = (src, dst, w)
                if plain:
                    self.plan.cache[key] = hit
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
        if ordered or len(self.plan.slots) == 1:
            src, dst, w, span = fused
            self._decode_from(comp, out, inbox, src, span, w * scale if scale != 1.0 else w,
                              dst if dst.numel() != m or len(self.plan.slots) > 1 else None)
            return out
        for src, dst, w in self.plan.slots:
            self._decode_from(comp, out, inbox, src, None, w * scale if scale != 1.0 else w, dst)
        return out

    def _decode_from(self, comp: Compressor, out: torch.Tensor, inbox: Rows, src: torch.Tensor,
                     span: slice | None, w: torch.Tensor, dst: torch.Tensor | None) -> None:
        """Decode-add staging rows ``src`` of ``inbox`` into rows ``dst`` of ``out`` (None: rows
        0..k−1), in order. Long CPU rows go one message at a time from views of the staging
        rows: gathering them first would copy every message once per receiver (most of an
        exact gossip round at d = 10⁶), and a batched decode gains nothing on rows that long."""
        if span is not None or not (out.is_cpu and out.shape[1] >= LOOP_FROM):
            self._decode_add(comp, out, inbox.gather(src, span), w, dst, src)
            return
        targets = dst if dst is not None else torch.arange(src.numel(), device=src.device)
        for i, s in enumerate(src.tolist()):
            self._decode_add(comp, out, inbox.gather(src[i : i + 1], slice(s, s + 1)), w[i : i + 1],
                             targets[i : i + 1], src[i : i + 1])

    def check_received(self, rows: Rows) -> None:
        """Validate the messages that came from other processes (rows ``m..``), once per phase;
        the block's own rows were checked when they were encoded."""
        remote = rows.route.remote_in
        if not remote or rows.compressor is None:
            return
        try:
            rows.compressor.check_rows(rows.received(), rows.like)
        except CompressionError as exc:
            sender, receiver, _ = remote[exc.row]
            err = RowsError(f"the message from node {sender} to node {receiver} was refused: {exc}")
            err.sender, err.receiver = sender, receiver
            raise err from exc

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
            err = RowsError(f"the message from node {sender} to node {receiver} was refused: {exc}")
            err.sender, err.receiver = sender, receiver
            raise err from exc

    # -- local work ------------------------------------------------------------------------------
    def gradients(self, out: torch.Tensor) -> torch.Tensor:
        """Every node's gradient at its row of ``x``, into the rows of ``out`` (through
        :meth:`oracle_call`: the bits do not depend on a row's place in the block)."""
        for r, nd in enumerate(self.nodes):
            self.oracle_call(nd.oracle.grad, self.x[r], out=out[r])
        return out

    def oracle_call(self, fn: Callable[..., torch.Tensor], *rows: Any,
                    out: torch.Tensor) -> torch.Tensor:
        """``out = fn(*rows, out)`` with every row tensor 64-byte aligned, as a node's own
        tensors are: BLAS kernels round differently at other alignments, and a row's alignment
        depends on its place in the block, so misaligned rows go through aligned copies."""
        args = [self._aligned(a, k) if isinstance(a, torch.Tensor) else a
                for k, a in enumerate(rows)]
        dst = out if out.data_ptr() % _ALIGN == 0 else self._scratch(out, "out")
        g = fn(*args, dst)
        if g.data_ptr() != out.data_ptr():
            out.copy_(g)
        return out

    def _aligned(self, row: torch.Tensor, k: int) -> torch.Tensor:
        return row if row.data_ptr() % _ALIGN == 0 else self._scratch(row, k).copy_(row)

    def _scratch(self, like: torch.Tensor, key: Any) -> torch.Tensor:
        t = self._scratches.get(key)
        if t is None or t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
            t = self._scratches[key] = torch.empty_like(like, memory_format=torch.contiguous_format)
        return t

    def local_step(self, grad: torch.Tensor, eta: float) -> None:
        """``x ← x − η g`` for every row, or each node's own optimizer step when it has one."""
        apply = [getattr(nd.oracle, "apply_step", None) for nd in self.nodes]
        if all(a is None for a in apply):
            self.x.add_(grad, alpha=-eta)
            return
        for r, a in enumerate(apply):
            if a is not None:
                a(self.x[r], grad[r], self.round)
            else:
                self.x[r].add_(grad[r], alpha=-eta)

    def mirror_state(self) -> None:
        """Give every node the row views of ``state`` and its out-arcs' rows of ``arc_state``
        (what checkpoints save and restore)."""
        default = self.arc_plan() if set(self.arc_state) - set(self.arc_routes) else None
        for r, nd in enumerate(self.nodes):
            nd.state.clear()
            for key, value in self.state.items():
                nd.state[key] = value[r]
            for key, value in self.arc_state.items():
                route, incoming = self.arc_routes.get(key, (default, False))
                arcs = route.incoming if incoming else route.arcs
                parts = value if isinstance(value, list) else [value]
                for part in parts:
                    if part.shape[0] != len(arcs):
                        raise ValueError(f"arc_state[{key!r}] has {part.shape[0]} rows for "
                                         f"{len(arcs)} arcs")
                rows = route.in_rows(nd.id) if incoming else route.out_rows(nd.id)
                if "{j}" not in key:
                    nd.state[key] = value[rows] if parts is not value else [p[rows] for p in parts]
                    continue
                for a in range(rows.start, rows.stop):  # one entry per arc, named by the neighbor
                    view = [p[a] for p in parts] if parts is value else value[a]
                    nd.state[key.format(j=arcs[a][0] if incoming else arcs[a][1])] = view

    # -- messages of several parts -------------------------------------------------------------
    # -- messages of several parts --------------------------------------------------------
    def pack(self, parts: list[Rows | torch.Tensor]) -> PackedRows:
        """Several messages of one phase sent as one, byte for byte what a per-node round's
        :func:`gossip.algorithms.base.pack` sends: ``[count][len_1]…[len_k]`` (8 bytes each)
        then the parts. Each part is :class:`Rows` from :meth:`encode` or a raw [m, b] uint8
        tensor (e.g. push-sum's weight); ``yield`` the result, then decode ``packed.parts[k]``
        as if that part had been sent alone. The parts share one route (that of the
        :class:`Rows` parts; the round's plan for raw tensors alone)."""
        sizes = [p.nbytes if isinstance(p, Rows) else int(p.shape[1]) for p in parts]
        route = next((p.route for p in parts if isinstance(p, Rows)), self.plan)
        head = (len(parts) + 1) * _LEN
        nbytes = head + sum(sizes)
        pitch = row_stride(nbytes)
        device = self.x.device
        m = len(route.senders)
        both = self._buffer((m + len(route.remote_in), pitch), device)
        self._calls += 1
        header = torch.tensor([len(parts), *sizes], dtype=torch.int64).view(torch.uint8)
        both[:m, :head].copy_(header.to(device).expand(m, head))
        views, offsets, pos = [], [], head
        for p, nb in zip(parts, sizes):
            both[:m, pos : pos + nb].copy_(p.mine() if isinstance(p, Rows) else p)
            comp, like = (p.compressor, p.like) if isinstance(p, Rows) else (None, None)
            views.append(Rows(both[:m, pos : pos + nb], both[m:, pos : pos + nb], nb, comp, like,
                              both[:, pos : pos + nb], route))
            offsets.append(pos)
            pos += nb
        packed = PackedRows(both[:m], both[m:], nbytes, _PackedParts(header, views, offsets),
                            None, both, route)
        packed.parts = views
        return packed

    def encode_parts(self, parts: list[torch.Tensor],
                     compressors: list[Compressor | None] | None = None,
                     rngs: list[Stream | None] | None = None) -> tuple[PackedRows, list[Rows]]:
        """Encode several [m, d] tensors (part k with ``compressors[k]`` and ``rngs[k]``,
        defaults as :meth:`encode`) and :meth:`pack` them: the message to ``yield`` and its
        parts, to decode after the exchange."""
        k = len(parts)
        comps = compressors or [None] * k
        streams = rngs or [None] * k
        packed = self.pack([self.encode(X, c, r) for X, c, r in zip(parts, comps, streams)])
        return packed, packed.parts


def _message_buffer(shape: tuple[int, int], device: torch.device, align: int = 8) -> torch.Tensor:
    """A [rows, pitch] uint8 buffer starting ``align``-byte aligned; on CPU numpy-allocated (MPI
    moves such buffers about twice as fast as torch-allocated ones with the MPICH wheel; see
    docs/performance.md)."""
    n = shape[0] * shape[1]
    if device.type == "cpu":
        import numpy as np

        raw = torch.from_numpy(np.empty(n + align, dtype=np.uint8))
    else:
        raw = torch.empty(n + align, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % align
    return raw[skip : skip + n].view(shape)


_ALIGN = 64  # bytes: the alignment of fresh torch tensors, which oracles' kernels expect
_LEN = 8  # bytes of each field of a packed message's header (as gossip.algorithms.base.pack)


class PackedRows(Rows):
    """A phase of several messages (:meth:`Block.pack`); ``parts[k]`` is the k-th as
    :class:`Rows`, column views of the same rows."""

    __slots__ = ("parts",)


class _PackedParts:
    """The ``compressor`` of :class:`PackedRows`: checks what other processes sent (the header,
    then each compressed part in its columns; an error's ``row`` is the received row)."""

    sends_values_in_place = False
    stateful = False

    def __init__(self, header: torch.Tensor, parts: list[Rows], offsets: list[int]):
        self.header = header
        self.parts = parts
        self.offsets = offsets

    def check_rows(self, block: torch.Tensor, like: Any) -> None:
        head = self.header.numel()
        bad = (block[:, :head] != self.header.to(block.device)).any(1)
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            err = CompressionError(f"packed message header {block[row, :head].tolist()} is not "
                                   f"the expected {self.header.tolist()} (parts and sizes)")
            err.row = row
            raise err
        for part, off in zip(self.parts, self.offsets):
            if part.compressor is not None:
                part.compressor.check_rows(block[:, off : off + part.nbytes], part.like)
