"""Adasum (Maleki et al., MLSys 2021): adaptive summation of the nodes' model deltas."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.algorithms.allreduce import (
    AllReduceAlgorithm,
    adam_moments_,
    check_betas,
    node_count,
    preconditioned,
)
from gossip.core.algorithm import Round, check_range, scheduled
from gossip.core.block import Block
from gossip.errors import ConfigError

TINY = 1e-8
"""A squared norm below this keeps its coefficient at 1 (Horovod's guard)."""


class Adasum(AllReduceAlgorithm):
    r"""Adasum in delta mode on the complete graph (``n`` a power of two).

    Every node takes a step with its *own* optimizer from the common model ``x`` (local Adam
    moments by default, or plain SGD), and the deltas are combined by Adasum's pairwise rule
    :func:`adasum_pair_rows` on a binary tree in node order, tensor by tensor of the layout::

        Δ_i = −η m_i/(√v_i + ε)     (adam)   or   −η g_i   (sgd)
        level ℓ = 1, 2, 4, …, n/2:  Δ ← A(Δ_lower, Δ_upper) with the partner i XOR ℓ
        x ← x + Δ                   (the same Δ on every node)

    The tree is run by recursive doubling: at each level a node swaps its whole current delta
    with its partner (``log₂ n`` full-precision vectors per node and round, where Horovod's
    vector-halving distance-doubling sends about two). No compression.

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``).
        local: ``adam`` (node-local moments, no bias correction) or ``sgd``.
        beta1, beta2, eps: the local Adam's.
    """

    name = "adasum"
    state_copies = 12

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, local: str = "adam",
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        check_range("eta", eta, 0.0, float("inf"))
        check_betas(beta1, beta2)
        if local not in ("adam", "sgd"):
            raise ConfigError(f"local = {local!r}: Adasum's local optimizer is 'adam' or 'sgd'")
        self.eta, self.local, self.beta1, self.beta2, self.eps = eta, local, beta1, beta2, eps

    def validate(self, topology, compressor) -> None:
        n = topology.n
        if n & (n - 1):
            raise ConfigError(
                f"adasum combines nodes on a binary tree and needs a power-of-two node count, got "
                f"{n}; use {1 << (n.bit_length() - 1)} or {1 << n.bit_length()} nodes"
            )

    def setup(self, block: Block) -> None:
        z = torch.zeros_like(block.x)
        block.workspace.update(grad=z, delta=z.clone())  # scratch, never checkpointed
        if self.local == "adam":
            block.state.update(m=z.clone(), v=z.clone())
        n = node_count(block)
        # level ℓ: node i and its partner i XOR ℓ swap deltas (only those arcs carry a message)
        levels = block.workspace["levels"] = []
        level = 1
        while level < n:
            partner = [i ^ level for i in block.ids]
            lower = torch.tensor([i < j for i, j in zip(block.ids, partner)], device=z.device)
            levels.append(([(i, i ^ level) for i in range(n)], lower.view(-1, 1)))
            level *= 2

    def step(self, block: Block) -> Round:
        st, x = block.state, block.x
        g = block.gradients(block.workspace["grad"])
        delta = block.workspace["delta"]
        if self.local == "adam":
            adam_moments_(st["m"], st["v"], g, self.beta1, self.beta2)
            preconditioned(st["m"], st["v"], self.eps, delta)
        else:
            delta.copy_(g)
        delta.mul_(-scheduled(self.eta, block.round))
        layout = block.nodes[0].layout
        parts = [slice(o, o + size) for o, size in zip(layout.offsets, layout.sizes)]
        nbytes = delta.shape[1] * delta.element_size()
        # the pair's operands in 64-byte aligned rows, as a node's own buffers are (the dot
        # products' BLAS kernels round by alignment)
        low, up = self._aligned(block, "lower"), self._aligned(block, "upper")
        got = self._aligned(block, "got")
        for arcs, is_lower in block.workspace["levels"]:
            route = block.arc_plan(arcs)  # one arc out of and one into every node
            rows = block.message_rows(nbytes, route)
            rows.mine().view(delta.dtype).copy_(delta)  # own rows: the block's nodes in order
            yield rows
            got.index_copy_(0, route.in_dst, block.received_arcs(rows).view(delta.dtype))
            torch.where(is_lower, delta, got, out=low)
            torch.where(is_lower, got, delta, out=up)
            for sl in parts:
                adasum_pair_rows(low[:, sl], up[:, sl], delta[:, sl])
        x.add_(delta)

    def _aligned(self, block: Block, name: str) -> torch.Tensor:
        """An [m, d] work tensor of the block's dtype whose rows start 64-byte aligned."""
        x, work = block.x, block.workspace.setdefault("aligned", {})
        t = work.get(name)
        if t is None:
            item = x.element_size()
            pitch = -(-x.shape[1] * item // _ALIGN) * _ALIGN // item
            t = work[name] = torch.empty((x.shape[0], pitch), dtype=x.dtype,
                                         device=x.device)[:, : x.shape[1]]
        return t


_ALIGN = 64  # bytes: the alignment of a fresh torch tensor


def adasum_pair_rows(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Adasum's pairwise rule of every row into ``out`` (not ``A`` or ``B``):
    ``out[r] = A(a, b) = (1 − a·b/(2‖a‖²)) a + (1 − a·b/(2‖b‖²)) b`` with ``a, b = A[r], B[r]``.

    ``A(a, a) = a``; ``A(a, b) = a + b`` when ``a ⊥ b``; symmetric. A coefficient whose squared
    norm is below :data:`TINY` is 1. The dot products run row by row (each a BLAS call on the
    row, as for a single vector), the combination for all rows at once."""
    ca, cb = [], []
    for a, b in zip(A, B):
        dot = float(torch.dot(a, b))
        na, nb = float(torch.dot(a, a)), float(torch.dot(b, b))
        ca.append(1.0 - dot / (2.0 * na) if na >= TINY else 1.0)
        cb.append(1.0 - dot / (2.0 * nb) if nb >= TINY else 1.0)
    col = lambda c: torch.tensor(c, dtype=torch.float64).to(A.device, A.dtype).view(-1, 1)  # noqa: E731
    torch.mul(A, col(ca), out=out)
    return out.addcmul_(B, col(cb))  # out + cb·b, as add(…, alpha=cb)
