"""D-PSGD (Lian et al. 2017; docs/algorithms/dpsgd.md): ``X ← W X − η ∇F(X)``.

The gradient is taken at the pre-gossip model ``x_i`` (D-PSGD proper, not adapt-then-combine),
so communication can overlap with it. With γ ≠ 1 the mixing is relaxed as in :class:`Gossip`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from gossip.algorithms.gossip import Gossip
from gossip.core.algorithm import Round, scheduled
from gossip.core.block import Block


class DPSGD(Gossip):
    """D-PSGD, ``X ← X + γ (W − I) X − η ∇F(X)`` (gradient at the pre-gossip model).

    See docs/algorithms/dpsgd.md.

    Args:
        eta: step size, a number or a schedule ``eta(t)``; a node with its own optimizer
            (training) uses the optimizer's step instead. Default 0.1.
        gamma: relaxation of the mixing step (1 = plain ``W X``). Default 1.
    """
    name = "dpsgd"
    state_copies = 4
    trains = True
    takes_optimizer = True
    overlaps = "within"  # its gradient is taken after the send, at the model sent
    requires = replace(Gossip.requires, gradients=True)
    step_schedule = True
    step_rule = "dgd"

    def __init__(self, eta: float | Callable[[int], float] = 0.1, gamma: float = 1.0):
        super().__init__(gamma)
        self.eta = eta

    def setup(self, block: Block) -> None:
        super().setup(block)
        block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block: Block) -> Round:
        inbox = yield block.workspace["channel"].send(block.x)  # x_i travels, while (--overlap)
        g = block.gradients(block.workspace["grad"])  # ∇f_i is taken at that x_i, still unmixed
        self.mix(block, inbox)  # x ← W x
        block.local_step(g, scheduled(self.eta, block.round))
