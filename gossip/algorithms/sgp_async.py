"""Asynchronous stochastic gradient push with overlap (Assran, Loizou, Ballas & Rabbat,
ICML'19; docs/algorithms/async-sgp.md).

Push-sum on a directed graph without rounds. Node i keeps a numerator ``s_i`` (init x_i⁰), a
weight ``w_i`` (init 1) and its de-biased model ``x_i = s_i / w_i``. Each time its local step
ends (it computed ``g_i = ∇f_i`` at x_i as it was when the step started) it applies the step,
pushes half its mass to its next out-neighbor in turn (SGP's one-peer schedule) and keeps half;
mass that arrives is added whenever it arrives (the overlap: nobody waits for it)::

    s_i ← s_i − η g_i;   send (s_i / 2, w_i / 2) to j;   s_i, w_i ← s_i / 2, w_i / 2
    on arrival of (s, w) at j:  s_j ← s_j + s,  w_j ← w_j + w
    x_i = s_i / w_i;   g_i = ∇f_i(x_i)  (the next step starts)

Without loss Σ_i s_i + (mass in flight) changes only by the gradient steps and Σ w = n, so the
de-biased models reach the average (consensus) or the optimum's neighborhood (training). A lost
message loses its mass (the sender cannot know), which biases the average.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.core.activation import Activation, Message
from gossip.core.algorithm import Asynchronous, check_range, scheduled
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements


class AsyncSGP(Asynchronous):
    """Asynchronous SGP with overlap: at the end of its local step node i applies it to its
    numerator, pushes half of ``(s_i, w_i)`` to its next out-neighbor and keeps half; arriving
    mass is added when it arrives; ``x_i = s_i / w_i``. See docs/algorithms/async-sgp.md.

    Args:
        eta: step size or schedule of the sweep (a sweep: n activations). Default 0.
    """

    name = "async-sgp"
    trains = True
    step_schedule = True
    step_rule = "dgd"
    state_copies = 4
    contact = "post"
    peer = "next"
    requires = Requirements(
        graph=Graph(static=True, symmetric=False), compressor="identity",
        compressor_message="{name} pushes exact mass (got '{spec}'): use --compressor none")

    def __init__(self, eta: float | Callable[[int], float] = 0.0):
        check_range("eta", eta, 0.0, float("inf"), "the step size of the local SGD steps.",
                    include_low=True)
        self.eta = eta

    def setup(self, block: Block) -> None:
        block.state["s"] = block.x.clone()
        block.state["w"] = torch.ones(block.m, dtype=torch.float64, device=block.x.device)
        if block.has_oracle:  # every node's first step starts at t = 0, at x⁰
            block.state["grad"] = block.gradients(torch.empty_like(block.x))

    def activate(self, block: Block, event: Activation) -> None:
        i, s, w = event.row, block.state["s"], block.state["w"]
        if block.has_oracle:
            s[i].add_(block.state["grad"][i], alpha=-scheduled(self.eta, block.round))
        if event.peer is not None:
            s[i].mul_(0.5)
            w[i] *= 0.5
            event.post(s[i], w[i : i + 1])
        self._debias(block, i)
        if block.has_oracle:
            block.gradients(block.state["grad"], rows=[i])

    def rejoin(self, block: Block, node: int, x0: torch.Tensor) -> None:
        """A fresh node brings new mass: s = x⁰, w = 1 (the sum of the weights grows by one)."""
        if node in block.ids:
            r = block.ids.index(node)
            block.state["s"][r].copy_(x0)
            block.state["w"][r] = 1.0
            self._debias(block, r)
            if block.has_oracle:
                block.gradients(block.state["grad"], rows=[r])

    def message_like(self, block: Block, row: int) -> tuple[torch.Tensor, ...]:
        return block.state["s"][row], block.state["w"][row : row + 1]

    def receive(self, block: Block, message: Message) -> None:
        r, (s, w) = message.row, message.parts
        block.state["s"][r].add_(s)
        block.state["w"][r] += w[0]
        self._debias(block, r)

    @staticmethod
    def _debias(block: Block, r: int) -> None:
        torch.div(block.state["s"][r], float(block.state["w"][r]), out=block.x[r])
