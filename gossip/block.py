"""Blocks of nodes: the m nodes one process hosts, as the rows of [m, d] tensors.

A block algorithm (one that defines :meth:`Algorithm.block_step`) runs a round for all of a
process's nodes at once: its tensor ops broadcast over rows, a compressor encodes the block
into an [m, nbytes] uint8 tensor whose rows are the messages, and mixing is a loop over
*degree slots*: slot k adds, for every node, the k-th of its in-neighbors in sorted order
(one gather and one weighted decode-add per slot). Every node's sums therefore run in exactly
the order a per-node loop uses, so a run gives the same bits whether its nodes sit in one
process, one per MPI rank, or several per rank.

Messages of a phase live in one *staging* buffer ([m + R, pitch] uint8): rows ``0..m-1`` are
this block's encoded messages, rows ``m..m+R-1`` receive the R messages that arrive from other
processes (one per remote in-edge, sorted by (sender, receiver)). The transport sends row views
and receives into rows in place; nothing is copied between encode, wire and decode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gossip.compress import Compressor
from gossip.compress.base import CompressionError, row_stride
from gossip.rng import Stream


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
    fused: tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice | None] | None = None
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
        )


class Rows:
    """One phase's messages: the staging buffer and the message length (see the module doc).

    ``mine`` is the [m, nbytes] view of this block's own messages; after the exchange the
    remote rows hold what the other processes sent.
    """

    __slots__ = ("staging", "nbytes", "compressor", "like")

    def __init__(self, staging: torch.Tensor, nbytes: int, compressor: Any, like: torch.Tensor):
        self.staging = staging
        self.nbytes = nbytes
        self.compressor = compressor
        self.like = like

    def mine(self, m: int) -> torch.Tensor:
        return self.staging[:m, : self.nbytes]


class Block:
    """The nodes of one process as rows; what a block algorithm's round reads and changes.

    ``x`` ([m, d]) is the models (``nodes[r].x`` is a view of row r), ``state`` the algorithm's
    [m, ...] tensors (each node's ``state`` holds its row views, for checkpoints), ``nodes`` the
    per-node objects (oracles, generators, ids), ``plan`` the round's :class:`MixPlan`.
    """

    def __init__(self, nodes: list[Any], x: torch.Tensor, compressor: Compressor,
                 new_compressor: Callable[[], Compressor], seed: int = 0):
        self.nodes = nodes
        self.ids = [nd.id for nd in nodes]
        self.m = len(nodes)
        self.x = x
        self.state: dict[str, torch.Tensor] = {}
        self.compressor = compressor
        self.seed = seed
        self.rng = Stream(seed, self.ids, 0)
        """The nodes' random streams as one (row r draws what node r's ``node.rng`` would)."""
        self._rngs: dict[str, Stream] = {}
        self.round = 0
        self.plan: MixPlan | None = None
        self._new_compressor = new_compressor
        self._streams: dict[str, Compressor] = {}
        self._staging: dict[int, torch.Tensor] = {}
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
            rng.begin_round(t)

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

    # -- messages ------------------------------------------------------------------------------
    def encode(self, X: torch.Tensor, compressor: Compressor | None = None,
               rng: Stream | None = None) -> Rows:
        """Encode every row of ``X`` into this phase's staging buffer (see the module doc);
        randomized compressors draw from ``rng`` (default: the block's main streams)."""
        comp = compressor or self.compressor
        rng = rng or self.rng
        like = X[0] if self.m else X
        nbytes = comp.nbytes_rows(like)
        pitch = row_stride(nbytes)
        rows = self.m + len(self.plan.remote_in)
        staging = self._staging.get(self._calls)
        if staging is None or staging.shape != (rows, pitch) or staging.device != X.device:
            staging = _message_buffer((rows, pitch), X.device)
            self._staging[self._calls] = staging
        self._calls += 1
        mine = staging[: self.m, :nbytes]
        if comp.stateful:
            self._encode_per_node(comp, X, mine, rng)
        else:
            try:
                block = comp.encode_rows(X, rng, out=mine)
            except CompressionError as exc:
                row = getattr(exc, "row", None)
                who = f"node {self.ids[row]}" if row is not None else "a node"
                raise CompressionError(f"{who} could not encode its message: {exc}") from exc
            if block.data_ptr() != mine.data_ptr():
                mine.copy_(block)
        return Rows(staging, nbytes, comp, like)

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
        """``out[r] += weight·C(q_r)``: every node adds its own message (e.g. to its public copy)."""
        self._decode_add(rows.compressor, out, rows.staging[: self.m, : rows.nbytes],
                         float(weight), None, None)
        return out

    def mix_into(self, out: torch.Tensor, own: Rows | None, inbox: Rows, *,
                 own_weight: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        """``out += scale·(w_ii·C(own) + Σ_j w_ij·C(q_j))`` for every row, neighbors in sorted
        order (the order a per-node loop sums in).

        The own term decodes the block's rows in place; the neighbors' messages are gathered
        once (a view when they sit in consecutive rows, e.g. one node per rank) and decoded in
        one call when the compressor adds repeated targets in row order on this device, else
        one degree slot at a time."""
        comp, nb, m = inbox.compressor, inbox.nbytes, self.m
        if own is not None:
            w = self.plan.self_weight if own_weight is None else own_weight
            self._decode_add(comp, out, own.staging[:m, :nb], w * scale if scale != 1.0 else w,
                             None, None)
        fused = self.plan.fused
        if fused is None:
            return out
        if comp.ordered_rows and out.device.type == "cpu" or len(self.plan.slots) == 1:
            src, dst, w, rng = fused
            msgs = (inbox.staging[rng, :nb] if rng is not None
                    else inbox.staging.index_select(0, src)[:, :nb])
            self._decode_add(comp, out, msgs, w * scale if scale != 1.0 else w,
                             dst if dst.numel() != m or len(self.plan.slots) > 1 else None, src)
            return out
        for src, dst, w in self.plan.slots:
            self._decode_add(comp, out, inbox.staging.index_select(0, src)[:, :nb],
                             w * scale if scale != 1.0 else w, dst, src)
        return out

    def check_received(self, rows: Rows) -> None:
        """Validate the messages that came from other processes (rows ``m..``), once per phase;
        the block's own rows were checked when they were encoded."""
        remote = self.plan.remote_in
        if not remote:
            return
        try:
            rows.compressor.check_rows(rows.staging[self.m :, : rows.nbytes], rows.like)
        except CompressionError as exc:
            sender, receiver, _ = remote[exc.row]
            err = RowsError(f"the message from node {sender} to node {receiver} was refused: {exc}")
            err.sender, err.receiver = sender, receiver
            raise err from exc

    def _decode_add(self, comp: Compressor, out: torch.Tensor, msgs: torch.Tensor,
                    weight: torch.Tensor | float, dst: torch.Tensor | None,
                    src: torch.Tensor | None) -> None:
        """``decode_add_rows_`` of ``msgs`` (staging rows ``src``; None: the block's own) into
        rows ``dst`` of ``out``, an error naming the sender and the receiver."""
        try:
            comp.decode_add_rows_(out, msgs, weight, rows=dst, check=False)
        except CompressionError as exc:
            row = getattr(exc, "row", None)
            if row is None:
                raise
            sender = self.plan.sender_of[int(src[row]) if src is not None else row]
            receiver = self.ids[int(dst[row]) if dst is not None else row]
            err = RowsError(f"the message from node {sender} to node {receiver} was refused: {exc}")
            err.sender, err.receiver = sender, receiver
            raise err from exc

    # -- local work ------------------------------------------------------------------------------
    def gradients(self, out: torch.Tensor) -> torch.Tensor:
        """Every node's gradient at its row of ``x``, into the rows of ``out``."""
        for r, nd in enumerate(self.nodes):
            g = nd.oracle.grad(self.x[r], out[r])
            if g.data_ptr() != out[r].data_ptr():
                out[r].copy_(g)
        return out

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
        """Give every node the row views of ``state`` (what checkpoints save and restore)."""
        for r, nd in enumerate(self.nodes):
            nd.state.clear()
            for key, value in self.state.items():
                nd.state[key] = value[r]

    # -- messages of several parts -------------------------------------------------------------
    def encode_parts(self, parts: list[torch.Tensor], compressors: list[Compressor | None] | None = None,
                     rngs: list[Stream | None] | None = None) -> tuple[Rows, list[Rows]]:
        """Several tensors as one message a node (e.g. a model and a tracker): part k of row r is
        the bytes of ``encode(parts[k][r])`` with ``compressors[k]`` and ``rngs[k]`` (defaults as
        :meth:`encode`), each part at an 8-aligned offset of the row. Every part's size is fixed
        by its shape, so the message carries no header. Returns the phase's rows (``yield``
        them) and one :class:`Rows` per part, views of the same buffer, for :meth:`decode_add` and
        :meth:`mix_into` once the exchange is done; received rows are checked part by part."""
        k = len(parts)
        comps = [c or self.compressor for c in (compressors or [None] * k)]
        streams = [r or self.rng for r in (rngs or [None] * k)]
        likes = [X[0] if self.m else X for X in parts]
        sizes = [c.nbytes_rows(like) for c, like in zip(comps, likes)]
        offsets = [0]
        for size in sizes[:-1]:
            offsets.append(offsets[-1] + row_stride(size))
        staging = self._staging_of(offsets[-1] + sizes[-1], parts[0].device)
        views = []
        for X, comp, rng, like, off, size in zip(parts, comps, streams, likes, offsets, sizes):
            self._encode_into(comp, X, staging[: self.m, off : off + size], rng)
            views.append(Rows(staging[:, off:], size, comp, like))
        return Rows(staging, offsets[-1] + sizes[-1], _PartChecks(views, offsets), likes[0]), views

    def _staging_of(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """This phase's staging buffer for messages of ``nbytes`` (reused across rounds)."""
        shape = (self.m + len(self.plan.remote_in), row_stride(nbytes))
        staging = self._staging.get(self._calls)
        if staging is None or staging.shape != shape or staging.device != device:
            staging = self._staging[self._calls] = _message_buffer(shape, device)
        self._calls += 1
        return staging

    def _encode_into(self, comp: Compressor, X: torch.Tensor, mine: torch.Tensor,
                     rng: Stream) -> None:
        """Encode the rows of ``X`` into ``mine`` ([m, nbytes] of a staging buffer), as :meth:`encode`."""
        if comp.stateful:
            self._encode_per_node(comp, X, mine, rng)
            return
        try:
            block = comp.encode_rows(X, rng, out=mine)
        except CompressionError as exc:
            row = getattr(exc, "row", None)
            who = f"node {self.ids[row]}" if row is not None else "a node"
            raise CompressionError(f"{who} could not encode its message: {exc}") from exc
        if block.data_ptr() != mine.data_ptr():
            mine.copy_(block)


def _message_buffer(shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """A staging buffer; on CPU numpy-allocated (MPI moves such buffers about twice as fast as
    torch-allocated ones with the MPICH wheel; see docs/performance.md)."""
    if device.type == "cpu":
        import numpy as np

        return torch.from_numpy(np.empty(shape, dtype=np.uint8))
    return torch.empty(shape, dtype=torch.uint8, device=device)


class _PartChecks:
    """What :meth:`Block.check_received` calls for a message of several parts
    (:meth:`Block.encode_parts`): each part's compressor checks its columns of the received rows."""

    def __init__(self, parts: list[Rows], offsets: list[int]):
        self.parts = parts
        self.offsets = offsets

    def check_rows(self, block: torch.Tensor, like: torch.Tensor) -> None:
        for part, off in zip(self.parts, self.offsets):
            part.compressor.check_rows(block[:, off : off + part.nbytes], part.like)
