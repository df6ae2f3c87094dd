"""Load graphs from files or from user functions, relabeled to nodes 0..n-1.

Formats (chosen by suffix): edge lists (`.edgelist`, `.txt`, `.csv`, `.tsv` or no suffix: "u v [w]"
per line, '#' starts a comment, a line with a single label adds an isolated node, a header line
such as "source,target,weight" is skipped; a label is an id, an integer 0..2^63-1, or a name, a
letter or '_' then letters, digits and `_ . - : @ /`, at most 200 characters: any other token is
an error naming its line), GraphML (`.graphml`), GML (`.gml`) and node-link
JSON (`.json`, with "edges" or "links").  Node labels of any kind are relabeled to 0..n-1 in a
deterministic order: numerically when every label is an integer (or an integer written as a
string), else sorted, else sorted by str.  The mapping new id -> original label is kept in
`graph.graph["labels"]`.  A `weight` edge attribute (explicit mixing weight) is kept as float.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import networkx as nx
import numpy as np

from .errors import GraphFileError, SpecError
from .registry import import_target

__all__ = ["load", "load_callable", "load_function", "takes_round", "call_graph", "relabel",
           "EDGELIST_SUFFIXES", "GRAPH_SUFFIXES"]

logger = logging.getLogger(__name__)

EDGELIST_SUFFIXES = (".edgelist", ".txt", ".csv", ".tsv")
GRAPH_SUFFIXES = EDGELIST_SUFFIXES + (".graphml", ".gml", ".json")

MAX_EDGELIST_BYTES = 64 << 20
"""An edge list larger than this is refused unread (about 4·10^6 edges, a minute and GBs of
networkx objects to load)."""

_INT = re.compile(r"[+-]?\d+")
_ID = re.compile(r"\d+")
_NAME = re.compile(r"[^\W\d][\w.:@/-]*")
MAX_ID = 2**63 - 1
"""The largest integer node id an edge list may use (an int64: what the fast reader holds)."""
MAX_NAME_CHARS = 200
"""The longest name label of an edge list."""
_HEADER_WORDS = {"source", "target", "src", "dst", "from", "to", "u", "v", "node1", "node2",
                 "weight", "w"}


# ---------------------------------------------------------------------------------------------
# relabeling


def _ordered(labels: Iterable[object]) -> list[object]:
    """Labels in a deterministic order: numeric if all are integers, else sorted, else by str."""
    labels = list(labels)
    if all(isinstance(x, str) and _INT.fullmatch(x) for x in labels):
        return sorted(labels, key=lambda x: (int(x), x))
    try:
        return sorted(labels)
    except TypeError:
        return sorted(labels, key=lambda x: (str(x), type(x).__name__))


def relabel(graph: nx.Graph, source: str | None = None) -> nx.Graph:
    """Copy of graph with nodes 0..n-1 (deterministic order); graph.graph["labels"] maps back.
    A graph a reader relabeled already (nodes 0..n-1 in order, its "labels" set) is returned."""
    labels = graph.graph.get("labels")
    if isinstance(labels, dict) and len(labels) == graph.number_of_nodes() and all(
            a == b for a, b in zip(graph.nodes, range(len(labels)))):
        if any(label != i for i, label in labels.items()):
            logger.info("relabeled %d nodes%s to 0..%d (mapping in graph.graph['labels'])",
                        len(labels), f" of {source}" if source else "", len(labels) - 1)
        return graph
    order = _ordered(graph.nodes)
    index = {label: i for i, label in enumerate(order)}
    out = graph.__class__()
    out.graph.update(graph.graph)
    out.add_nodes_from((i, dict(graph.nodes[label])) for i, label in enumerate(order))
    out.add_edges_from((index[u], index[v], dict(d)) for u, v, d in graph.edges(data=True))
    out.graph["labels"] = dict(enumerate(order))
    if any(label != i for i, label in enumerate(order)):
        preview = ", ".join(f"{i}<-{label!r}" for i, label in list(enumerate(order))[:8])
        more = ", ..." if len(order) > 8 else ""
        logger.info(
            "relabeled %d nodes%s to 0..%d: %s%s (mapping in graph.graph['labels'])",
            len(order), f" of {source}" if source else "", len(order) - 1, preview, more,
        )
    return out


# ---------------------------------------------------------------------------------------------
# checks shared by files and callables


def _clean(graph: nx.Graph, source: str) -> nx.Graph:
    """Reject empty graphs, parallel edges and self-loops; make `weight` attributes floats."""
    if graph.is_multigraph():
        seen: set[tuple[object, object]] = set()
        for u, v in graph.edges():
            key = (u, v) if graph.is_directed() else frozenset((u, v))
            if key in seen:
                raise GraphFileError(
                    f"{source}: parallel edges between {u!r} and {v!r}; keep one edge per pair "
                    "(put the combined mixing weight on it)"
                )
            seen.add(key)
        graph = nx.DiGraph(graph) if graph.is_directed() else nx.Graph(graph)
    if graph.number_of_nodes() == 0:
        raise GraphFileError(f"{source}: the graph is empty (no nodes); check the file contents")
    if graph.number_of_edges() == 0:
        raise GraphFileError(
            f"{source}: the graph has {graph.number_of_nodes()} nodes but no edges; "
            "nodes could never communicate"
        )
    for u, _ in nx.selfloop_edges(graph):
        raise GraphFileError(
            f"{source}: self-loop on node {u!r}; remove it: a node's own weight comes from the "
            "weight rule (or is 1 - the sum of its explicit edge weights)"
        )
    for u, v, data in graph.edges(data=True):
        if "weight" in data:
            try:
                weight = float(data["weight"])
            except (TypeError, ValueError):
                raise GraphFileError(
                    f"{source}: weight {data['weight']!r} of edge ({u!r}, {v!r}) is not a number"
                ) from None
            if not math.isfinite(weight):
                raise GraphFileError(
                    f"{source}: weight {weight} of edge ({u!r}, {v!r}) is not finite"
                )
            data["weight"] = weight
    return graph


# ---------------------------------------------------------------------------------------------
# readers


def _integer_pairs(text: str) -> nx.Graph | None:
    """The common file at speed: every line "u v", two integers, no comment, header or weight;
    None otherwise (the line-by-line parser then reads it, with its line-numbered errors)."""
    if "#" in text or "," in text or "-" in text or "+" in text:
        return None  # comments, commas, signs: the general parser reads (or names) them
    try:
        ids = np.array(text.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        return None
    lines = text.splitlines()
    if ids.size != 2 * (len(lines) - lines.count("")) or ids.size == 0:
        return None  # a line with one label or a weight, or blank lines with spaces
    if (ids[0::2] == ids[1::2]).any():
        return None  # a self-loop: named with its line number by the general parser
    labels, new = np.unique(ids, return_inverse=True)  # numeric order, as relabel() sorts them
    graph = nx.Graph()
    graph.add_nodes_from(range(labels.size))
    graph.add_edges_from(zip(new[0::2].tolist(), new[1::2].tolist()))
    graph.graph["labels"] = dict(enumerate(labels.tolist()))  # relabeled already
    return graph


def _read_edgelist(path: Path) -> nx.Graph:
    """Parse "u v [weight]" lines ('#' comments, optional header, commas or whitespace)."""
    size = path.stat().st_size
    if size > MAX_EDGELIST_BYTES:
        raise GraphFileError(
            f"{path}: {size / 2**20:.0f} MiB, more than the {MAX_EDGELIST_BYTES >> 20} MiB an edge "
            "list may have (its graph would take several GB as networkx objects): build graphs "
            "this large from a spec or a module:function (docs/topologies.md)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GraphFileError(f"{path}: not a UTF-8 text edge list ({exc})") from None
    fast = _integer_pairs(text)
    if fast is not None:
        return fast
    rows: list[tuple[int, list[str]]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f for f in re.split(r"[,\s]+", line) if f]
        if not rows and {f.lower() for f in fields} & _HEADER_WORDS:
            continue  # header line such as "source,target,weight"
        if len(fields) > 3:
            raise GraphFileError(
                f"{path}:{lineno}: expected 'u v [weight]', got {len(fields)} fields: "
                f"{raw.strip()!r}"
            )
        for token in fields[:2]:
            problem = _label_problem(token)
            if problem:
                raise GraphFileError(f"{path}:{lineno}: {problem}; fix the line")
        rows.append((lineno, fields))
    tokens = [f for _, fields in rows for f in fields[:2]]
    numeric = all(_INT.fullmatch(t) for t in tokens)

    def label(token: str) -> object:
        return int(token) if numeric else token

    graph = nx.Graph()
    for lineno, fields in rows:
        if len(fields) == 1:
            graph.add_node(label(fields[0]))
            continue
        u, v = label(fields[0]), label(fields[1])
        if u == v:
            raise GraphFileError(
                f"{path}:{lineno}: self-loop on node {u!r}; remove the line: a node's own weight "
                "comes from the weight rule (or is 1 - the sum of its explicit edge weights)"
            )
        attrs = {}
        if len(fields) == 3:
            try:
                attrs["weight"] = float(fields[2])
            except ValueError:
                raise GraphFileError(
                    f"{path}:{lineno}: weight {fields[2]!r} of edge ({u!r}, {v!r}) is not a number"
                ) from None
        if graph.has_edge(u, v) and graph.edges[u, v].get("weight") != attrs.get("weight"):
            raise GraphFileError(
                f"{path}:{lineno}: edge ({u!r}, {v!r}) is listed twice with different weights "
                f"({graph.edges[u, v].get('weight')} and {attrs.get('weight')}); keep one line"
            )
        graph.add_edge(u, v, **attrs)
    return graph


def _label_problem(token: str) -> str | None:
    """What is wrong with an edge list's node label (None: an id or a name, see the module doc)."""
    if _ID.fullmatch(token):
        if len(token) > len(str(MAX_ID)) or int(token) > MAX_ID:
            return (f"node id {token[:30]}{'...' if len(token) > 30 else ''} ({len(token)} digits) "
                    f"is past the largest id, {MAX_ID} (2^63 - 1): number the nodes from 0")
        return None
    if _INT.fullmatch(token):
        return f"node id {token[:30]!r} is signed; ids are integers >= 0 (e.g. 0, 1, 2)"
    if _NAME.fullmatch(token):
        if len(token) > MAX_NAME_CHARS:
            return (f"node name {token[:30]!r}... has {len(token)} characters, more than the "
                    f"{MAX_NAME_CHARS} a name may have")
        return None
    return (f"node label {token[:30]!r} is neither an id (an integer >= 0) nor a name (a letter "
            "or '_' then letters, digits and _ . - : @ /)")


def _read_gml(path: Path) -> nx.Graph:
    """GML with node names from 'label' (falling back to 'id' when labels are missing)."""
    try:
        return nx.read_gml(path, label="label")
    except nx.NetworkXError:
        return nx.read_gml(path, label="id")


def _read_json(path: Path) -> nx.Graph:
    """Node-link JSON (networkx.node_link_data), with edges under "edges" or "links"."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "nodes" not in data:
        raise GraphFileError(
            f"{path}: expected node-link JSON, an object with 'nodes' and 'edges' (or 'links') "
            "as written by networkx.node_link_data"
        )
    key = "links" if "links" in data and "edges" not in data else "edges"
    data.setdefault(key, [])
    return nx.node_link_graph(
        data, directed=bool(data.get("directed", False)),
        multigraph=bool(data.get("multigraph", False)), edges=key,
    )


_READERS = {
    **{suffix: _read_edgelist for suffix in EDGELIST_SUFFIXES},
    ".graphml": nx.read_graphml,
    ".gml": _read_gml,
    ".json": _read_json,
}
_FORMAT_NAMES = {".graphml": "GraphML", ".gml": "GML", ".json": "node-link JSON"}


def load(path: str | os.PathLike[str]) -> nx.Graph:
    """Read a graph file (format from its suffix) and relabel its nodes to 0..n-1."""
    path = Path(path)
    if not path.exists():
        raise GraphFileError(
            f"graph file {str(path)!r} does not exist (working directory {os.getcwd()!r}); "
            "check the path"
        )
    if not path.is_file():
        raise GraphFileError(f"{str(path)!r} is not a file; give a graph file")
    suffix = path.suffix.lower()
    reader = _read_edgelist if suffix == "" else _READERS.get(suffix)
    if reader is None:
        raise GraphFileError(
            f"{path}: unknown graph file suffix {suffix!r}; supported: {', '.join(GRAPH_SUFFIXES)}"
        )
    fmt = _FORMAT_NAMES.get(suffix, "edge list")
    try:
        graph = reader(path)
    except GraphFileError:
        raise
    except Exception as exc:  # parsers raise many types (ParseError, KeyError, JSONDecodeError)
        raise GraphFileError(
            f"{path}: could not parse as {fmt}: {type(exc).__name__}: {exc}"
        ) from exc
    graph = _clean(graph, str(path))
    graph.graph.setdefault("name", path.stem)
    graph.graph["source"] = str(path)
    return relabel(graph, source=str(path))


# ---------------------------------------------------------------------------------------------
# user callables


def load_function(target: str) -> Callable[..., nx.Graph]:
    """The function ``module:function`` (or ``path/to/file.py:function``) names."""
    fn = import_target(target, error=SpecError, form="module:function")
    if not callable(fn):
        raise SpecError(f"{target!r}: {target.rpartition(':')[2]!r} is not callable ({type(fn).__name__})")
    return fn


def _positional(fn: object) -> list[inspect.Parameter] | None:
    """fn's positional parameters (None when its signature cannot be read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD)]


def _accepts_seed(fn: object) -> bool:
    """True when fn can be called with a `seed` keyword."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "seed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def takes_round(fn: object) -> bool:
    """True when fn is time-varying, ``f(n, t)``: a positional parameter after n other than
    ``seed`` (``f(n)`` and ``f(n, seed=0)`` are static)."""
    params = _positional(fn)
    return params is not None and any(p.name != "seed" for p in params[1:])


def call_graph(fn: Callable[..., nx.Graph], target: str, n: int, seed: int | None = None,
               t: int | None = None) -> nx.Graph:
    """``fn(n)``, or ``fn(n, t)`` for round t, with ``seed=`` if it takes one; the graph
    checked (a networkx graph of n nodes), cleaned and relabeled to 0..n-1."""
    args = (n,) if t is None else (n, t)
    graph = fn(*args, seed=seed) if seed is not None and _accepts_seed(fn) else fn(*args)
    where = target if t is None else f"{target} (round t={t})"
    if not isinstance(graph, nx.Graph):
        raise GraphFileError(f"{where} returned {type(graph).__name__}, expected a networkx Graph "
                             "or DiGraph")
    graph = graph.copy()  # _clean converts weights in place: leave the caller's graph alone
    if graph.number_of_nodes() != n:
        raise GraphFileError(f"{where} returned a graph with {graph.number_of_nodes()} nodes, but "
                             f"n={n} was requested; the function must build exactly n nodes")
    graph = _clean(graph, where)
    graph.graph.setdefault("name", target)
    graph.graph["source"] = target
    return relabel(graph, source=where)


def load_callable(target: str, n: int, seed: int | None = None) -> nx.Graph:
    """Import "module:function", call it with n (and seed= if it takes one), check and relabel.
    A time-varying function ``f(n, t)`` is refused: :func:`topologies.build` makes its schedule."""
    fn = load_function(target)
    if takes_round(fn):
        raise SpecError(f"{target!r} is time-varying (it takes a round t after n); use "
                        f"topologies.build({target!r}, n) to get a TimeVaryingTopology")
    return call_graph(fn, target, n, seed)
