"""The core: the one protocol every algorithm is written against, and the toolkit it uses.

* :mod:`~gossip.core.algorithm` — :class:`Algorithm`: what a method declares (traits,
  requirements, what a lost message means) and the round it runs (:meth:`Algorithm.step`),
  or, asynchronously, what an activation does;
* :mod:`~gossip.core.block` — :class:`Block`: the nodes a process hosts as rows of [m, d]
  tensors, and the operations a round uses (encode, mix, decode, local steps, state);
* :mod:`~gossip.core.channel` — :class:`Channel`: one vector sent compressed and mixed, with
  its copies (CHOCO, EF21, LEAD's α), weights, route and buffers;
* :mod:`~gossip.core.activation` — :class:`Activation`, :class:`Message`: what an
  asynchronous method acts through (posts, and exchanges answered by the peer's ``receive``);
* :mod:`~gossip.core.star` — the star's links and client sampling (federated methods);
* :mod:`~gossip.core.requirements` — what a method needs of its graph, weights and compressor;
* :mod:`~gossip.core.routing`, :mod:`~gossip.core.staging`, :mod:`~gossip.core.cache`,
  :mod:`~gossip.core.nodes`, :mod:`~gossip.core.compensated` — where messages go, the rows
  they are staged in, identity caches, what is kept per node, compensated sums.

It sits below :mod:`gossip.algorithms` (which use it) and :mod:`gossip.engine` (which runs it),
and imports neither.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Algorithm": "gossip.core.algorithm", "Round": "gossip.core.algorithm",
            "Block": "gossip.core.block", "Channel": "gossip.core.channel",
            "Activation": "gossip.core.activation", "Message": "gossip.core.activation",
            "Requirements": "gossip.core.requirements",
            "Graph": "gossip.core.requirements"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gossip.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
