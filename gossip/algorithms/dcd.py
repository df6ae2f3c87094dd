"""DCD-PSGD (Tang et al. NeurIPS'18; docs/algorithms/dcd.md): compressed model differences.

Every node keeps exact replicas of its neighbors' models through ``s_i = Σ_{j∈N_i⁺} w_ij x_j``
(replicas are updated with the same decoded messages everywhere, so they stay identical)::

    z_i = C(s_i − η ∇f_i(x_i) − x_i);  send z_i
    x_i ← x_i + z_i;  s_i ← s_i + Σ_{j∈N_i⁺} w_ij z_j          X ← X + C(W X − η G − X)

Round 1 first sends every model uncompressed (counted in the bits) to fill the replicas.
Needs an unbiased, low-variance compressor; aggressive compression diverges (a baseline).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.algorithms.base import (
    Algorithm,
    Node,
    RoundGenerator,
    mix_into,
    scheduled,
    send_payload,
)
from gossip.compress import make


class DCD(Algorithm):
    """DCD-PSGD: ``z_i = C(s_i − η ∇f_i(x_i) − x_i)``; ``x_i += z_i``; ``s_i += Σ_j w_ij z_j``.

    ``s_i`` replicates ``Σ_{j∈N_i⁺} w_ij x_j`` exactly (round 1 sends full models). Needs an
    unbiased, low-variance compressor. See docs/algorithms/dcd.md.

    Args:
        eta: step size, a number or a schedule ``eta(t)``. Default 0.
    """
    name = "dcd"
    trains = True
    step_schedule = True
    step_rule = "dgd"

    def __init__(self, eta: float | Callable[[int], float] = 0.0):
        self.eta = eta

    def setup(self, node: Node) -> None:
        node.state.update(s=torch.zeros_like(node.x), diff=torch.empty_like(node.x))
        if node.oracle is not None:
            node.state["grad"] = torch.empty_like(node.x)

    def step(self, node: Node) -> RoundGenerator:
        x, st = node.x, node.state
        s, diff = st["s"], st["diff"]
        if node.round == 1:
            yield from exchange_exact(node, s)
        torch.sub(s, x, out=diff)
        if node.oracle is not None:
            diff.add_(node.oracle.grad(x, st["grad"]), alpha=-scheduled(self.eta, node.round))
        q = node.compressor.encode(diff, node.rng)
        inbox = yield send_payload(node, q, diff)
        node.compressor.decode_add_(x, q, 1.0)
        mix_into(node, s, q, inbox)


def exchange_exact(node: Node, out: torch.Tensor) -> RoundGenerator:
    """Send ``x_i`` uncompressed and set ``out = Σ_{j∈N_i⁺} w_ij x_j`` (replica initialisation)."""
    exact = make("none")
    q = exact.encode(node.x)
    inbox = yield send_payload(node, q, node.x, compressor=exact)
    out.zero_()
    mix_into(node, out, q, inbox, compressor=exact)
