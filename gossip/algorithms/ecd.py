"""ECD-PSGD (Tang et al. NeurIPS'18; docs/algorithms/ecd.md): compressed extrapolations.

Node i keeps estimates ŷ_j of its neighbors' models (and its own) through their weighted sum
``s_i = Σ_{j∈N_i⁺} w_ij ŷ_j`` (the update of ŷ is linear, so the sum suffices). Iteration k::

    x_i^k = s_i − η ∇f_i(x_i^{k−1});   z_i = (1 − k/2) x_i^{k−1} + (k/2) x_i^k;   send C(z_i)
    ŷ_j ← (1 − 2/k) ŷ_j + (2/k) C(z_j)   ⇒   s_i ← (1 − 2/k) s_i + (2/k) Σ_{j∈N_i⁺} w_ij C(z_j)

Estimates start at x^0 (round 1 first sends every model uncompressed). Needs unbiased C.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.algorithms.dcd import exchange_exact
from gossip.core.algorithm import Algorithm, Round, scheduled
from gossip.core.block import Block
from gossip.core.channel import Channel


class ECD(Algorithm):
    """ECD-PSGD: compressed extrapolations ``z_i = (1 − k/2) x_i^{k−1} + (k/2) x_i^k``.

    ``x_i^k = s_i − η ∇f_i(x_i^{k−1})``; send ``C(z_i)``;
    ``s_i ← (1 − 2/k) s_i + (2/k) Σ_{j∈N_i⁺} w_ij C(z_j)``. Needs an unbiased compressor.
    See docs/algorithms/ecd.md.

    Args:
        eta: step size, a number or a schedule ``eta(t)``. Default 0.
    """
    name = "ecd"
    state_copies = 5
    trains = True
    overlaps = "next"  # x is set before the send; the mix updates the estimates
    step_schedule = True
    step_rule = "dgd"

    def __init__(self, eta: float | Callable[[int], float] = 0.0):
        self.eta = eta

    def setup(self, block: Block) -> None:
        block.state["s"] = torch.zeros_like(block.x)
        block.workspace["channel"] = Channel(block, "z")  # memoryless: C(z) of this round
        block.workspace["z"] = torch.empty_like(block.x)
        if block.has_oracle:
            block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block: Block) -> Round:
        x, ws, k = block.x, block.workspace, block.round
        s, z = block.state["s"], ws["z"]
        if k == 1:
            yield from exchange_exact(block, s)
        z.copy_(x).mul_(1.0 - k / 2.0)  # (1 − k/2) x^{k−1}
        if block.has_oracle:
            grad = block.gradients(ws["grad"])  # at x^{k−1}, before x is overwritten
            x.copy_(s).add_(grad, alpha=-scheduled(self.eta, k))
        else:
            x.copy_(s)
        z.add_(x, alpha=k / 2.0)
        inbox = yield ws["channel"].send(z)
        s.mul_(1.0 - 2.0 / k)  # s ← (1 − 2/k) s + (2/k) Σ_j w_ij C(z_j)
        ws["channel"].mix(inbox, into=(None, s), scale=2.0 / k)
