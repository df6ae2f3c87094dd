"""The engine: runs an algorithm (any :class:`gossip.core.Algorithm`) over the nodes this process
hosts, through the one protocol of :mod:`gossip.core`. It imports no algorithm module: the
caller hands it an algorithm object (:func:`gossip.algorithms.make_algorithm` builds one by name).

:class:`~gossip.engine.engine.Engine` hosts the nodes, runs rounds, moves each phase's messages
through the transport, records metrics and checkpoint state. What messages meet on their way
(loss, lateness, clocks) and the asynchronous runs (the event loop in virtual time, free runs on
wall clocks) are the network's: it talks to one :class:`gossip.network.Simulator`.

``Engine`` loads on first use, so ``import gossip.engine`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Engine": "gossip.engine.engine", "Metric": "gossip.engine.engine"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gossip.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
