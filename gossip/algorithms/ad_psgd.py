"""AD-PSGD, asynchronous decentralized parallel SGD (Lian, Zhang, Zhang & Liu, ICML'18;
docs/algorithms/ad-psgd.md).

Every worker loops without waiting for anyone: it reads its model, computes a stochastic
gradient there (taking its compute time), averages its current model with one random neighbor
atomically, and applies the gradient it computed, now stale::

    g_i = ∇f_i(x̃_i)                       x̃_i: x_i as it was when the computation started
    x_i, x_j ← (x_i + x_j) / 2            (the neighbor may be in the middle of its own step)
    x_i ← x_i − η g_i

In virtual time each activation is one loop's end: average, apply, and start the next gradient
at the model as it now stands. The paper splits the workers into active and passive sets (a
bipartite graph) so that real concurrent averagings never deadlock; events here are atomic, so
every worker may start an averaging.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.core.activation import Activation, Message
from gossip.core.algorithm import Asynchronous, check_range, scheduled
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements


class ADPSGD(Asynchronous):
    """AD-PSGD: at the end of its gradient computation node i averages with a random
    neighbor, ``x_i, x_j ← (x_i + x_j)/2``, applies its stale gradient ``x_i −= η g_i`` and
    computes the next one at the new x_i. See docs/algorithms/ad-psgd.md.

    Args:
        eta: step size or schedule of the sweep (a sweep: n activations). Default 0.05.
    """

    name = "ad-psgd"
    trains = True
    takes_optimizer = True
    step_schedule = True
    step_rule = "dgd"
    state_copies = 3
    requires = Requirements(
        graph=Graph(static=True, symmetric=True), gradients=True, compressor="identity",
        compressor_message="{name} averages exact models (got '{spec}'): use --compressor none, "
                           "or async-choco for a compressed asynchronous method")

    def __init__(self, eta: float | Callable[[int], float] = 0.05):
        check_range("eta", eta, 0.0, float("inf"), "the step size of the local SGD steps.")
        self.eta = eta

    def setup(self, block: Block) -> None:
        # every worker starts computing at t = 0, at x⁰; the gradient is applied when it ends
        block.state["grad"] = block.gradients(torch.empty_like(block.x))

    def activate(self, block: Block, event: Activation) -> None:
        reply = event.exchange(block.x[event.row])  # x_i, x_j ← (x_i + x_j)/2
        if reply is not None:
            self._average(block, event.row, reply.parts)
        grad = block.state["grad"]
        block.local_step(grad, scheduled(self.eta, block.round), rows=[event.row])
        block.gradients(grad, rows=[event.row])  # the next computation starts at x_i as it is

    def rejoin(self, block: Block, node: int, x0: torch.Tensor) -> None:
        super().rejoin(block, node, x0)
        if node in block.ids:  # its computation starts again at x⁰
            block.gradients(block.state["grad"], rows=[block.ids.index(node)])

    def message_like(self, block: Block, row: int) -> tuple[torch.Tensor, ...]:
        return (block.x[row],)

    def receive(self, block: Block, message: Message) -> None:
        message.reply(block.x[message.row])  # the neighbor's end: x_j as it is, then the average
        self._average(block, message.row, message.parts)

    @staticmethod
    def _average(block: Block, row: int, heard: tuple[torch.Tensor, ...] | None) -> None:
        if heard is not None:  # None: lost, this end keeps its model
            block.x[row].add_(heard[0]).mul_(0.5)
