"""A graph as two arrays of edge endpoints: what the builders of large graphs return first.

Building a networkx graph costs about 1 KB and a few microseconds per edge (seconds and
gigabytes at 10^6 nodes), while the mixing matrix, its validation and the per-node views need
only the endpoints.  :class:`EdgeList` holds them as int64 arrays (with the graph attributes a
builder sets); :meth:`EdgeList.to_networkx` makes the very graph the builder returns, with the
same nodes, edges, edge order and attributes, for whoever asks for ``Topology.graph``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

__all__ = ["EdgeList"]


@dataclass(frozen=True, eq=False)
class EdgeList:
    """Nodes 0..n-1 and edges (u[k], v[k]): undirected edges once each, or arcs u -> v.

    The builder guarantees a simple graph: no self-loop, no edge (or arc) twice, for an
    undirected graph not both (a, b) and (b, a).  ``attrs`` are the graph attributes (name,
    shape, layout, seed, ...); ``connected`` says the builder guarantees (strong) connectivity.
    """

    n: int
    u: np.ndarray
    v: np.ndarray
    directed: bool = False
    attrs: dict = field(default_factory=dict)
    connected: bool = False
    """True when the builder knows the graph is (strongly) connected, so no one checks again."""

    def number_of_nodes(self) -> int:
        """n (networkx's name, so the two kinds of graph answer alike)."""
        return self.n

    def number_of_edges(self) -> int:
        """The number of edges (of arcs for a directed graph)."""
        return int(self.u.size)

    def is_directed(self) -> bool:
        """True for arcs u -> v."""
        return self.directed

    def to_networkx(self) -> nx.Graph:
        """The networkx (Di)Graph with these nodes, edges (in this order) and attributes."""
        graph = nx.DiGraph(**self.attrs) if self.directed else nx.Graph(**self.attrs)
        graph.add_nodes_from(range(self.n))
        graph.add_edges_from(zip(self.u.tolist(), self.v.tolist(), strict=True))
        return graph


def unique_edges(u: np.ndarray, v: np.ndarray, directed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(u, v) without repeated edges, first occurrence kept, order otherwise unchanged.

    For an undirected graph (a, b) and (b, a) are the same edge (networkx keeps the first)."""
    lo, hi = (u, v) if directed else (np.minimum(u, v), np.maximum(u, v))
    n = int(max(u.max(initial=0), v.max(initial=0))) + 1
    _, first = np.unique(lo * n + hi, return_index=True)
    if first.size == u.size:
        return u, v
    first.sort()
    return u[first], v[first]
