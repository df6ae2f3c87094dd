"""topologies: graphs, mixing matrices and per-node views for decentralized learning.

Pure networkx / numpy / scipy; nothing about tensors or MPI.

    >>> from topologies import build
    >>> topo = build("ring", 8)
    >>> round(topo.gap, 4), topo.view(0).neighbors
    (0.1953, (1, 7))

The names below are loaded on first use (module ``__getattr__``), so ``import topologies`` or
``topologies.registry`` / ``topologies.spec`` alone imports neither networkx nor scipy.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import GraphFileError, MixingMatrixError, NotNeighborError, SpecError, TopologyError

_LAZY: dict[str, str] = {
    "build": "factory",
    "load": "io",
    "load_callable": "io",
    "relabel": "io",
    "mixing_matrix": "mixing",
    "validate": "mixing",
    "parse": "spec",
    "Spectrum": "spectral",
    "beta": "spectral",
    "lambda2": "spectral",
    "rho": "spectral",
    "spectral_gap": "spectral",
    "spectrum": "spectral",
    "alternating_exp_ring": "timevarying",
    "alternating_ring": "timevarying",
    "one_peer_exponential": "timevarying",
    "random_matchings": "timevarying",
    "NodeView": "topology",
    "TimeVaryingTopology": "topology",
    "Topology": "topology",
    **dict.fromkeys(("complete", "directed_exponential", "directed_random", "erdos_renyi",
                     "exponential", "geometric", "grid", "hypercube", "path", "random_regular",
                     "ring", "star", "torus", "watts_strogatz"), "builders"),
}
"""Public name -> the submodule defining it, imported when the name is first read."""

__all__ = [
    # entry points
    "build",
    "parse",
    "load",
    "load_callable",
    "relabel",
    # objects
    "Topology",
    "TimeVaryingTopology",
    "NodeView",
    # matrices and spectra
    "mixing_matrix",
    "validate",
    "spectrum",
    "Spectrum",
    "spectral_gap",
    "rho",
    "beta",
    "lambda2",
    # builders
    "ring",
    "path",
    "torus",
    "grid",
    "complete",
    "star",
    "hypercube",
    "exponential",
    "directed_exponential",
    "directed_random",
    "random_regular",
    "erdos_renyi",
    "geometric",
    "watts_strogatz",
    "one_peer_exponential",
    "random_matchings",
    "alternating_ring",
    "alternating_exp_ring",
    # errors
    "TopologyError",
    "SpecError",
    "GraphFileError",
    "MixingMatrixError",
    "NotNeighborError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'topologies' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
