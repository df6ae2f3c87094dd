"""Topology objects: a graph with its validated mixing matrix, and per-node views of it.

A `Topology` is static; a `TimeVaryingTopology` hands out one `Topology` per round
(t = 1, 2, ...).  Engines ask `topology.at_round(t).view(i)` for node i's neighbours and weights,
which works for both kinds.
"""

from __future__ import annotations

import bisect
import operator
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np
import scipy.sparse as sp

from .edgelist import EdgeList
from .errors import NotNeighborError, TopologyError
from .io import relabel
from .mixing import (
    BUILT_EXACTLY,
    STOCHASTIC,
    check_connected,
    check_graph,
    mixing_matrix,
    normalize_rule,
    validate,
)
from .spectral import DENSE_MAX_N, TIME_BUDGET, Spectrum, spectrum

__all__ = ["NodeView", "Topology", "TimeVaryingTopology"]


@dataclass(frozen=True)
class NodeView:
    """What node `node` needs for a gossip step: whom it mixes (with weights), whom it feeds."""

    node: int
    in_neighbors: tuple[int, ...]  # sorted j != node with W[node, j] != 0: it receives from them
    in_weights: tuple[float, ...]  # W[node, j], aligned with in_neighbors
    out_neighbors: tuple[int, ...]  # sorted j != node with W[j, node] != 0: it sends to them
    self_weight: float  # W[node, node]
    out_weights: tuple[float, ...] = ()  # W[j, node], aligned with out_neighbors

    @property
    def neighbors(self) -> tuple[int, ...]:
        """The in-neighbors (for undirected graphs in- and out-neighbors coincide)."""
        return self.in_neighbors

    @property
    def weights(self) -> tuple[float, ...]:
        """The in-weights W[node, j], aligned with `neighbors`."""
        return self.in_weights

    def weight_of(self, j: int) -> float:
        """W[node, j] for an in-neighbor j (or j == node, the self weight)."""
        if j == self.node:
            return self.self_weight
        k = bisect.bisect_left(self.in_neighbors, j)
        if k < len(self.in_neighbors) and self.in_neighbors[k] == j:
            return self.in_weights[k]
        raise NotNeighborError(
            f"node {j} is not an in-neighbor of node {self.node} (W[{self.node}, {j}] = 0); "
            f"in-neighbors: {list(self.in_neighbors)}"
        )


def _check_round(t: object) -> int:
    """Round number as an int >= 1."""
    if isinstance(t, bool):
        raise TopologyError(f"round must be an integer >= 1, got {t!r}")
    try:
        t = operator.index(t)
    except TypeError:
        raise TopologyError(f"round must be an integer >= 1, got {t!r}") from None
    if t < 1:
        raise TopologyError(f"rounds are numbered t = 1, 2, ...; got t={t}")
    return t


def _group_hint(attrs: dict, n: int) -> tuple[int, ...] | None:
    """The group whose symmetry a builder's graph has (checked on W before it is used)."""
    name = attrs.get("name")
    if name == "torus" and len(attrs.get("shape") or ()) == 2:
        return tuple(int(m) for m in attrs["shape"])
    if name == "hypercube" and n & (n - 1) == 0:
        return (2,) * (n.bit_length() - 1)
    return None


class Topology:
    """A static graph with its validated mixing matrix.

    The graph may be given as an :class:`~topologies.edgelist.EdgeList` (what ``build`` passes
    for the builders' graphs): ``topology.graph`` is then made a networkx graph on first use
    only.  The spectrum is computed on first use too, in closed form when W has one, else
    within ``time_budget`` seconds (``Spectrum.exact`` says whether it got there).
    """

    time_varying: bool = False

    def __init__(
        self,
        graph: nx.Graph | EdgeList,
        W: np.ndarray | sp.sparray | None = None,
        *,
        rule: str = "metropolis",
        lazy: bool = False,
        symmetric: bool | None = None,
        name: str | None = None,
        require_connected: bool = True,
        sparse: bool | None = None,
        stochastic: str | None = None,
        time_budget: float | None = TIME_BUDGET,
    ) -> None:
        """Build W from `rule` when W is None (else use W, made lazy if asked); then validate.

        `stochastic` is "double" (default), "column" or "row" (the defaults of the `push` and
        `pull` rules): what `validate` checks, kept as ``self.stochastic`` for algorithms that
        need one kind (push-sum needs column-stochastic weights).
        `symmetric=None` requires a symmetric W exactly when the graph is undirected and W is
        doubly stochastic;
        `require_connected=False` skips the connectivity and spectral-gap checks (per-round graphs
        of time-varying topologies).  Nodes other than 0..n-1 are relabeled when W is built here.
        `time_budget`: seconds the spectrum's iterative solvers may take (None: no limit).
        """
        edges = graph if isinstance(graph, EdgeList) else None
        if edges is None and not isinstance(graph, nx.Graph):
            raise TopologyError(f"expected a networkx Graph or DiGraph, got {type(graph).__name__}")
        if W is None:
            if edges is None and set(graph.nodes) != set(range(graph.number_of_nodes())):
                graph = relabel(graph)
            self.rule = normalize_rule(rule)
            W = mixing_matrix(graph, self.rule, lazy=lazy, sparse=sparse)
        else:
            if edges is None:
                check_graph(graph)
            self.rule = "explicit"
            if sp.issparse(W):
                W = sp.csr_array(W, dtype=np.float64, copy=True)
            else:
                W = np.array(W, dtype=np.float64)
            if lazy and W.ndim == 2 and W.shape[0] == W.shape[1]:
                if sp.issparse(W):
                    W = sp.csr_array((W + sp.eye_array(W.shape[0])) * 0.5)
                else:
                    W = (W + np.eye(W.shape[0])) * 0.5
        if stochastic is None:
            stochastic = STOCHASTIC.get(self.rule, "double")
        self.stochastic = stochastic
        default_symmetric = not graph.is_directed() and stochastic == "double"
        required = default_symmetric if symmetric is None else bool(symmetric)
        directed = graph.is_directed()
        if (sp.issparse(W) and self.rule in BUILT_EXACTLY and not (required and directed)):
            # built here by a rule that guarantees the entries: only what the graph decides
            if require_connected:
                check_connected(W, graph.number_of_nodes(), directed=directed or not required,
                                stochastic=stochastic, known=edges is not None and edges.connected)
        else:
            validate(W, graph, symmetric=required, connected=require_connected,
                     stochastic=stochastic)

        self._graph = None if edges is not None else graph
        self._edges = edges
        self._attrs = dict(edges.attrs if edges is not None else graph.graph)
        self.W = W
        self.n = graph.number_of_nodes()
        self.name = name or str(self._attrs.get("name") or "graph")
        self.lazy = bool(lazy)
        self.time_budget = time_budget
        if sp.issparse(W) and self.rule in BUILT_EXACTLY and W.has_canonical_format:
            rows = W  # built here: sorted, no zeros stored, and never written to
        else:
            rows = sp.csr_array(W, copy=True)
            rows.eliminate_zeros()
            rows.sort_indices()
        if rows is W and not directed:  # a rule's W on an undirected graph is symmetric
            cols, self.directed = rows, False
        else:
            cols = sp.csr_array(rows.T)
            cols.sort_indices()
            self.directed = bool(abs(rows - cols).max() > 1e-12) if rows.nnz else False
        self._rows, self._cols = rows, cols
        if isinstance(W, np.ndarray):
            W.setflags(write=False)  # cached views and spectra must not go stale
        self._views: dict[int, NodeView] = {}

    @property
    def graph(self) -> nx.Graph:
        """The networkx graph (made from the edge arrays on first use when built from them)."""
        if self._graph is None:
            self._graph = self._edges.to_networkx()
        return self._graph

    def number_of_edges(self) -> int:
        """Edges of the graph (arcs for a directed one), without making a networkx graph."""
        return (self._edges if self._graph is None else self._graph).number_of_edges()

    # per-node views ---------------------------------------------------------------------------

    def view(self, i: int) -> NodeView:
        """Node i's neighbours and weights (cached; O(degree) from a CSR row)."""
        try:
            i = operator.index(i)
        except TypeError:
            raise TopologyError(f"node id must be an integer, got {i!r}") from None
        cached = self._views.get(i)
        if cached is not None:
            return cached
        if not 0 <= i < self.n:
            raise IndexError(f"node {i} is out of range for a topology of n={self.n} nodes")
        rows, cols = self._rows, self._cols
        lo, hi = rows.indptr[i], rows.indptr[i + 1]
        idx, vals = rows.indices[lo:hi], rows.data[lo:hi]
        mask = idx != i
        self_weight = float(vals[~mask].sum())
        olo, ohi = cols.indptr[i], cols.indptr[i + 1]
        out_idx, out_vals = cols.indices[olo:ohi], cols.data[olo:ohi]
        view = NodeView(
            node=i,
            in_neighbors=tuple(int(j) for j in idx[mask]),
            in_weights=tuple(float(w) for w in vals[mask]),
            out_neighbors=tuple(int(j) for j in out_idx[out_idx != i]),
            self_weight=self_weight,
            out_weights=tuple(float(w) for w in out_vals[out_idx != i]),
        )
        self._views[i] = view
        return view

    def out_neighbor_lists(self) -> list[list[int]]:
        """Every node's ``view(i).out_neighbors`` (the same order), from one pass over W's
        columns: an asynchronous run of 10⁶ nodes asks them all at its start, and a view per
        node costs ~15 µs (its weights, its self weight, its tuples)."""
        cols = self._cols
        owner = np.repeat(np.arange(self.n), np.diff(cols.indptr))
        keep = cols.indices != owner
        bounds = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner[keep], minlength=self.n), out=bounds[1:])
        flat = cols.indices[keep].tolist()
        edges = bounds.tolist()
        return [flat[edges[i]:edges[i + 1]] for i in range(self.n)]

    def at_round(self, t: int) -> Topology:
        """The topology used in round t (t >= 1): always self for a static topology."""
        _check_round(t)
        return self

    # spectral quantities ----------------------------------------------------------------------

    @cached_property
    def spectrum(self) -> Spectrum:
        """rho, gap, beta, lambda2, lambda_min: computed on first use, then kept.

        Dense for small n; above, a closed form when W has one, else sparse solvers stopped
        after ``self.time_budget`` seconds (then ``exact`` is False and the values are bounds,
        see :func:`topologies.spectral.spectrum`).
        """
        return spectrum(self.W, group=_group_hint(self._attrs, self.n),
                        time_budget=self.time_budget, name=repr(self.name))

    @property
    def rho(self) -> float:
        """||W - J||_2."""
        return self.spectrum.rho

    @property
    def gap(self) -> float:
        """Spectral gap 1 - rho."""
        return self.spectrum.gap

    @property
    def beta(self) -> float:
        """||I - W||_2."""
        return self.spectrum.beta

    @property
    def lambda2(self) -> float | None:
        """Second-largest eigenvalue of W (None when W is not symmetric)."""
        return self.spectrum.lambda2

    # misc ------------------------------------------------------------------------------------

    def dense(self) -> np.ndarray:
        """W as a writable dense copy (for tests and small n)."""
        return self.W.toarray() if sp.issparse(self.W) else np.array(self.W)

    def degrees(self) -> np.ndarray:
        """Number of in-neighbors of every node (graph degree for undirected graphs)."""
        counts = np.diff(self._rows.indptr)
        has_self = np.zeros(self.n, dtype=np.int64)
        diag = self._rows.diagonal()
        has_self[diag != 0] = 1
        return counts - has_self

    def describe(self) -> dict:
        """Summary: name, n, edges, degree min/mean/max, rho, gap, beta, weight rule."""
        degrees = self.degrees()
        return {
            "name": self.name,
            "n": self.n,
            "edges": self.number_of_edges(),
            "directed": self.directed,
            "time_varying": False,
            "degree_min": int(degrees.min()),
            "degree_mean": float(degrees.mean()),
            "degree_max": int(degrees.max()),
            "rho": self.rho,
            "gap": self.gap,
            "beta": self.beta,
            "spectrum": self.spectrum.method,
            "weights": self.rule,
            "stochastic": self.stochastic,
            "lazy": self.lazy,
        }

    def __repr__(self) -> str:
        return (f"Topology(name={self.name!r}, n={self.n}, edges={self.number_of_edges()}, "
                f"weights={self.rule!r}, directed={self.directed})")


class TimeVaryingTopology:
    """A schedule of topologies, one per round (round t = 1, 2, ...)."""

    time_varying = True

    def __init__(
        self,
        n: int,
        round_fn: Callable[[int], Topology],
        *,
        name: str,
        period: int | None = None,
        cache_size: int = 16,
        info: dict | None = None,
    ) -> None:
        """round_fn(t) builds round t's Topology; periodic: t reuses round (t-1) % period + 1."""
        self.n = int(n)
        self.name = name
        self.period = period
        self.info = dict(info or {})
        self._round_fn = round_fn
        self._cache: OrderedDict[int, Topology] = OrderedDict()
        self._cache_size = max(cache_size, period or 0)

    def at_round(self, t: int) -> Topology:
        """The Topology of round t (t = 1, 2, ...); reproducible, cached for recent rounds."""
        t = _check_round(t)
        key = (t - 1) % self.period + 1 if self.period else t
        topo = self._cache.get(key)
        if topo is None:
            topo = self._round_fn(key)
            if topo.n != self.n:
                raise TopologyError(f"{self.name}: round {t} has n={topo.n}, expected n={self.n}")
            self._cache[key] = topo
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return topo

    def product(self, rounds: int, start: int = 1) -> np.ndarray:
        """Dense W^(start+rounds-1) ... W^(start): the map of `rounds` gossip steps (small n)."""
        if self.n > DENSE_MAX_N:
            raise TopologyError(f"product is dense; n={self.n} > {DENSE_MAX_N} is too large")
        P = np.eye(self.n)
        for t in range(start, start + rounds):
            W = self.at_round(t).W
            P = W @ P
        return np.asarray(P)

    def describe(self) -> dict:
        """Summary: name, n, period, degrees, rho of the product over a period (n <= 256)."""
        first = self.at_round(1)
        degrees = first.degrees()
        rounds = self.period or max(1, (self.n - 1).bit_length())
        product_rho = None
        if self.n <= 256:
            P = self.product(rounds)
            product_rho = float(np.linalg.norm(P - np.full((self.n, self.n), 1.0 / self.n), 2))
        return {
            "name": self.name,
            "n": self.n,
            "time_varying": True,
            "period": self.period,
            "edges_round_1": first.number_of_edges(),
            "directed": first.directed,
            "degree_min": int(degrees.min()),
            "degree_mean": float(degrees.mean()),
            "degree_max": int(degrees.max()),
            "weights": first.rule,
            "lazy": first.lazy,
            "product_rounds": rounds,
            "product_rho": product_rho,
            **self.info,
        }

    def __repr__(self) -> str:
        return f"TimeVaryingTopology(name={self.name!r}, n={self.n}, period={self.period})"
