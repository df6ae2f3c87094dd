"""Transports: move message rows between node ids (in process, or over MPI / torch.distributed).

The names below load on first use, so ``gossip.comm.launch`` (asked by every script's parser)
is importable without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Transport": "gossip.comm.base",
    "LocalTransport": "gossip.comm.local",
    "Link": "gossip.comm.link",
    "MPILink": "gossip.comm.mpi",
    "TorchLink": "gossip.comm.torch_dist",
    "CommError": "gossip.errors",
    "CommTimeout": "gossip.errors",
}

__all__ = ["CommError", "CommTimeout", "Link", "LocalTransport", "MPILink", "TorchLink", "Transport"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gossip.comm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
