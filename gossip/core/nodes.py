"""What the engine keeps per node besides its row of the block: oracle, generator,
compressors and the views of its state that checkpoints save."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gossip.errors import ConfigError

if TYPE_CHECKING:
    from gossip.compress.base import Compressor
    from gossip.layout import Layout


@dataclass
class Node:
    """One hosted node: ``x`` is its row of ``block.x``, ``state`` the row views of the
    algorithm's state (what checkpoints save), ``view`` its neighbors and weights this round.

    ``compressor`` encodes the node's main message stream; an extra stream (a gradient
    tracker) gets its own instance from :meth:`stream_compressor`, so stateful compressors
    never mix streams and checkpoints save every one. ``generator`` (a ``torch.Generator``)
    drives the oracle's sampling; ``oracle`` gives gradients (None for pure consensus).
    """

    id: int
    x: torch.Tensor
    layout: Layout
    view: Any  # topologies.NodeView of the current round
    compressor: Compressor
    generator: torch.Generator
    oracle: Any = None
    round: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    new_compressor: Callable[[], Compressor] | None = None
    compressors: dict[str, Compressor] = field(default_factory=dict)

    def stream_compressor(self, stream: str) -> Compressor:
        """A compressor of the run's kind for the message stream ``stream`` (one per name)."""
        comp = self.compressors.get(stream)
        if comp is None:
            if self.new_compressor is None:
                raise ConfigError(f"node {self.id} has no compressor factory for stream {stream!r}",
                                  node=self.id)
            comp = self.compressors[stream] = self.new_compressor()
        return comp

    def weight(self, j: int) -> float:
        """``w_ij``: the weight this node gives to neighbor ``j``'s value (or its own)."""
        if j == self.id:
            return self.view.self_weight
        return self.view.weight_of(j)
