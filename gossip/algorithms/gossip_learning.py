"""Gossip learning with model merging (Ormándi, Hegedűs & Jelasity, Concurrency and
Computation 2013; docs/algorithms/gossip-learning.md).

Models walk the graph: each time node i's clock rings it sends a copy of its model to a random
neighbor, and does nothing else. A node that receives a model merges it into its own and takes a
local step on its data (the paper's merge-update variant)::

    on i's activation:   send x_i to a uniform random neighbor j
    on receiving m at j: x_j ← (x_j + m) / 2;   x_j ← x_j − η ∇f_j(x_j)

Messages take the network's delay (``--network delay=...``) and may be lost; a node that is
away when a model arrives does not get it. Without gradients this is asynchronous averaging by
random walks, which does not keep the sum: the models agree on a random point of the hull of
x⁰, not on the average.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.core.activation import Activation, Message
from gossip.core.algorithm import Asynchronous, check_range, scheduled
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements


class GossipLearning(Asynchronous):
    """Gossip learning: node i sends ``x_i`` to a random neighbor each time its clock rings;
    the receiver j merges, ``x_j ← (x_j + m)/2``, then steps, ``x_j −= η ∇f_j(x_j)``. Runs on
    directed graphs (it sends to out-neighbors). See docs/algorithms/gossip-learning.md.

    Args:
        eta: step size or schedule of the sweep (a sweep: n activations). Default 0.05.
    """

    name = "gossip-learning"
    trains = True
    takes_optimizer = True
    step_schedule = True
    step_rule = "dgd"
    state_copies = 3
    contact = "post"
    requires = Requirements(
        graph=Graph(static=True, symmetric=False), compressor="identity",
        compressor_message="{name} sends whole models (got '{spec}'): use --compressor none")

    def __init__(self, eta: float | Callable[[int], float] = 0.05):
        check_range("eta", eta, 0.0, float("inf"), "the step size of the local SGD steps.")
        self.eta = eta

    def setup(self, block: Block) -> None:
        if block.has_oracle:
            block.workspace["grad"] = torch.empty_like(block.x)

    def activate(self, block: Block, event: Activation) -> None:
        event.post(block.x[event.row])

    def message_like(self, block: Block, row: int) -> tuple[torch.Tensor, ...]:
        return (block.x[row],)

    def receive(self, block: Block, message: Message) -> None:
        r = message.row
        xj = block.x[r]
        xj.add_(message.parts[0]).mul_(0.5)
        if block.has_oracle:
            grad = block.workspace["grad"]
            block.gradients(grad, rows=[r])
            block.local_step(grad, scheduled(self.eta, block.round), rows=[r])
