"""Where a phase's messages go, as row indices: built once per round's graph, read by mixing,
decoding, byte counts and the transports.

A :class:`MixPlan` routes one message per node to all its out-neighbors (degree slots: slot k
adds, for every node, its k-th in-neighbor in sorted order); an :class:`ArcPlan` routes one
message per arc (per-edge methods); :class:`RowSums` adds per-arc values into their nodes'
rows in the order of a per-node loop over sorted neighbors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


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
        whole = _whole_graph(topology, ids)
        if whole is not None:
            return cls._build_whole(whole, device)
        row_of = {i: r for r, i in enumerate(ids)}
        views = [topology.view(i) for i in ids]
        remote_in = sorted((j, i) for i, v in zip(ids, views) for j in v.in_neighbors
                           if not is_local(j))
        staging_of = {edge: m + e for e, edge in enumerate(remote_in)}
        deg = max((len(v.in_neighbors) for v in views), default=0)
        columns: list[tuple[list[int], list[int], list[float]]] = [([], [], []) for _ in range(deg)]
        for r, (i, v) in enumerate(zip(ids, views)):  # each arc once: O(arcs), not O(deg · m)
            for k, (j, weight) in enumerate(zip(v.in_neighbors, v.in_weights)):
                src, dst, w = columns[k]
                src.append(row_of[j] if j in row_of else staging_of[(j, i)])
                dst.append(r)
                w.append(weight)
        slots = []
        for src, dst, w in columns:
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

    @classmethod
    def _build_whole(cls, W: Any, device: torch.device) -> MixPlan:
        """:meth:`build` for a block that hosts every node (in process), from the weight
        matrix's rows as arrays instead of n node views: the same plan (slot k of row i is
        its k-th in-neighbor in sorted order, as ``topology.view(i)`` lists them), without a
        per-node loop (10⁶ nodes: a second instead of a minute)."""
        import numpy as np
        import scipy.sparse as sp

        rows = sp.csr_array(W, dtype=np.float64, copy=True)
        rows.eliminate_zeros()
        rows.sort_indices()
        n = rows.shape[0]
        indptr, cols, vals = rows.indptr, rows.indices.astype(np.int64), rows.data
        row = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        own = cols == row
        self_weight = np.bincount(row[own], weights=vals[own], minlength=n)
        row, cols, vals = row[~own], cols[~own], vals[~own]
        degree = np.bincount(row, minlength=n)
        start = np.cumsum(degree) - degree
        slot = np.arange(row.size, dtype=np.int64) - start[row]
        slots = []
        for k in range(int(degree.max()) if n else 0):
            pick = slot == k
            dst = row[pick]
            slots.append((torch.from_numpy(cols[pick]).to(device),
                          None if dst.size == n else torch.from_numpy(dst).to(device),
                          torch.from_numpy(vals[pick].copy()).to(device)))
        ids = list(range(n))
        return cls(m=n, self_weight=torch.from_numpy(self_weight).to(device), slots=slots,
                   remote_in=[], remote_out=[],
                   out_degree=np.bincount(cols, minlength=n).tolist(),
                   sender_of=ids, senders=list(ids))


def _whole_graph(topology: Any, ids: list[int]) -> Any:
    """The weight matrix of ``topology`` when the block hosts all its nodes in order (then no
    neighbor is remote and rows are node ids), else None (the per-view build)."""
    W = getattr(topology, "W", None)
    n = getattr(topology, "n", None)
    if W is None or n is None or len(ids) != n or getattr(W, "shape", None) != (n, n):
        return None
    if n and (ids[0] != 0 or ids[-1] != n - 1):
        return None
    return W


@dataclass
class ArcPlan:
    """The routing of a phase that sends a different message along each arc (per-edge methods:
    PowerGossip's sketches, C-ECL's duals, an all-reduce's chunks); built by
    :meth:`Block.arc_plan`.

    Own row a is the message of ``arcs[a] = (sender, receiver)``, the arcs this block sends,
    sorted; staging row ``A + e`` (A = own rows) is ``recv[e]``, the e-th of ``remote_in``.
    ``incoming`` are the arcs this block receives, sorted by (receiver, sender): ``in_src``
    are their staging rows (``in_span`` as a slice when consecutive), ``in_dst`` the local rows
    of their receivers. Byte counts and transports read the same fields as a :class:`MixPlan`;
    under message loss the delivered plan keeps every row (the lost ones are neither sent nor
    received) and says which arcs arrived (``out_delivered``, ``in_delivered``).
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
    out_delivered: torch.Tensor | None = None
    """[A] bool: own arc a's message of this phase was delivered (None: every one was). Set on
    the plan a phase that lost messages is delivered on (:mod:`gossip.network.loss`): the
    sender's acknowledgements."""
    in_delivered: torch.Tensor | None = None
    """[E] bool: the message of ``incoming[e]`` arrived (None: every one did); the receiver's
    side of the same draws. :meth:`Block.decode_received` skips the others."""
    out_late: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    """Under ``stale=`` (``on_loss = "ack"``, :mod:`gossip.network.stale`): the block's own
    messages of this or earlier rounds that their receivers are handed this round (what the
    sender counts as applied at the other end), in layers: layer k is ``(a, src)``, the own
    arcs ``a`` (indices into :attr:`arcs`) whose k-th message due now sits in staging row
    ``src``; a layer names each arc once and the layers run in send order.
    :meth:`Block.decode_acked` decodes them. None: no late messages."""
    in_late: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    """The receivers' side of :attr:`out_late`: layer k is ``(e, src)``, the arcs ``e``
    (indices into :attr:`incoming`) whose k-th message handed over now sits in staging row
    ``src``; :meth:`Block.decode_received` decodes these instead of this round's messages."""

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


class RowSums:
    """Sums of per-arc values into rows: ``targets[a]`` is arc a's row (each row's arcs
    consecutive, in the order they add). ``slots[k]``: the k-th arc of every row that has one
    (arc indices, and the rows, or None when they are all the rows in order), so a slot adds
    to distinct rows and every row's sum runs in arc order."""

    def __init__(self, targets: list[int], m: int, device: torch.device):
        first: dict[int, int] = {}
        count: dict[int, int] = {}
        for a, t in enumerate(targets):
            first.setdefault(t, a)
            count[t] = count.get(t, 0) + 1
        order = list(first)  # rows in order of their first arc
        self.slots: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for k in range(max(count.values(), default=0)):
            rows = [t for t in order if count[t] > k]
            idx = torch.tensor([first[t] + k for t in rows], dtype=torch.int64, device=device)
            every = rows == list(range(m))
            self.slots.append((idx, None if every else torch.tensor(rows, dtype=torch.int64,
                                                                    device=device)))

    def add_(self, out: torch.Tensor, vals: torch.Tensor, weight: torch.Tensor) -> None:
        """``out[targets[a]] += weight[a]·vals[a]`` for every arc a, each row's arcs in order,
        with the roundings of ``out_r.add_(v, alpha=w)`` (``weight`` [A], cast to ``out``'s
        dtype as ``add_`` casts alpha)."""
        w = weight.to(out.dtype).view(-1, *([1] * (vals.dim() - 1)))
        for arcs, rows in self.slots:
            v, wk = vals.index_select(0, arcs), w.index_select(0, arcs)
            if rows is None:
                out.addcmul_(v, wk)  # bit for bit add_(v, alpha=w), row by row
            else:
                cur = out.index_select(0, rows)
                cur.addcmul_(v, wk)
                out.index_copy_(0, rows, cur)
