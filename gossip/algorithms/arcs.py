"""Per-arc block rounds: a block's own arcs seen from their senders (PowerGossip, C-ECL).

An :class:`~gossip.engine.routing.ArcPlan`'s own rows are the arcs (i, j) the block sends, sorted by
(sender, receiver); per-edge methods keep state per arc ([A, ...] tensors) and sum over a
node's arcs. :class:`OutArcs` gives each arc's sender row and weight and adds per-arc values
into their senders' rows in the order a per-node loop over sorted neighbors uses.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.engine.routing import ArcPlan
from gossip.errors import ConfigError

_ALIGN = 64  # bytes: fresh tensors' alignment (BLAS kernels round differently at others)


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


class OutArcs:
    """The own arcs of ``route`` (default: the block's :meth:`~gossip.engine.block.Block.arc_plan`).

    ``src`` [A] int64: each arc's sender as a local row; ``weight`` [A] float64: ``w_ij`` of
    arc (i, j) (the weight node i gives j); ``lower`` [A] bool: ``i < j``; ``degree``: each
    row's number of arcs. ``symmetric``: arc e of ``route.incoming`` is the reverse of own arc
    e (an undirected graph: what arc (i, j) receives sits in its own row).
    """

    def __init__(self, block: Any, route: ArcPlan | None = None):
        self.route = route = route or block.arc_plan()
        device = block.x.device
        row_of = {i: r for r, i in enumerate(block.ids)}
        views = {nd.id: nd.view for nd in block.nodes}
        arcs = route.arcs
        src = [row_of[i] for i, _ in arcs]
        self.src = torch.tensor(src, dtype=torch.int64, device=device)
        self.weight = torch.tensor([views[i].weight_of(j) for i, j in arcs], dtype=torch.float64,
                                   device=device)
        self.lower = torch.tensor([i < j for i, j in arcs], dtype=torch.bool, device=device)
        self.symmetric = route.incoming == [(j, i) for i, j in arcs]
        self.degree = [0] * block.m
        for r in src:
            self.degree[r] += 1
        self.sums = RowSums(src, block.m, device)

    def require_symmetric(self, name: str) -> None:
        if not self.symmetric:
            raise ConfigError(f"{name} exchanges along every edge both ways: it needs an "
                              "undirected graph")

    def add_to_senders(self, out: torch.Tensor, vals: torch.Tensor, weight: torch.Tensor) -> None:
        """``out[src[a]] += weight[a]·vals[a]`` for every arc a, each node's arcs in the order
        of its sorted neighbors (:meth:`RowSums.add_`)."""
        self.sums.add_(out, vals, weight)


def aligned_arcs(count: int, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """A [count, *shape] tensor (zeros) whose every row is contiguous and starts 64-byte
    aligned, as a fresh tensor does: per-arc matrix products on its rows round as they do on
    a fresh tensor of their own (BLAS kernels round by alignment)."""
    n = 1
    for s in shape:
        n *= int(s)
    item = torch.empty((), dtype=dtype).element_size()
    pitch = max(-(-n * item // _ALIGN) * _ALIGN // item, 1)
    raw = torch.zeros(count * pitch + _ALIGN // item, dtype=dtype, device=device)
    skip = (-raw.data_ptr() % _ALIGN) // item
    return raw[skip : skip + count * pitch].view(count, pitch)[:, :n].view(count, *shape)
