"""What the engine keeps per node besides its row of the block: oracle, generator,
compressors and the views of its state that checkpoints save.

A run may host 10⁶ nodes in one process, so a :class:`Node` is small and lazy: what every
node of the block shares (the round's graph, the round, the seed, the compressor factory)
sits once in :class:`NodeShared`, and a node's topology view, compressor and generator are
made on first use (most runs never ask for them: the block works on rows)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gossip.errors import ConfigError
from gossip.rng import generator as seeded_generator
from gossip.rng import node_seed

if TYPE_CHECKING:
    from gossip.compress.base import Compressor
    from gossip.layout import Layout


@dataclass(eq=False)
class NodeShared:
    """What every node of a block reads alike: ``topology`` (the current round's graph, whose
    views the nodes read), the run ``seed`` and ``device`` (each node's generator is seeded
    from them), the compressor factory, and the ``block`` (the rows the nodes' ``x`` are, and
    the round)."""

    topology: Any
    seed: int
    device: torch.device
    new_compressor: Callable[[], Compressor] | None = None
    block: Any = None


class Node:
    """One hosted node: ``x`` is its row ``row`` of ``block.x``, ``state`` the row views of the
    algorithm's state (what checkpoints save; made when asked, ``block.node_state``), ``view``
    its neighbors and weights this round.

    ``compressor`` encodes the node's main message stream; an extra stream (a gradient
    tracker) gets its own instance from :meth:`stream_compressor`, so stateful compressors
    never mix streams and checkpoints save every one. ``generator`` (a ``torch.Generator``
    seeded from ``(seed, id)``) drives the oracle's sampling; ``oracle`` gives gradients (None
    for pure consensus). ``view``, ``compressor`` and ``generator`` are made on first use."""

    __slots__ = ("id", "row", "layout", "oracle", "compressors", "_shared",
                 "_compressor", "_generator")

    def __init__(self, id: int, row: int, layout: Layout, shared: NodeShared, *,
                 generator: torch.Generator | None = None, oracle: Any = None,
                 compressor: Compressor | None = None):
        self.id = id
        self.row = row
        self.layout = layout
        self.oracle = oracle
        self.compressors: dict[str, Compressor] = {}
        self._shared = shared
        self._compressor = compressor
        self._generator = generator

    @property
    def x(self) -> torch.Tensor:
        """The node's model: its row of the block's ``x`` (a view)."""
        return self._shared.block.x[self.row]

    @property
    def state(self) -> dict[str, Any]:
        """The node's rows of the block's ``state`` and ``arc_state`` (views, made on each call)."""
        return self._shared.block.node_state(self.row)

    @property
    def view(self) -> Any:
        """``topologies.NodeView`` of the current round (the topology caches it)."""
        return self._shared.topology.view(self.id)

    @property
    def round(self) -> int:
        """The round in progress (the block's)."""
        block = self._shared.block
        return 0 if block is None else block.round

    @property
    def new_compressor(self) -> Callable[[], Compressor] | None:
        return self._shared.new_compressor

    @property
    def compressor(self) -> Compressor:
        comp = self._compressor
        if comp is None:
            comp = self._compressor = self._new("the main stream")
        return comp

    @property
    def generator(self) -> torch.Generator:
        gen = self._generator
        if gen is None:
            gen = self._generator = seeded_generator(node_seed(self._shared.seed, self.id),
                                                     self._shared.device)
        return gen

    def _new(self, stream: str) -> Compressor:
        if self._shared.new_compressor is None:
            raise ConfigError(f"node {self.id} has no compressor factory for {stream}",
                              node=self.id)
        return self._shared.new_compressor()

    def stream_compressor(self, stream: str) -> Compressor:
        """A compressor of the run's kind for the message stream ``stream`` (one per name)."""
        comp = self.compressors.get(stream)
        if comp is None:
            comp = self.compressors[stream] = self._new(f"stream {stream!r}")
        return comp

    def weight(self, j: int) -> float:
        """``w_ij``: the weight this node gives to neighbor ``j``'s value (or its own)."""
        if j == self.id:
            return self.view.self_weight
        return self.view.weight_of(j)
