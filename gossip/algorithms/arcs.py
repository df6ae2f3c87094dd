"""Per-arc block rounds: a block's own arcs seen from their senders (PowerGossip, C-ECL).

An :class:`~gossip.core.routing.ArcPlan`'s own rows are the arcs (i, j) the block sends, sorted by
(sender, receiver); per-edge methods keep state per arc ([A, ...] tensors) and sum over a
node's arcs. :class:`OutArcs` gives each arc's sender row and weight and adds per-arc values
into their senders' rows in the order a per-node loop over sorted neighbors uses
(:class:`~gossip.core.routing.RowSums`).
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.core.routing import ArcPlan, RowSums
from gossip.errors import ConfigError

_ALIGN = 64  # bytes: fresh tensors' alignment (BLAS kernels round differently at others)


class OutArcs:
    """The own arcs of ``route`` (default: the block's :meth:`~gossip.core.block.Block.arc_plan`).

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
