"""Exceptions raised by `topologies`: each names the offending value and says how to fix it.

One class per way a caller handles them: ``TopologyError`` (a ValueError) is the base every
script catches; ``SpecError`` is a spec string (or a ``module:function``) that cannot be
understood or loaded, ``GraphFileError`` a graph that cannot be used as given (a file, a
function's return, a self-loop), ``MixingMatrixError`` a mixing matrix that cannot be built from
the graph or fails ``topologies.validate`` (shape, weights, stochasticity, symmetry,
connectivity, spectral gap), and ``NotNeighborError`` also a KeyError (a lookup by node).
"""

from __future__ import annotations

__all__ = ["TopologyError", "SpecError", "GraphFileError", "MixingMatrixError", "NotNeighborError"]


class TopologyError(ValueError):
    """Base class of every error raised by `topologies` (a ValueError: catch either)."""


class SpecError(TopologyError):
    """A topology spec string could not be understood (unknown name, bad parameter) or its
    ``module:function`` could not be loaded."""


class GraphFileError(TopologyError):
    """A graph that cannot be used as given: a graph file (or a graph-returning callable) that
    is missing, unreadable or empty, or a graph with a self-loop (self weights come from the
    weight rule, never from an edge)."""


class MixingMatrixError(TopologyError):
    """No valid mixing matrix: the weight rule cannot build one for this graph, or W fails a
    check of `topologies.validate` (square and of the graph's size, finite, only on edges,
    nonnegative, stochastic, symmetric when required, connected with a spectral gap); a random
    graph that stayed disconnected after every draw too. The message says which and the fix."""


class NotNeighborError(TopologyError, KeyError):
    """`NodeView.weight_of(j)` was asked about a node j that is not an in-neighbor."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""
