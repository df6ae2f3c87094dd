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
from gossip.algorithms.base import ConfigError, Exchange, Node, RoundGenerator, check_range, scheduled

TINY = 1e-8
"""A squared norm below this keeps its coefficient at 1 (Horovod's guard)."""


def adasum_pair(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``A(a, b) = (1 − a·b/(2‖a‖²)) a + (1 − a·b/(2‖b‖²)) b`` into ``out`` (not ``a`` or ``b``).

    ``A(a, a) = a``; ``A(a, b) = a + b`` when ``a ⊥ b``; symmetric. A coefficient whose squared
    norm is below :data:`TINY` is 1.
    """
    dot = float(torch.dot(a, b))
    na, nb = float(torch.dot(a, a)), float(torch.dot(b, b))
    ca = 1.0 - dot / (2.0 * na) if na >= TINY else 1.0
    cb = 1.0 - dot / (2.0 * nb) if nb >= TINY else 1.0
    return torch.add(torch.mul(a, ca, out=out), b, alpha=cb, out=out)


class Adasum(AllReduceAlgorithm):
    r"""Adasum in delta mode on the complete graph (``n`` a power of two).

    Every node takes a step with its *own* optimizer from the common model ``x`` (local Adam
    moments by default, or plain SGD), and the deltas are combined by Adasum's pairwise rule
    :func:`adasum_pair` on a binary tree in node order, tensor by tensor of the layout::

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

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, local: str = "adam",
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        check_range("eta", eta, 0.0, float("inf"))
        check_betas(beta1, beta2)
        if local not in ("adam", "sgd"):
            raise ConfigError(f"local = {local!r}: Adasum's local optimizer is 'adam' or 'sgd'")
        self.eta, self.local, self.beta1, self.beta2, self.eps = eta, local, beta1, beta2, eps
        self._work: dict[int, dict[str, torch.Tensor]] = {}

    def validate(self, topology, compressor) -> None:
        super().validate(topology, compressor)
        n = topology.n
        if n & (n - 1):
            raise ConfigError(
                f"adasum combines nodes on a binary tree and needs a power-of-two node count, got "
                f"{n}; use {1 << (n.bit_length() - 1)} or {1 << n.bit_length()} nodes"
            )

    def setup(self, node: Node) -> None:
        z = torch.zeros_like(node.x)
        node.state.update(grad=torch.zeros_like(z), delta=torch.zeros_like(z))
        if self.local == "adam":
            node.state.update(m=z, v=z.clone())
        self._work[node.id] = {"empty": torch.empty(0, dtype=torch.uint8, device=z.device),
                               "sent": torch.empty_like(z)}

    def step(self, node: Node) -> RoundGenerator:
        st, x = node.state, node.x
        g = node.oracle.grad(x, st["grad"])
        delta = st["delta"]
        if self.local == "adam":
            adam_moments_(st["m"], st["v"], g, self.beta1, self.beta2)
            preconditioned(st["m"], st["v"], self.eps, delta)
        else:
            delta.copy_(g)
        delta.mul_(-scheduled(self.eta, node.round))
        work, n, me = self._work[node.id], node_count(node), node.id
        sent = work["sent"]
        level = 1
        while level < n:
            partner = me ^ level
            sent.copy_(delta)
            raw = sent.view(torch.uint8)
            inbox = yield Exchange({j: raw if j == partner else work["empty"]
                                    for j in range(n) if j != me}, raw.numel())
            other = inbox[partner].view(delta.dtype)
            lower, upper = (sent, other) if me < partner else (other, sent)
            for o, size in zip(node.layout.offsets, node.layout.sizes):
                sl = slice(o, o + size)
                adasum_pair(lower[sl], upper[sl], delta[sl])
            level *= 2
        x.add_(delta)
