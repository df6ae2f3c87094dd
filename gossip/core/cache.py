"""The engine's one cache type: values derived from objects that come back round after round."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class IdentityCache:
    """Values derived from objects (a round's topology, a route), kept while that very object
    comes back: keyed by identity, the object held so its id cannot be reused, at most
    ``limit`` entries (a graph that changes every round brings a new object each round)."""

    def __init__(self, limit: int = 64) -> None:
        self._items: dict[Any, tuple[Any, Any]] = {}
        self.limit = limit

    def get(self, obj: Any, make: Callable[[], Any], key: Any = None) -> Any:
        """The value for ``obj`` (and ``key``, for several values per object), from ``make()``
        the first time."""
        slot = (id(obj), key)
        hit = self._items.get(slot)
        if hit is not None and hit[0] is obj:
            return hit[1]
        if len(self._items) > self.limit:
            self._items.clear()
        value = make()
        self._items[slot] = (obj, value)
        return value

    def values(self) -> list[Any]:
        """The cached values."""
        return [value for _, value in self._items.values()]
