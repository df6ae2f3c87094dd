"""Gossip averaging (docs/algorithms/gossip.md), relaxed by a step γ.

``x_i ← x_i + γ (Σ_{j∈N_i⁺} w_ij C(x_j) − C(x_i))``; with the ``none`` compressor this is exact
gossip ``X ← (I + γ(W − I)) X`` (γ = 1: ``X ← W X``), which preserves the average and contracts
the consensus error by ρ per round. With a lossy compressor it is naive quantized gossip (it
does not reach consensus: that is what CHOCO fixes). Keeps no neighbor state, so it runs on
directed and time-varying graphs.
"""

from __future__ import annotations

from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Graph, Requirements


class Gossip(Algorithm):
    """Gossip averaging, ``x_i ← x_i + γ (Σ_{j∈N_i⁺} w_ij C(x_j) − C(x_i))``.

    Exact averaging ``X ← W X`` with the ``none`` compressor and γ = 1. Runs on directed and
    time-varying graphs (no neighbor state). See docs/algorithms/gossip.md.

    Args:
        gamma: relaxation of the mixing step, in (0, 2] (stable for γ < 2/β). Default 1.
    """
    name = "gossip"
    state_copies = 3
    requires = Requirements(graph=Graph(static=False, symmetric=False))
    on_loss = "renormalize"  # a value averaged in: a lost neighbor counts as the own value

    def __init__(self, gamma: float = 1.0):
        check_range("gamma", gamma, 0.0, 2.0, "Gossip is stable for 0 < gamma < 2/beta.")
        self.gamma = gamma

    def setup(self, block: Block) -> None:
        block.workspace["channel"] = Channel(block, "x")  # memoryless: C(x) of this round

    def step(self, block: Block) -> Round:
        inbox = yield block.workspace["channel"].send(block.x)
        self.mix(block, inbox)

    def mix(self, block: Block, inbox) -> None:
        """``x ← x + γ (Σ_j w_ij C(x_j) − C(x_i))``: the own message weighs ``w_ii − 1``."""
        plan, ws = block.plan, block.workspace
        own = ws.get("own_weight")
        if own is None or own[0] is not plan:  # w_ii − 1 once per mixing plan, not per round
            own = ws["own_weight"] = (plan, plan.self_weight - 1.0)
        ws["channel"].mix(inbox, into=(None, block.x), alpha=self.gamma, own_weight=own[1])
