"""The engine: runs an algorithm's rounds over the nodes this process hosts.

* :mod:`~gossip.engine.engine` — :class:`Engine`: hosts the nodes, runs rounds, moves each
  phase's messages through the transport, records metrics and checkpoint state;
* :mod:`~gossip.engine.block` — :class:`Block`: the nodes as rows of [m, d] tensors and the
  operations an algorithm's round uses (encode, mix, decode, local steps, state);
* :mod:`~gossip.engine.channel` — :class:`Channel`: one vector sent compressed and mixed, with
  its copies (CHOCO, EF21, LEAD's α), weights, route and buffers;
* :mod:`~gossip.engine.routing` — where each phase's messages go, as row indices;
* :mod:`~gossip.engine.staging` — the message rows an encode writes and the transport moves;
* :mod:`~gossip.engine.cache` — the one cache type, keyed by object identity;
* :mod:`~gossip.engine.nodes` — what is kept per node (oracle, generator, compressors).

``Engine``, ``Block`` and ``Channel`` load on first use, so algorithms can import the block's
types without importing the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Engine": "gossip.engine.engine", "Metric": "gossip.engine.engine",
            "Block": "gossip.engine.block", "Channel": "gossip.engine.channel"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gossip.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
