"""Mixing matrices from graphs, and their validation.

Convention (docs/algorithms/README.md): W[i, j] is the weight node i gives to node j's value, so
node i computes x_i <- sum_j W[i, j] x_j.  For a DiGraph an arc u -> v means u sends to v, so it
allows W[v, u] != 0.

Rules (docs/topologies.md, mixing matrices), for an undirected graph with degrees d_i:

* ``metropolis`` (default): w_ij = 1 / (1 + max(d_i, d_j)) on edges; symmetric, doubly
  stochastic, positive self weights, needs only the neighbours' degrees.
* ``max-degree``: w_ij = 1 / (1 + d_max) on edges.
* ``uniform``: 1 / (d + 1) for self and every neighbour; regular graphs only (on irregular graphs
  such rows are not doubly stochastic).
* ``weights``: the edges' ``weight`` attributes; self weight = 1 - row sum.

For a DiGraph, ``uniform`` and ``metropolis`` need every node to have in-degree = out-degree = d
(weights 1 / (d + 1): the directed exponential graph's 1 / (tau + 1)), and ``max-degree`` needs
in-degree = out-degree at every node; ``weights`` works for any digraph but validation then checks
that columns also sum to 1.

Two rules for directed graphs of any degrees (push-sum and push-pull methods) give matrices that are
stochastic one way only:

* ``push``: column-stochastic, node j splits its value equally over itself and its out-neighbours,
  W[i, j] = 1 / (1 + out_deg(j)) on arcs j -> i and on the diagonal;
* ``pull``: row-stochastic, node i averages itself and its in-neighbours,
  W[i, j] = 1 / (1 + in_deg(i)).

`validate(..., stochastic="column" | "row")` checks those instead of double stochasticity.
Self weights always come from the rule: graphs with self-loops are rejected.  ``lazy=True`` returns (I + W) / 2.
"""

from __future__ import annotations

import difflib
import itertools
import logging

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from .edgelist import EdgeList
from .errors import (
    GraphFileError,
    MixingMatrixError,
    TopologyError,
)
from .spectral import DENSE_MAX_N, TIME_BUDGET, spectrum

logger = logging.getLogger(__name__)

__all__ = ["mixing_matrix", "validate", "check_connected", "check_graph", "normalize_rule", "RULES", "DENSE_MAX_N"]

RULES = ("metropolis", "max-degree", "uniform", "weights", "push", "pull")
STOCHASTIC = {"push": "column", "pull": "row"}
"""Rules whose matrices are stochastic one way only (all others give doubly stochastic W)."""
_ALIASES = {
    "mh": "metropolis",
    "metropolis-hastings": "metropolis",
    "maxdegree": "max-degree",
    "max": "max-degree",
    "explicit": "weights",
    "weight": "weights",
    "column": "push",
    "column-stochastic": "push",
    "row": "pull",
    "row-stochastic": "pull",
}


def normalize_rule(rule: str) -> str:
    """Canonical rule name ('max_degree' -> 'max-degree', 'mh' -> 'metropolis')."""
    if not isinstance(rule, str):
        raise MixingMatrixError(
            f"weight rule must be a string, one of {', '.join(RULES)}; got {rule!r}"
        )
    key = rule.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in RULES:
        close = difflib.get_close_matches(key, [*RULES, *_ALIASES], n=1)
        hint = f" (did you mean {_ALIASES.get(close[0], close[0])!r}?)" if close else ""
        raise MixingMatrixError(f"unknown weight rule {rule!r}{hint}; valid rules: {', '.join(RULES)}")
    return key


def check_graph(graph: nx.Graph) -> int:
    """Return n after checking graph is a simple (Di)Graph on nodes 0..n-1 without self-loops."""
    if not isinstance(graph, nx.Graph):
        raise TopologyError(f"expected a networkx Graph or DiGraph, got {type(graph).__name__}")
    if graph.is_multigraph():
        raise TopologyError(
            "multigraphs are not supported; convert with networkx.Graph(graph) (one edge per pair)"
        )
    n = graph.number_of_nodes()
    if n == 0:
        raise TopologyError("the graph has no nodes")
    if set(graph.nodes) != set(range(n)):
        odd = next(u for u in graph.nodes if not (isinstance(u, int | np.integer) and 0 <= u < n))
        raise TopologyError(
            f"graph nodes must be the integers 0..{n - 1}, found node {odd!r}; relabel with "
            "topologies.io.relabel(graph)"
        )
    for u, _ in nx.selfloop_edges(graph):
        raise GraphFileError(
            f"self-loop on node {u}; remove it (graph.remove_edge({u}, {u})): self weights come "
            "from the weight rule"
        )
    return n


def structure(graph: nx.Graph | EdgeList) -> tuple[int, np.ndarray, np.ndarray, bool]:
    """(n, u, v, directed) of a graph: its size and edge endpoints (arcs u -> v if directed).

    A networkx graph is checked first (:func:`check_graph`); an :class:`EdgeList` is simple by
    its builder's construction and is taken as it is.
    """
    if isinstance(graph, EdgeList):
        return graph.n, graph.u, graph.v, graph.directed
    n = check_graph(graph)
    u, v = _arcs(graph)
    return n, u, v, graph.is_directed()


def _arcs(graph: nx.Graph) -> tuple[np.ndarray, np.ndarray]:
    """Edge endpoints as int arrays (u, v): undirected edges once, arcs u -> v for a DiGraph."""
    m = graph.number_of_edges()
    flat = np.fromiter(itertools.chain.from_iterable(graph.edges()), dtype=np.int64, count=2 * m)
    return flat[0::2], flat[1::2]


def _regular_degree(in_deg: np.ndarray, out_deg: np.ndarray, rule: str, directed: bool) -> int:
    """The common degree d of a regular graph, or MixingMatrixError naming an offending node."""
    if directed:
        bad = np.flatnonzero(in_deg != out_deg)
        if bad.size:
            i = int(bad[0])
            raise MixingMatrixError(
                f"rule {rule!r} on a directed graph needs in-degree = out-degree at every node, "
                f"but node {i} has in-degree {in_deg[i]} and out-degree {out_deg[i]}; use "
                "rule='push' (column-stochastic, for push-sum methods) or 'pull' (row-stochastic), "
                "explicit 'weight' attributes (rule='weights'), or an undirected graph"
            )
    if in_deg.min() != in_deg.max():
        i, j = int(in_deg.argmin()), int(in_deg.argmax())
        fix = ("use rule='max-degree' or explicit weights" if directed
               else "use rule='metropolis' (doubly stochastic on any graph)")
        raise MixingMatrixError(
            f"rule {rule!r} needs a regular graph, but node {i} has degree {in_deg[i]} and node "
            f"{j} has degree {in_deg[j]} (rows 1/(d_i+1) would not be doubly stochastic); {fix}"
        )
    return int(in_deg[0])


def _explicit_weights(graph: nx.Graph) -> np.ndarray:
    """The `weight` attribute of every edge, in the order of graph.edges()."""
    weights = np.empty(graph.number_of_edges())
    for k, (a, b, w) in enumerate(graph.edges(data="weight")):
        if w is None:
            raise MixingMatrixError(
                f"rule 'weights' needs a 'weight' attribute on every edge; edge ({a}, {b}) has "
                "none: add it, or use rule='metropolis'"
            )
        if not np.isfinite(w):
            raise MixingMatrixError(f"edge ({a}, {b}) has weight {w}; weights must be finite")
        if w < 0:
            raise MixingMatrixError(
                f"edge ({a}, {b}) has negative weight {w}; mixing weights must be >= 0"
            )
        weights[k] = w
    return weights


def mixing_matrix(
    graph: nx.Graph | EdgeList,
    rule: str = "metropolis",
    lazy: bool = False,
    sparse: bool | None = None,
    *,
    dense_max_n: int = DENSE_MAX_N,
) -> np.ndarray | sp.csr_array:
    """Mixing matrix W of graph under a weight rule: dense float64 up to dense_max_n, else CSR.

    ``graph`` is a networkx graph or an :class:`EdgeList` (which has no edge attributes: for
    ``rule="weights"`` it is made a networkx graph first, and refused as one without weights).
    """
    rule = normalize_rule(rule)
    if isinstance(graph, EdgeList) and rule == "weights":
        graph = graph.to_networkx()
    n, u, v, directed = structure(graph)
    out_deg = np.bincount(u, minlength=n)
    in_deg = np.bincount(v, minlength=n)
    if not directed:
        in_deg = out_deg = in_deg + out_deg

    if rule in STOCHASTIC:
        if not directed:  # every edge is two arcs
            u, v = np.concatenate([u, v]), np.concatenate([v, u])
            directed = True
        deg = out_deg[u] if rule == "push" else in_deg[v]
        w = 1.0 / (1.0 + deg)
        self_w = 1.0 / (1.0 + (out_deg if rule == "push" else in_deg))
        return _assemble(n, v, u, w, self_w, lazy, sparse, dense_max_n)
    if rule == "weights":
        w = _explicit_weights(graph)
    elif rule == "max-degree":
        if directed and (in_deg != out_deg).any():
            _regular_degree(in_deg, out_deg, rule, directed)  # raises, naming the node
        w = np.full(len(u), 1.0 / (1.0 + in_deg.max()))
    elif rule == "uniform" or directed:
        d = _regular_degree(in_deg, out_deg, rule, directed)
        w = np.full(len(u), 1.0 / (1.0 + d))
    else:  # metropolis on an undirected graph
        w = 1.0 / (1.0 + np.maximum(in_deg[u], in_deg[v]))

    # W[i, j] != 0 when i receives from j: both ways for an edge, W[v, u] for an arc u -> v
    rows, cols = (v, u) if directed else (np.concatenate([u, v]), np.concatenate([v, u]))
    vals = w if directed else np.concatenate([w, w])
    self_w = 1.0 - np.bincount(rows, weights=vals, minlength=n)
    if rule == "weights" and self_w.min() < -1e-12:
        i = int(self_w.argmin())
        raise MixingMatrixError(
            f"node {i}: its explicit edge weights sum to {1 - self_w[i]:.6g} > 1, which leaves a "
            f"negative self weight {self_w[i]:.6g}; scale node {i}'s weights so they sum to <= 1"
        )
    self_w = np.maximum(self_w, 0.0) if rule == "weights" else self_w
    return _assemble(n, rows, cols, vals, self_w, lazy, sparse, dense_max_n)


def _assemble(n, rows, cols, vals, self_w, lazy, sparse, dense_max_n):
    """W with the given off-diagonal entries and diagonal, made lazy if asked, dense or CSR."""
    if lazy:
        vals = vals * 0.5
        self_w = 0.5 + 0.5 * self_w

    use_sparse = n > dense_max_n if sparse is None else bool(sparse)
    if use_sparse:
        idx = np.arange(n)
        data = np.concatenate([vals, self_w])
        coords = (np.concatenate([rows, idx]), np.concatenate([cols, idx]))
        W = sp.coo_array((data, coords), shape=(n, n)).tocsr()
        W.sum_duplicates()
        W.eliminate_zeros()
        return W
    W = np.zeros((n, n))
    W[rows, cols] = vals
    W[np.arange(n), np.arange(n)] = self_w
    return W


# ---------------------------------------------------------------------------------------------
# validation


def _entries(W) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, values) of the nonzero entries of W, row-major order."""
    if sp.issparse(W) and W.format == "csr" and W.has_canonical_format:  # rows in order already
        rows = np.repeat(np.arange(W.shape[0], dtype=np.int64), np.diff(W.indptr))
        cols, vals = W.indices.astype(np.int64), W.data
        keep = vals != 0
        return rows[keep], cols[keep], vals[keep]
    if sp.issparse(W):
        coo = sp.coo_array(W)
        order = np.lexsort((coo.col, coo.row))
        rows, cols, vals = coo.row[order], coo.col[order], coo.data[order]
        keep = vals != 0
        return rows[keep].astype(np.int64), cols[keep].astype(np.int64), vals[keep]
    rows, cols = np.nonzero(W)
    return rows.astype(np.int64), cols.astype(np.int64), W[rows, cols]


def _member(keys: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Mask of the keys found in allowed (by sorting allowed: np.isin's hashing took seconds
    on millions of keys)."""
    allowed = np.sort(allowed)
    if not allowed.size:
        return np.zeros(keys.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(allowed, keys), allowed.size - 1)
    return allowed[pos] == keys


def _component_message(W, n: int, directed: bool) -> str | None:
    """None if W's support is (strongly) connected, else a sentence naming the components."""
    connection = "strong" if directed else "weak"
    count, labels = connected_components(
        sp.csr_array(W) if not sp.issparse(W) else W, directed=True, connection=connection
    )
    if count == 1:
        return None
    sizes = np.bincount(labels)
    far = int(np.flatnonzero(labels != labels[0])[0])
    kind = "strongly connected components" if directed else "connected components"
    shown = ", ".join(map(str, sorted(sizes.tolist(), reverse=True)[:8]))
    return (
        f"the graph of W has {count} {kind} (sizes {shown}{', ...' if count > 8 else ''}); "
        f"node {far} cannot be reached from node 0, whose component has {sizes[labels[0]]} of "
        f"{n} nodes; add edges between the components or use a connected topology"
    )


def validate(
    W,
    graph: nx.Graph | EdgeList,
    symmetric: bool = True,
    *,
    connected: bool = True,
    atol: float = 1e-10,
    stochastic: str = "double",
) -> None:
    """Check W is a valid mixing matrix for graph; raise the specific MixingMatrixError otherwise.

    Checks, in order: square, size matches the graph, finite, no weight outside the graph's edges,
    nonnegative, rows and columns sum to 1 (within atol; only columns for
    ``stochastic="column"``, only rows for ``"row"``), symmetric (if required), and, when
    `connected` is True, that W's support is (strongly) connected with spectral gap > 0 (for a
    one-way stochastic W: strongly connected with a positive diagonal, so W is primitive).
    """
    if stochastic not in ("double", "column", "row"):
        raise TopologyError(f"stochastic must be 'double', 'column' or 'row', got {stochastic!r}")
    n, u, v, directed = structure(graph)
    shape = getattr(W, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != shape[1]:
        raise MixingMatrixError(f"W must be a square n x n matrix, got shape {shape}")
    if shape[0] != n:
        raise MixingMatrixError(
            f"W is {shape[0]} x {shape[1]} but the graph has {n} nodes; build W from this graph "
            "(topologies.mixing_matrix(graph))"
        )
    if not sp.issparse(W):
        W = np.asarray(W, dtype=np.float64)
    rows, cols, vals = _entries(W)
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        k = bad[0]
        raise MixingMatrixError(
            f"W[{rows[k]}, {cols[k]}] = {vals[k]}; every weight must be a finite number"
        )

    allowed = v * n + u if directed else np.concatenate([u * n + v, v * n + u])
    off = rows != cols
    outside = off & ~_member(rows * n + cols, allowed)
    if outside.any():
        k = int(np.flatnonzero(outside)[0])
        i, j = int(rows[k]), int(cols[k])
        link = f"arc {j} -> {i}" if directed else f"edge ({i}, {j})"
        raise MixingMatrixError(
            f"W[{i}, {j}] = {vals[k]:.6g} but the graph has no {link}: node {i} would mix a value "
            f"it never receives; set W[{i}, {j}] = 0 or add the edge"
        )

    negative = vals < -atol
    if negative.any():
        k = int(np.argmin(np.where(negative, vals, np.inf)))
        raise MixingMatrixError(
            f"W[{rows[k]}, {cols[k]}] = {vals[k]:.6g} < 0; mixing weights must be nonnegative "
            "(use rule='metropolis', or lower the neighbours' weights so self weights stay >= 0)"
        )

    row_sums = np.bincount(rows, weights=vals, minlength=n)
    col_sums = np.bincount(cols, weights=vals, minlength=n)
    checks = [(row_sums, "row"), (col_sums, "column")]
    if stochastic != "double":
        checks = [c for c in checks if c[1] == stochastic]
    for sums, what in checks:
        err = np.abs(sums - 1.0)
        if err.max() > atol:
            i = int(err.argmax())
            meaning = ("the weights node {i} mixes" if what == "row"
                       else "the weights others give to node {i}'s value").format(i=i)
            need = ("doubly stochastic so gossip preserves the average" if stochastic == "double"
                    else f"{stochastic}-stochastic")
            raise MixingMatrixError(
                f"{what} {i} of W sums to {sums[i]:.12g}, not 1 ({meaning}); W must be {need}: "
                f"use topologies.mixing_matrix(graph) or fix node {i}'s weights"
            )

    if symmetric:
        if sp.issparse(W):
            D = sp.coo_array(W - W.T)
            gaps, di, dj = np.abs(D.data), D.row, D.col
        else:
            diff = np.abs(W - W.T)
            di, dj = np.nonzero(diff > atol)
            gaps = diff[di, dj]
        if gaps.size and gaps.max() > atol:
            k = int(gaps.argmax())
            i, j = int(min(di[k], dj[k])), int(max(di[k], dj[k]))
            wij, wji = _entry(W, i, j), _entry(W, j, i)
            raise MixingMatrixError(
                f"W[{i}, {j}] = {wij:.6g} but W[{j}, {i}] = {wji:.6g}; this use requires a "
                "symmetric W (w_ij = w_ji): use rule='metropolis' on an undirected graph, or pass "
                "symmetric=False if the algorithm accepts directed mixing"
            )

    if connected:
        check_connected(W, n, directed=directed or not symmetric, atol=atol, stochastic=stochastic)


BUILT_EXACTLY = ("metropolis", "max-degree", "uniform")
"""Rules whose W, once `mixing_matrix` returned it, has every property `validate` checks but
connectivity (finite, on the edges, nonnegative, doubly stochastic, symmetric on an undirected
graph): a Topology checks only connectivity and the gap of such a W when it is large."""


def check_connected(W, n: int, *, directed: bool, atol: float = 1e-10,
                    stochastic: str = "double", known: bool = False) -> None:
    """The last checks of `validate`: W's support is (strongly if ``directed``) connected and W is
    primitive (a positive diagonal, or spectral gap > 0); MixingMatrixError otherwise.
    ``known``: the support is connected by construction (a builder's graph, positive weights)."""
    message = None if known else _component_message(W, n, directed=directed)
    if message is not None:
        raise MixingMatrixError(message)
    diagonal = W.diagonal() if sp.issparse(W) else np.diag(W)
    if diagonal.min() > atol:
        return  # connected + stochastic + positive diagonal => primitive (rho < 1 if doubly)
    if stochastic != "double":
        i = int(diagonal.argmin())
        raise MixingMatrixError(
            f"W[{i}, {i}] = {diagonal[i]:.6g}: a {stochastic}-stochastic W needs a positive "
            "diagonal to be primitive (push-sum converges only then); use lazy=True"
        )
    found = spectrum(W, time_budget=TIME_BUDGET, name="W")
    if not found.exact:  # logged by spectrum: the gap of a huge W that has no closed form
        logger.warning("validate: the spectral-gap check of W (n=%d, a zero self weight) was "
                       "skipped; use lazy=True to make it unnecessary", n)
        return
    value = found.rho
    if value >= 1.0 - 1e-12:
        raise MixingMatrixError(
            f"rho(W) = ||W - J||_2 = {value:.12g}, so the spectral gap is 0 and gossip never "
            "converges (W is periodic, e.g. zero self weights on a bipartite graph); use "
            "lazy=True ((I + W) / 2) or give every node a positive self weight"
        )


def _entry(W, i: int, j: int) -> float:
    """W[i, j] as a float for dense or sparse W."""
    return float(W[i, j])
