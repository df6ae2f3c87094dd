"""Graph builders: plain functions of `n` returning a networkx graph with nodes 0..n-1.

Each builder sets `graph.graph["name"]`; grid-shaped graphs also set `graph.graph["shape"]`
(rows, cols) with node id = row * cols + col, and ring-like graphs set
`graph.graph["layout"] = "circular"` (used only for plotting).  Random builders take an integer
`seed` and, when they must return a connected graph, redraw with seeds derived from (seed, try)
a bounded number of times before giving up with `MixingMatrixError`.
"""

from __future__ import annotations

import math
import operator
import warnings

import networkx as nx
import numpy as np
from scipy.sparse.csgraph import connected_components

from .edgelist import EdgeList, unique_edges
from .errors import MixingMatrixError, TopologyError

__all__ = [
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
    "MAX_TRIES",
]

MAX_TRIES = 100
"""How many draws a random builder makes before it gives up on getting a connected graph."""


# ---------------------------------------------------------------------------------------------
# argument checks


def _check_n(n: object, builder: str, minimum: int = 2) -> int:
    """Return n as an int, or raise TopologyError when it is not an integer >= minimum."""
    if isinstance(n, bool):
        raise TopologyError(f"{builder}: n must be an integer number of nodes, got {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise TopologyError(
            f"{builder}: n must be an integer number of nodes, got {n!r} "
            f"({type(n).__name__})"
        ) from None
    if n < minimum:
        raise TopologyError(
            f"{builder}: needs n >= {minimum} nodes, got n={n}; "
            "a graph for decentralized learning needs at least two nodes"
        )
    return n


def _check_int(value: object, what: str, builder: str) -> int:
    """Return value as an int, or raise TopologyError naming the parameter."""
    if isinstance(value, bool):
        raise TopologyError(f"{builder}: {what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TopologyError(f"{builder}: {what} must be an integer, got {value!r}") from None


def _check_seed(seed: object, builder: str) -> int:
    """Return seed as a nonnegative int (numpy SeedSequence needs one)."""
    seed = _check_int(seed, "seed", builder)
    if seed < 0:
        raise TopologyError(f"{builder}: seed must be >= 0, got seed={seed}")
    return seed


def _check_probability(p: object, builder: str, allow_zero: bool = False) -> float:
    """Return p as a float in (0, 1] (or [0, 1]), or raise TopologyError."""
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise TopologyError(f"{builder}: p must be a number in (0, 1], got p={p!r}") from None
    low_ok = p >= 0 if allow_zero else p > 0
    if not (low_ok and p <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise TopologyError(f"{builder}: p must be in {interval}, got p={p}")
    return p


def _derived_seed(seed: int, attempt: int) -> int:
    """Seed for draw `attempt` of a random builder, derived from (seed, attempt)."""
    return int(np.random.SeedSequence([seed, attempt]).generate_state(1)[0])


def _empty(n: int, name: str, **attrs: object) -> nx.Graph:
    """A graph with nodes 0..n-1, no edges and graph attributes name and attrs."""
    graph = nx.Graph(name=name, **attrs)
    graph.add_nodes_from(range(n))
    return graph


def _factor(n: int) -> tuple[int, int]:
    """Most square factorization n = rows * cols with rows <= cols (rows may be 1 for primes)."""
    rows = math.isqrt(n)
    while n % rows:
        rows -= 1
    return rows, n // rows


def _nearby_composites(n: int) -> tuple[int, int]:
    """The composite numbers just below and just above n (n >= 2)."""
    def composite(m: int) -> bool:
        return m >= 4 and _factor(m)[0] >= 2
    below = next((m for m in range(n - 1, 3, -1) if composite(m)), 4)
    above = next(m for m in range(n + 1, 2 * n + 4) if composite(m))
    return below, above


def _shape(n: int, rows: int | None, builder: str, min_side: int) -> tuple[int, int]:
    """(rows, cols) for a grid-like graph of n nodes, checking a user-given row count."""
    if rows is None:
        return _factor(n)
    rows = _check_int(rows, "rows", builder)
    if rows < min_side or n % rows or n // rows < min_side:
        valid = [d for d in range(min_side, n // min_side + 1) if n % d == 0]
        hint = ", ".join(map(str, valid)) if valid else "none"
        raise TopologyError(
            f"{builder}: rows={rows} does not split n={n} into rows x cols with rows, cols >= "
            f"{min_side}; valid rows for n={n}: {hint}"
        )
    return rows, n // rows


# ---------------------------------------------------------------------------------------------
# deterministic graphs


def ring_edges(n: int) -> EdgeList:
    """The edges of :func:`ring` as arrays (no networkx graph)."""
    n = _check_n(n, "ring")
    i = np.arange(n, dtype=np.int64)
    u, v = (i, (i + 1) % n) if n > 2 else unique_edges(i, (i + 1) % n, directed=False)
    return EdgeList(n, u, v, attrs={"name": "ring", "layout": "circular"}, connected=True)


def ring(n: int) -> nx.Graph:
    """Cycle 0-1-...-(n-1)-0 (for n = 2 a single edge): the sparsest connected regular graph."""
    return ring_edges(n).to_networkx()


def path_edges(n: int) -> EdgeList:
    """The edges of :func:`path` as arrays."""
    n = _check_n(n, "path")
    i = np.arange(n - 1, dtype=np.int64)
    return EdgeList(n, i, i + 1, attrs={"name": "path", "layout": "circular"}, connected=True)


def path(n: int) -> nx.Graph:
    """Path 0-1-...-(n-1): a ring with one edge cut, the slowest-mixing tree."""
    return path_edges(n).to_networkx()


def torus_edges(n: int, rows: int | None = None) -> EdgeList:
    """The edges of :func:`torus` as arrays (in the order :func:`torus` adds them)."""
    n = _check_n(n, "torus")
    if rows is None and _factor(n)[0] < 2:
        below, above = _nearby_composites(n)
        such_as = f"{below} or {above}" if below < above else f"{above}"
        raise TopologyError(
            f"torus: n={n} is prime, so it cannot be split into rows x cols with rows, cols >= 2; "
            f"use 'grid' (a 1 x {n} path) or 'ring' for this n, or a composite n such as {such_as}"
        )
    rows, cols = _shape(n, rows, "torus", min_side=2)
    i = np.arange(n, dtype=np.int64)
    r, c = np.divmod(i, cols)
    right = r * cols + (c + 1) % cols
    down = ((r + 1) % rows) * cols + c
    u = np.repeat(i, 2)
    v = np.stack([right, down], axis=1).ravel()  # node i's edge to the right, then down
    if min(rows, cols) == 2:  # the wrap-around edge is the direct one
        u, v = unique_edges(u, v, directed=False)
    return EdgeList(n, u, v, attrs={"name": "torus", "shape": (rows, cols)}, connected=True)


def torus(n: int, rows: int | None = None) -> nx.Graph:
    """2-D periodic grid rows x cols (most square by default); node id = row * cols + col.

    With rows or cols equal to 2 the wrap-around edge coincides with the direct one; the result is
    a simple graph (degree 3, or 2 for the 2 x 2 torus, which is a 4-cycle).
    """
    return torus_edges(n, rows).to_networkx()


def grid_edges(n: int, rows: int | None = None) -> EdgeList:
    """The edges of :func:`grid` as arrays (in the order :func:`grid` adds them)."""
    n = _check_n(n, "grid")
    rows, cols = _shape(n, rows, "grid", min_side=1)
    i = np.arange(n, dtype=np.int64)
    r, c = np.divmod(i, cols)
    u = np.repeat(i, 2)
    v = np.stack([i + 1, i + cols], axis=1).ravel()
    keep = np.stack([c + 1 < cols, r + 1 < rows], axis=1).ravel()
    return EdgeList(n, u[keep], v[keep], attrs={"name": "grid", "shape": (rows, cols)},
                    connected=True)


def grid(n: int, rows: int | None = None) -> nx.Graph:
    """2-D non-periodic grid rows x cols (most square by default; 1 x n, a path, for prime n)."""
    return grid_edges(n, rows).to_networkx()


def complete_edges(n: int) -> EdgeList:
    """The edges of :func:`complete` as arrays."""
    n = _check_n(n, "complete")
    u, v = np.triu_indices(n, 1)
    return EdgeList(n, u.astype(np.int64), v.astype(np.int64),
                    attrs={"name": "complete", "layout": "circular"}, connected=True)


def complete(n: int) -> nx.Graph:
    """All pairs connected: with uniform weights W = J, the all-reduce baseline."""
    return complete_edges(n).to_networkx()


def star_edges(n: int) -> EdgeList:
    """The edges of :func:`star` as arrays."""
    n = _check_n(n, "star")
    leaves = np.arange(1, n, dtype=np.int64)
    return EdgeList(n, np.zeros(n - 1, dtype=np.int64), leaves, attrs={"name": "star"},
                    connected=True)


def star(n: int) -> nx.Graph:
    """Node 0 linked to every other node: a parameter-server shape with a bottleneck hub."""
    return star_edges(n).to_networkx()


def hypercube_edges(n: int) -> EdgeList:
    """The edges of :func:`hypercube` as arrays (node-major, then dimension)."""
    n = _check_n(n, "hypercube")
    if n & (n - 1):
        low = 1 << (n.bit_length() - 1)
        raise TopologyError(
            f"hypercube: n={n} is not a power of 2; use n={low} or n={2 * low}, "
            "or 'exponential' which works for any n"
        )
    dims = n.bit_length() - 1
    u = np.repeat(np.arange(n, dtype=np.int64), dims)
    v = u ^ np.tile(1 << np.arange(dims, dtype=np.int64), n)
    keep = u < v
    return EdgeList(n, u[keep], v[keep], attrs={"name": "hypercube"}, connected=True)


def hypercube(n: int) -> nx.Graph:
    """log2(n)-dimensional hypercube: i ~ i xor 2^k; n must be a power of 2."""
    return hypercube_edges(n).to_networkx()


def _tau(n: int) -> int:
    """ceil(log2 n): the number of power-of-two offsets 1, 2, ..., 2^(tau-1) below n."""
    return (n - 1).bit_length()


def _offset_arcs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Arcs i -> (i + 2^k) mod n for k = 0..tau-1, offset-major (as the builders add them)."""
    i = np.arange(n, dtype=np.int64)
    u = np.tile(i, _tau(n))
    v = (u + np.repeat(1 << np.arange(_tau(n), dtype=np.int64), n)) % n
    return u, v


def exponential_edges(n: int) -> EdgeList:
    """The edges of :func:`exponential` as arrays."""
    n = _check_n(n, "exponential")
    u, v = unique_edges(*_offset_arcs(n), directed=False)
    return EdgeList(n, u, v, attrs={"name": "exponential", "layout": "circular"},
                    connected=True)


def exponential(n: int) -> nx.Graph:
    """Symmetric exponential graph: i ~ (i +- 2^k) mod n for 2^k < n (a circulant, so regular)."""
    return exponential_edges(n).to_networkx()


def directed_exponential_edges(n: int) -> EdgeList:
    """The arcs of :func:`directed_exponential` as arrays."""
    n = _check_n(n, "directed_exponential")
    u, v = _offset_arcs(n)
    return EdgeList(n, u, v, directed=True,
                    attrs={"name": "directed-exponential", "layout": "circular"}, connected=True)


def directed_exponential(n: int) -> nx.DiGraph:
    """Directed exponential graph: i -> (i + 2^m) mod n, m = 0..tau-1, tau = ceil(log2 n).

    An arc u -> v means u sends to v, i.e. v mixes u's value (W[v, u] != 0). Every node has
    in- and out-degree tau, so weights 1/(tau+1) make W doubly stochastic (not symmetric).
    """
    return directed_exponential_edges(n).to_networkx()


def directed_random(n: int, p: float = 0.2, seed: int = 0) -> nx.DiGraph:
    """Directed ring i -> i+1 (mod n) plus every other arc u -> v independently with probability p.

    Strongly connected by construction; in- and out-degrees differ from node to node, so only the
    one-way stochastic rules (``push``: column-stochastic, ``pull``: row-stochastic) or explicit
    weights give it a mixing matrix. The test bed of push-sum and push-pull methods.
    """
    n = _check_n(n, "directed_random")
    p = _check_probability(p, "directed_random", allow_zero=True)
    seed = _check_seed(seed, "directed_random")
    graph = nx.DiGraph(name="directed-random", layout="circular")
    graph.add_nodes_from(range(n))
    graph.add_edges_from((i, (i + 1) % n) for i in range(n))
    rng = np.random.default_rng(seed)
    draws = rng.random((n, n))
    graph.add_edges_from((u, v) for u in range(n) for v in range(n)
                         if u != v and v != (u + 1) % n and draws[u, v] < p)
    return graph


# ---------------------------------------------------------------------------------------------
# random graphs (connected by construction or by redrawing)


def _redraw(draw, seed: int, builder: str, hint: str) -> nx.Graph:
    """Call draw(derived_seed) until the graph is connected, at most MAX_TRIES times."""
    for attempt in range(MAX_TRIES):
        graph = draw(_derived_seed(seed, attempt))
        if nx.is_connected(graph):
            graph.graph["draws"] = attempt + 1
            return graph
    raise MixingMatrixError(
        f"{builder}: all {MAX_TRIES} draws (seed={seed}) were disconnected; {hint}"
    )


def _check_regular(n: object, k: object, seed: object) -> tuple[int, int, int]:
    """(n, k, seed) of a random k-regular graph, or TopologyError saying what to change."""
    n = _check_n(n, "random_regular")
    k = _check_int(k, "k", "random_regular")
    seed = _check_seed(seed, "random_regular")
    if not 1 <= k < n:
        raise TopologyError(f"random_regular: degree k must satisfy 1 <= k < n={n}, got k={k}")
    if (n * k) % 2:
        raise TopologyError(
            f"random_regular: n * k must be even, got n={n}, k={k}; change k to {k - 1} or {k + 1}"
        )
    if k == 1 and n > 2:
        raise TopologyError(
            f"random_regular: k=1 gives a perfect matching, which is disconnected for n={n} > 2; "
            "use k >= 3 (k = 2 is a union of cycles, rarely connected for large n)"
        )
    return n, k, seed


REGULAR_VECTOR_MIN_N = 20_000
"""From this n on, random k-regular graphs are drawn by the vectorized pairing of
:func:`_regular_pairing` (networkx's generator, used below it, takes ~5 s at n = 10^5)."""


def _bad_pairs(u: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """Indices of the pairs that are self-loops or repeat an earlier pair (as undirected edges)."""
    key = np.minimum(u, v) * n + np.maximum(u, v)
    ordered = np.sort(key)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]  # values held by two pairs or more
    bad = np.flatnonzero(u == v)
    if repeated.size:
        holders = np.flatnonzero(np.isin(key, repeated))
        _, first = np.unique(key[holders], return_index=True)
        bad = np.union1d(bad, np.delete(holders, first))
    return bad


def _regular_pairing(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Edges of a simple k-regular graph on n nodes by pairing n * k stubs, or None.

    The configuration model pairs the shuffled stubs (k per node); the few pairs that are
    self-loops or repeated edges (about (k^2 - 1) / 4 of them, whatever n) are re-paired with
    twice as many randomly chosen other pairs, reshuffled together, until none is left: a
    switching repair that keeps every degree k. The result is nearly, not exactly, uniform over
    k-regular graphs (rejecting every bad pairing instead would redraw e^((k^2-1)/4) times on
    average, 40 times for k = 4).
    """
    rng = np.random.default_rng(seed)
    stubs = np.repeat(np.arange(n, dtype=np.int64), k)
    rng.shuffle(stubs)
    u, v = stubs[0::2].copy(), stubs[1::2].copy()
    for _ in range(MAX_TRIES):
        bad = _bad_pairs(u, v, n)
        if not bad.size:
            return u, v
        extra = rng.integers(0, u.size, size=2 * bad.size + 4)
        idx = np.union1d(bad, extra)
        pool = np.concatenate([u[idx], v[idx]])
        rng.shuffle(pool)
        u[idx], v[idx] = pool[:idx.size], pool[idx.size:]
    return None


def _connected(n: int, u: np.ndarray, v: np.ndarray) -> bool:
    """True when the undirected graph of edges (u, v) on nodes 0..n-1 is connected."""
    import scipy.sparse as sp

    adjacency = sp.coo_array((np.ones(u.size, dtype=np.int8), (u, v)), shape=(n, n)).tocsr()
    return connected_components(adjacency, directed=False)[0] == 1


def random_regular_edges(n: int, k: int, seed: int = 0) -> EdgeList:
    """The edges of :func:`random_regular` as arrays (drawn without networkx from
    ``REGULAR_VECTOR_MIN_N`` nodes on)."""
    n, k, seed = _check_regular(n, k, seed)
    for attempt in range(MAX_TRIES):
        s = _derived_seed(seed, attempt)
        if n < REGULAR_VECTOR_MIN_N:
            edges = nx.random_regular_graph(k, n, seed=s).edges()
            flat = np.fromiter((x for e in edges for x in e), dtype=np.int64, count=2 * len(edges))
            u, v = flat[0::2], flat[1::2]
        else:
            pairs = _regular_pairing(n, k, s)
            if pairs is None:
                continue
            u, v = pairs
        if _connected(n, u, v):
            return EdgeList(n, u, v, attrs={"name": "random-regular", "k": k, "seed": seed,
                                            "draws": attempt + 1}, connected=True)
    raise MixingMatrixError(
        f"random_regular: all {MAX_TRIES} draws (seed={seed}) were disconnected; "
        "use a larger k (k >= 3 is connected whp)"
    )


def random_regular(n: int, k: int, seed: int = 0) -> nx.Graph:
    """Uniform random connected k-regular graph (n * k must be even; redrawn until connected).

    Below ``REGULAR_VECTOR_MIN_N`` nodes networkx draws it (exactly uniform); from there on a
    vectorized pairing with a switching repair (nearly uniform), :func:`_regular_pairing`.
    """
    return random_regular_edges(n, k, seed).to_networkx()


def erdos_renyi(n: int, p: float, seed: int = 0) -> nx.Graph:
    """Erdos-Renyi G(n, p) conditioned on connectivity (redrawn with derived seeds)."""
    n = _check_n(n, "erdos_renyi")
    p = _check_probability(p, "erdos_renyi")
    seed = _check_seed(seed, "erdos_renyi")

    def draw(s: int) -> nx.Graph:
        graph = _empty(n, "erdos-renyi", p=p, seed=seed)
        graph.add_edges_from(nx.fast_gnp_random_graph(n, p, seed=s).edges())
        return graph

    threshold = math.log(n) / n
    return _redraw(
        draw, seed, "erdos_renyi",
        f"G(n={n}, p={p}) is connected whp only for p well above ln(n)/n = {threshold:.3g}; "
        "increase p",
    )


def geometric(n: int, r: float, seed: int = 0) -> nx.Graph:
    """Random geometric graph in the unit square (radius r), redrawn until connected.

    Node positions are kept as the node attribute "pos".
    """
    n = _check_n(n, "geometric")
    try:
        r = float(r)
    except (TypeError, ValueError):
        raise TopologyError(f"geometric: radius r must be a number > 0, got r={r!r}") from None
    if not r > 0 or not math.isfinite(r):
        raise TopologyError(f"geometric: radius r must be a finite number > 0, got r={r}")
    seed = _check_seed(seed, "geometric")

    def draw(s: int) -> nx.Graph:
        drawn = nx.random_geometric_graph(n, r, seed=s)
        graph = _empty(n, "geometric", r=r, seed=seed)
        graph.add_edges_from(drawn.edges())
        nx.set_node_attributes(graph, {i: tuple(drawn.nodes[i]["pos"]) for i in range(n)}, "pos")
        return graph

    threshold = math.sqrt(math.log(n) / (math.pi * n))
    return _redraw(
        draw, seed, "geometric",
        f"in the unit square connectivity needs r well above sqrt(ln n / (pi n)) = "
        f"{threshold:.3g} for n={n}; increase r",
    )


def watts_strogatz(n: int, k: int = 4, p: float = 0.3, seed: int = 0) -> nx.Graph:
    """Connected Watts-Strogatz small world: ring lattice (k/2 per side), edges rewired w.p. p."""
    n = _check_n(n, "watts_strogatz", minimum=3)
    k = _check_int(k, "k", "watts_strogatz")
    p = _check_probability(p, "watts_strogatz", allow_zero=True)
    seed = _check_seed(seed, "watts_strogatz")
    if not 2 <= k < n:
        raise TopologyError(f"watts_strogatz: k must satisfy 2 <= k < n={n}, got k={k}")
    if k % 2:
        raise TopologyError(
            f"watts_strogatz: k must be even (k/2 neighbours on each side of the ring), got k={k}; "
            f"networkx would silently use k={k - 1}"
        )
    graph = _empty(n, "watts-strogatz", k=k, p=p, seed=seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            drawn = nx.connected_watts_strogatz_graph(
                n, k, p, tries=MAX_TRIES, seed=_derived_seed(seed, 0)
            )
    except nx.NetworkXError as exc:
        raise MixingMatrixError(
            f"watts_strogatz: no connected graph in {MAX_TRIES} draws (n={n}, k={k}, p={p}, "
            f"seed={seed}): {exc}; lower p or raise k"
        ) from None
    graph.add_edges_from(drawn.edges())
    return graph
