"""The :class:`Stateful` protocol: objects whose state a checkpoint saves and restores.

Compressors with memory (low-rank warm starts), gradient oracles (variance-reduction tables,
optimizer moments) and algorithms implement ``state_dict() -> dict`` and
``load_state_dict(dict)`` as ``torch.optim`` does. A state dict holds only tensors, numbers,
strings, lists and dicts, so checkpoints load with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)`` (checked at run time)."""

    def state_dict(self) -> dict[str, Any]:
        """The state to save: tensors, numbers, strings, lists and dicts only."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (in place)."""
        ...
