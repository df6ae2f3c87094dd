"""Exceptions raised by `topologies`: each names the offending value and says how to fix it."""

from __future__ import annotations

__all__ = [
    "TopologyError",
    "SpecError",
    "GraphFileError",
    "SelfLoopError",
    "WeightRuleError",
    "NotNeighborError",
    "MixingMatrixError",
    "MatrixShapeError",
    "NonFiniteWeightError",
    "OffGraphWeightError",
    "NegativeWeightError",
    "NotDoublyStochasticError",
    "NotSymmetricError",
    "DisconnectedGraphError",
    "NoSpectralGapError",
]


class TopologyError(ValueError):
    """Base class of every error raised by `topologies` (a ValueError: catch either)."""


class SpecError(TopologyError):
    """A topology spec string could not be understood (unknown name, bad parameter)."""


class GraphFileError(TopologyError):
    """A graph file (or a graph-returning callable) is missing, unreadable or empty."""


class SelfLoopError(TopologyError):
    """The graph has a self-loop; self weights are implied by the mixing rule, never by an edge."""


class WeightRuleError(TopologyError):
    """The requested weight rule cannot produce a mixing matrix for this graph."""


class NotNeighborError(TopologyError, KeyError):
    """`NodeView.weight_of(j)` was asked about a node j that is not an in-neighbor."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class MixingMatrixError(TopologyError):
    """Base class of the checks done by `topologies.validate`."""


class MatrixShapeError(MixingMatrixError):
    """W is not square, or its size does not match the graph."""


class NonFiniteWeightError(MixingMatrixError):
    """W holds a NaN or an infinity."""


class OffGraphWeightError(MixingMatrixError):
    """W puts weight on a pair (i, j) that is not an edge of the graph."""


class NegativeWeightError(MixingMatrixError):
    """W has a negative entry."""


class NotDoublyStochasticError(MixingMatrixError):
    """A row or a column of W does not sum to 1."""


class NotSymmetricError(MixingMatrixError):
    """W is not symmetric although the algorithm (or an undirected graph) requires it."""


class DisconnectedGraphError(MixingMatrixError):
    """The graph (or W's support) is not (strongly) connected, so nodes cannot reach consensus."""


class NoSpectralGapError(MixingMatrixError):
    """rho(W) = 1: gossip with W never contracts (e.g. periodic W on a bipartite graph)."""
