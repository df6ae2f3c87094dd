"""DCD-PSGD (Tang et al. NeurIPS'18; docs/algorithms/dcd.md): compressed model differences.

Every node keeps exact replicas of its neighbors' models through ``s_i = Σ_{j∈N_i⁺} w_ij x_j``
(replicas are updated with the same decoded messages everywhere, so they stay identical; the
state holds ``s_i − x_i``, see the channel's precision notes)::

    z_i = C(s_i − η ∇f_i(x_i) − x_i);  send z_i
    x_i ← x_i + z_i;  s_i ← s_i + Σ_{j∈N_i⁺} w_ij z_j          X ← X + C(W X − η G − X)

Round 1 first sends every model uncompressed (counted in the bits) to fill the replicas.
Needs an unbiased, low-variance compressor; aggressive compression diverges (a baseline).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.compress import make
from gossip.core.algorithm import Algorithm, Round, scheduled
from gossip.core.block import Block
from gossip.core.channel import Channel


class DCD(Algorithm):
    """DCD-PSGD: ``z_i = C(s_i − η ∇f_i(x_i) − x_i)``; ``x_i += z_i``; ``s_i += Σ_j w_ij z_j``.

    ``s_i`` replicates ``Σ_{j∈N_i⁺} w_ij x_j`` exactly (round 1 sends full models). Needs an
    unbiased, low-variance compressor. See docs/algorithms/dcd.md.

    Args:
        eta: step size, a number or a schedule ``eta(t)``. Default 0.
    """
    name = "dcd"
    state_copies = 8
    trains = True
    step_schedule = True
    step_rule = "dgd"
    on_loss = "drop"  # z_j increments the replica s_i: a lost one is missed

    def __init__(self, eta: float | Callable[[int], float] = 0.0):
        self.eta = eta

    def setup(self, block: Block) -> None:
        ch = block.workspace["channel"] = Channel(block, "z")  # memoryless: C(z) of this round
        # s − x rather than s: it shrinks with the consensus error, so its roundings do too,
        # kept (and summed) in the channel's wider dtype (docs/algorithms/dcd.md, "Precision")
        block.state["gap"] = torch.zeros_like(block.x, dtype=ch.wide or block.x.dtype)
        if ch.wide:  # x is the public copy: kept whole in the wider dtype, the model its rounding
            block.state["x_wide"] = block.x.to(ch.wide)
        block.workspace["diff"] = torch.empty_like(block.x)
        if block.has_oracle:
            block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block: Block) -> Round:
        x, ws = block.x, block.workspace
        gap, diff, ch = block.state["gap"], ws["diff"], ws["channel"]
        if block.round == 1:  # every model uncompressed: s_i − x_i = Σ_{j∈N_i⁺} w_ij x_j − x_i
            inbox = yield Channel(block, "x0", compressor=make("none")).send(x)
            gap.copy_(ch.increments(inbox)[1])  # in the gap's own dtype
        if block.has_oracle:
            torch.sub(gap, block.gradients(ws["grad"]), alpha=scheduled(self.eta, block.round),
                      out=diff)
        else:
            diff.copy_(gap)
        inbox = yield ch.send(diff)  # z = C(s − η∇f(x) − x)
        z_own, z_gap = ch.increments(inbox)
        if ch.wide:  # x += z_i
            x.copy_(block.state["x_wide"].add_(z_own))
        else:
            x.add_(z_own)
        gap.add_(z_gap)  # s − x += Σ_j w_ij z_j − z_i


def exchange_exact(block: Block, out: torch.Tensor) -> Round:
    """Send every ``x_i`` uncompressed and set ``out = Σ_{j∈N_i⁺} w_ij x_j`` (replica
    initialisation)."""
    ch = Channel(block, "x0", compressor=make("none"))
    inbox = yield ch.send(block.x)
    ch.mix(inbox, into=(None, out.zero_()))
