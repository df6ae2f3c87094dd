"""DeepSqueeze (Tang et al. 2019; docs/algorithms/deepsqueeze.md): error-compensated compression of x.

``v_i = x_i + e_i;  c_i = C(v_i);  e_i ← v_i − c_i``; send c_i;
``x_i ← x_i + γ (Σ_{j∈N_i⁺} w_ij c_j − c_i)`` (after the local gradient step, if any).
Preserves the average; with constant steps it converges to a neighborhood only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.algorithms.base import (
    Algorithm,
    Node,
    RoundGenerator,
    check_range,
    local_step,
    mix_into,
    scheduled,
    send_payload,
)


class DeepSqueeze(Algorithm):
    """DeepSqueeze: error-compensated compression of the model.

    ``v_i = x_i + e_i;  c_i = C(v_i);  e_i ← v_i − c_i``; send ``c_i``;
    ``x_i ← x_i + γ (Σ_{j∈N_i⁺} w_ij c_j − c_i)``. See docs/algorithms/deepsqueeze.md.

    Args:
        gamma: consensus step in (0, 1]; tune it. Default 0.2.
        eta: local step size or schedule (training uses the node's optimizer). Default 0.
    """
    name = "deepsqueeze"
    trains = True
    takes_optimizer = True
    tunable = ("gamma",)
    step_schedule = True
    step_rule = "dgd"

    def __init__(self, gamma: float = 0.2, eta: float | Callable[[int], float] = 0.0):
        check_range("gamma", gamma, 0.0, 1.0, "DeepSqueeze's consensus step; tune it.")
        self.gamma = gamma
        self.eta = eta

    def setup(self, node: Node) -> None:
        node.state.update(
            error=torch.zeros_like(node.x),
            v=torch.empty_like(node.x),
            c=torch.empty_like(node.x),
            mix=torch.empty_like(node.x),
        )
        if node.oracle is not None:
            node.state["grad"] = torch.empty_like(node.x)

    def step(self, node: Node) -> RoundGenerator:
        x, st = node.x, node.state
        if node.oracle is not None:
            local_step(node, node.oracle.grad(x, st["grad"]), scheduled(self.eta, node.round))
        v, c, err = st["v"], st["c"], st["error"]
        q = node.compressor.encode(torch.add(x, err, out=v), node.rng)
        node.compressor.decode(q, out=c)
        torch.sub(v, c, out=err)
        inbox = yield send_payload(node, q, v)
        mix = st["mix"].zero_()
        mix_into(node, mix, q, inbox, own_weight=node.view.self_weight - 1.0)
        x.add_(mix, alpha=self.gamma)
