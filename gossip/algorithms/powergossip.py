"""PowerGossip (Vogels, Karimireddy, Jaggi NeurIPS'20; docs/algorithms/powergossip.md).

For every edge {i, j} and every matrix-shaped tensor M (``T.reshape(T.shape[0], -1)``), both
ends keep the same factors P (m×r), Q (k×r) of the edge difference ``D = M_a − M_b``
(a = max(i, j)). Rounds alternate: odd rounds orthonormalise Q and exchange ``u_i = M_i Q̂``,
even rounds orthonormalise P and exchange ``u_i = M_iᵀ P̂``. Because the sketch is linear,
``u_a − u_b`` is the sketch of D on both ends, and each node moves by the shared projection::

    M_i ← M_i − γ Σ_j w_ij (u_i − u_j) Q̂ᵀ          (odd)    M_i − γ Σ_j w_ij P̂ (u_i − u_j)ᵀ  (even)

The new factor is kept (warm start), so consecutive rounds run a power iteration on the slowly
changing difference; without warm start the input factor is redrawn from the edge's shared
stream (``node.edge_rng``) every round. With gradients (a training run) the node computes its gradient at
the pre-gossip model, gossips, then takes its local step (D-PSGD order). Tensors with
ndim ≤ 1 are gossiped exactly (rate 1). No extra hyper-parameter: γ = 1 works untuned (the
optimal over-relaxation 2/((1−λ₂)+β) is faster).
Differences from the reference code: no skipped first step; a factor that collapses below
1e-12 (the edge reached consensus) is redrawn from the edge stream instead of staying 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.base import (
    Algorithm,
    ConfigError,
    Exchange,
    Node,
    RoundGenerator,
    check_range,
    local_step,
    scheduled,
)

EPS = 1e-8


def orthonormalize(m: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Gram–Schmidt on the columns of ``m``, in place: ``col /= ‖col‖ + eps``, then project out."""
    r = m.shape[1]
    for c in range(r):
        col = m[:, c]
        col.div_(col.norm() + eps)
        if c + 1 < r:
            rest = m[:, c + 1 :]
            rest.sub_(torch.outer(col, col @ rest))
    return m


class PowerGossip(Algorithm):
    """PowerGossip: per-edge, warm-started rank-r power steps on the model differences.

    Odd steps send ``M_i Q̂`` and move ``M_i −= γ Σ_j w_ij (u_i − u_j) Q̂ᵀ``, even steps the
    same with ``P̂`` on the other side. See docs/algorithms/powergossip.md.

    Args:
        gamma: mixing step (1 works untuned). Default 1.
        rank: rank r of the per-edge factors. Default 1.
        iterations: power steps (message exchanges) per round. Default 1.
        warm_start: keep the factors between steps (False: redraw them). Default True.
        eps: Gram–Schmidt guard. Default 1e-8.
        eta: local step size or schedule (training uses the node's optimizer). Default 0.
    """
    name = "powergossip"
    trains = True
    takes_compressor = False
    takes_optimizer = True
    step_schedule = True
    step_rule = "dgd"
    needs_layout = True
    static_topology = True
    symmetric = True

    def __init__(self, gamma: float = 1.0, rank: int = 1, iterations: int = 1,
                 warm_start: bool = True, eps: float = EPS,
                 eta: float | Callable[[int], float] = 0.0):
        check_range("gamma", gamma, 0.0, 2.0, "Stable for 0 < gamma < 2/beta; 1 needs no tuning.")
        if int(rank) < 1:
            raise ConfigError(f"rank = {rank}: PowerGossip's rank must be at least 1")
        if int(iterations) < 1:
            raise ConfigError(f"iterations = {iterations}: at least one power step per round")
        self.gamma = gamma
        self.rank = int(rank)
        self.iterations = int(iterations)
        self.warm_start = bool(warm_start)
        self.eps = float(eps)
        self.eta = eta

    def validate(self, topology: Any, compressor: Any) -> None:
        if getattr(compressor, "spec", "none") != "none":
            raise ConfigError(
                "PowerGossip compresses with its own per-edge low-rank sketch: set its rank "
                "(--rank R) and leave the compressor at 'none'"
            )

    def _matrices(self, node: Node) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        mats, vecs = [], []
        for v in node.layout.views(node.x):
            (mats if v.dim() > 1 else vecs).append(v.reshape(v.shape[0], -1) if v.dim() > 1 else v)
        return mats, vecs

    def setup(self, node: Node) -> None:
        mats, _ = self._matrices(node)
        for j in node.view.neighbors:
            rng = node.edge_rng(j)  # keyed by the edge: both ends draw the same factors
            ranks = [min(self.rank, *m.shape) for m in mats]
            ps = [rng.normal(m.shape[0] * r, dtype=m.dtype, device=m.device).view(m.shape[0], r)
                  for m, r in zip(mats, ranks)]
            qs = [rng.normal(m.shape[1] * r, dtype=m.dtype, device=m.device).view(m.shape[1], r)
                  for m, r in zip(mats, ranks)]
            node.state[f"P{j}"] = ps
            node.state[f"Q{j}"] = qs
        if node.oracle is not None:
            node.state["grad"] = torch.empty_like(node.x)

    def step(self, node: Node) -> RoundGenerator:
        grad = None
        if node.oracle is not None:  # PowerGossip inside D-PSGD: gradient at the pre-gossip x
            grad = node.oracle.grad(node.x, node.state["grad"])
        for k in range(self.iterations):
            yield from self._power_step(node, (node.round - 1) * self.iterations + k + 1)
        if grad is not None:
            local_step(node, grad, scheduled(self.eta, node.round))

    def _power_step(self, node: Node, step: int) -> RoundGenerator:
        st = node.state
        right = step % 2 == 1  # odd: sketch with Q (u = M Q̂); even: with P (u = Mᵀ P̂)
        mats, vecs = self._matrices(node)
        nbrs = node.view.neighbors
        bases: dict[int, list[torch.Tensor]] = {}
        sent: dict[int, list[torch.Tensor]] = {}
        outgoing: dict[int, torch.Tensor] = {}
        for j in nbrs:
            key = f"Q{j}" if right else f"P{j}"
            basis = []
            for f in st[key]:
                if not self.warm_start or float(f.norm()) < 1e-12:
                    f.copy_(node.edge_rng(j).normal(f.numel(), dtype=f.dtype,
                                                    device=f.device).view(f.shape))
                basis.append(orthonormalize(f, self.eps))
            bases[j] = basis
            sent[j] = [m @ b if right else (b.T @ m).T for m, b in zip(mats, basis)] + list(vecs)
            outgoing[j] = _to_bytes(sent[j])
        shapes = [tuple(t.shape) for t in next(iter(sent.values()))] if sent else []
        capacity = next(iter(outgoing.values())).numel() if outgoing else 0
        inbox = yield Exchange(outgoing, capacity)
        updates = [torch.zeros_like(m) for m in mats]
        vec_updates = [torch.zeros_like(v) for v in vecs]
        k = len(mats)
        for j in sorted(inbox):
            theirs = _split(inbox[j], shapes, node.x, sender=j)
            mine = sent[j]
            w = node.weight(j)
            sign = 1.0 if node.id > j else -1.0  # σ: the shared state is u_max − u_min
            for idx, b in enumerate(bases[j]):
                diff = mine[idx] - theirs[idx]  # = σ (u_a − u_b)
                if right:
                    st[f"P{j}"][idx].copy_(diff).mul_(sign)
                    updates[idx].add_(diff @ b.T, alpha=w)
                else:
                    st[f"Q{j}"][idx].copy_(diff).mul_(sign)
                    updates[idx].add_(b @ diff.T, alpha=w)
            for vu, vi, vj in zip(vec_updates, mine[k:], theirs[k:]):
                vu.add_(vi - vj, alpha=w)
        for m, upd in zip(mats, updates):
            m.sub_(upd, alpha=self.gamma)
        for v, upd in zip(vecs, vec_updates):
            v.sub_(upd)


def _to_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Exact float bytes of the tensors, back to back (no lossy cast: both ends must agree)."""
    return torch.cat([t.reshape(-1) for t in tensors]).view(torch.uint8)


def _split(buf: torch.Tensor, shapes: list[tuple[int, ...]], like: torch.Tensor,
           sender: int) -> list[torch.Tensor]:
    """A neighbor's message as tensors of ``shapes``, after checking its length."""
    from gossip.compress.base import CompressionError

    sizes = [int(torch.Size(sh).numel()) for sh in shapes]
    expected = sum(sizes) * like.element_size()
    if buf.numel() != expected:
        raise CompressionError(
            f"PowerGossip message from node {sender} has {buf.numel()} bytes, expected {expected}"
        )
    vals = buf.view(like.dtype)
    out, pos = [], 0
    for sh, size in zip(shapes, sizes):
        out.append(vals[pos : pos + size].view(sh))
        pos += size
    return out
