"""A flat parameter buffer seen as a list of shaped tensors (one message = one buffer)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from gossip.errors import ConfigError


class Layout:
    """Shapes packed back to back in one flat vector, in a fixed, documented order.

    A node's model lives in one flat buffer so that a message is one buffer; per-tensor
    compressors (low-rank, per-layer top-k) and PowerGossip reach the tensors through
    :meth:`views`, which never copies.
    """

    def __init__(self, shapes: Iterable[Sequence[int]]):
        self.shapes: tuple[tuple[int, ...], ...] = tuple(tuple(int(s) for s in sh) for sh in shapes)
        if not self.shapes:
            raise ConfigError("a Layout needs at least one shape, e.g. Layout([(10,)]) or Layout.flat(10)")
        for sh in self.shapes:
            if any(s <= 0 for s in sh):
                raise ConfigError(f"every dimension of a Layout must be positive, got shape {sh}")
        self.sizes = tuple(math.prod(sh) for sh in self.shapes)
        offsets, acc = [], 0
        for size in self.sizes:
            offsets.append(acc)
            acc += size
        self.offsets = tuple(offsets)
        self.numel = acc

    @classmethod
    def flat(cls, numel: int) -> Layout:
        """One 1-D tensor of ``numel`` entries."""
        return cls([(numel,)])

    @classmethod
    def from_tensors(cls, tensors: Iterable[torch.Tensor]) -> Layout:
        """The layout of a sequence of tensors (e.g. ``model.parameters()``), in order."""
        return cls([tuple(t.shape) if t.dim() > 0 else (1,) for t in tensors])

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Shaped views into ``flat`` (no copy)."""
        if flat.dim() != 1 or flat.numel() != self.numel:
            raise ConfigError(
                f"expected a flat tensor of {self.numel} entries, got shape {tuple(flat.shape)}"
            )
        return [
            flat[o : o + s].view(sh) for o, s, sh in zip(self.offsets, self.sizes, self.shapes)
        ]

    def __len__(self) -> int:
        return len(self.shapes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and other.shapes == self.shapes

    def __hash__(self) -> int:
        return hash(self.shapes)

    def __repr__(self) -> str:
        return f"Layout({list(self.shapes)})"
