"""DeepSqueeze (Tang et al. 2019; docs/algorithms/deepsqueeze.md): error-compensated compression of x.

``v_i = x_i + e_i;  c_i = C(v_i);  e_i ← v_i − c_i``; send c_i;
``x_i ← x_i + γ (Σ_{j∈N_i⁺} w_ij c_j − c_i)`` (after the local gradient step, if any).
Preserves the average; with constant steps it converges to a neighborhood only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.core.algorithm import Algorithm, Round, check_range, scheduled
from gossip.core.block import Block
from gossip.core.channel import Channel


class DeepSqueeze(Algorithm):
    """DeepSqueeze: error-compensated compression of the model.

    ``v_i = x_i + e_i;  c_i = C(v_i);  e_i ← v_i − c_i``; send ``c_i``;
    ``x_i ← x_i + γ (Σ_{j∈N_i⁺} w_ij c_j − c_i)``. See docs/algorithms/deepsqueeze.md.

    Args:
        gamma: consensus step in (0, 1]; tune it. Default 0.2.
        eta: local step size or schedule (training uses the node's optimizer). Default 0.
    """
    name = "deepsqueeze"
    state_copies = 7
    trains = True
    takes_optimizer = True
    tunable = ("gamma",)
    step_schedule = True
    step_rule = "dgd"
    on_loss = "renormalize"  # c_j is a (compressed) model averaged in, not an increment

    def __init__(self, gamma: float = 0.2, eta: float | Callable[[int], float] = 0.0):
        check_range("gamma", gamma, 0.0, 1.0, "DeepSqueeze's consensus step; tune it.")
        self.gamma = gamma
        self.eta = eta

    def setup(self, block: Block) -> None:
        x = block.x
        block.state["error"] = torch.zeros_like(x)
        block.workspace["channel"] = Channel(block, "v")  # memoryless: c = C(v) of this round
        block.workspace.update(v=torch.empty_like(x), mix=torch.empty_like(x))
        if block.has_oracle:
            block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block: Block) -> Round:
        x, ws = block.x, block.workspace
        if block.has_oracle:
            block.local_step(block.gradients(ws["grad"]), scheduled(self.eta, block.round))
        v, err, ch = ws["v"], block.state["error"], ws["channel"]
        q = ch.send(torch.add(x, err, out=v))  # c = C(v),  v = x + e
        torch.sub(v, ch.decoded(q), out=err)  # e ← v − c
        inbox = yield q
        # Σ_j w_ij c_j − c_i: the own message weighs w_ii − 1
        _, mix = ch.mix(inbox, into=(None, ws["mix"]), add=False,
                        own_weight=block.self_weight - 1.0)
        x.add_(mix, alpha=self.gamma)
