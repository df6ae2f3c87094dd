"""Randomized pairwise gossip (Boyd, Ghosh, Prabhakar & Shah, IEEE Trans. IT 2006;
docs/algorithms/pairwise-gossip.md).

Asynchronous: every node has a Poisson clock; when node i's rings it picks a neighbor j
uniformly at random and both set their models to the pair's average::

    x_i, x_j ← (x_i + x_j) / 2

Without loss the sum Σ_i x_i is kept (up to the rounding of one addition per event) and every
x_i tends to the initial average. A lost half of the exchange leaves that end unchanged (it did
not hear the other), which moves the sum.
"""

from __future__ import annotations

import torch

from gossip.core.activation import Activation, Message
from gossip.core.algorithm import Asynchronous
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements


class PairwiseGossip(Asynchronous):
    """Randomized pairwise gossip: when i's clock rings, ``x_i, x_j ← (x_i + x_j)/2`` with a
    uniformly drawn neighbor j. Exact models only (``--compressor none``); for compressed
    asynchronous averaging use ``async-choco``. See docs/algorithms/pairwise-gossip.md."""

    name = "pairwise-gossip"
    clock = "poisson"
    state_copies = 2
    requires = Requirements(
        graph=Graph(static=True, symmetric=True), compressor="identity",
        compressor_message="{name} averages exact models (got '{spec}'): use --compressor none, "
                           "or async-choco for compressed asynchronous averaging")

    batch_exchanges = True

    def __init__(self) -> None:  # no hyper-parameters: the pair takes its plain average
        pass

    def exchange_pairs(self, block: Block, rows_i: torch.Tensor, rows_j: torch.Tensor,
                       j_heard: torch.Tensor, i_heard: torch.Tensor) -> None:
        """Disjoint pairs at once: ``(x_i + x_j)/2`` at each end that heard the other, the same
        bits as :func:`_average` at both ends (the sum is commutative)."""
        x = block.x
        avg = x.index_select(0, rows_i).add_(x.index_select(0, rows_j)).mul_(0.5)
        x.index_copy_(0, rows_i[i_heard], avg[i_heard])
        x.index_copy_(0, rows_j[j_heard], avg[j_heard])

    def activate(self, block: Block, event: Activation) -> None:
        reply = event.exchange(block.x[event.row])  # x_i to j; j's reply is x_j as it was
        if reply is not None:
            _average(block, event.row, reply.parts)

    def message_like(self, block: Block, row: int) -> tuple[torch.Tensor, ...]:
        return (block.x[row],)

    def receive(self, block: Block, message: Message) -> None:
        message.reply(block.x[message.row])  # j's end: x_j as it is, then the average
        _average(block, message.row, message.parts)


def _average(block: Block, row: int, heard: tuple[torch.Tensor, ...] | None) -> None:
    """``x ← (x + x_peer)/2`` at one end, with what it heard (None: lost, nothing changes)."""
    if heard is not None:
        block.x[row].add_(heard[0]).mul_(0.5)
