"""The one parser of topology spec strings used by every script.

A spec is ``NAME`` or ``NAME:key=value,key=value`` (for example ``torus:rows=4``,
``watts-strogatz:k=4,p=0.3``), a graph file path (anything containing '/', ending in a known
suffix, or naming an existing file) or ``module:function`` (also ``path/to/file.py:function``):
``f(n)`` returns a networkx graph, ``f(n, t)`` (a second positional parameter other than
``seed``) the graph of round t of a time-varying topology.  Names are case-insensitive and '_' may
replace '-'.  Random graphs take their seed from the `seed` argument unless the spec sets
``seed=S``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import SpecError
from .registry import Registry, parse_target

if TYPE_CHECKING:
    import networkx as nx

    from .edgelist import EdgeList

# networkx, the builders and the graph-file readers (.io) are imported when a graph is built or
# a file spec checked, not with this module: a script's --help lists the specs without them.

__all__ = [
    "parse", "parse_edges", "split", "convert", "canonical_name", "is_file_spec", "is_callable_spec",
    "spec_help", "STATIC", "TIME_VARYING",
]


_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """One spec parameter: its name, type, meaning and default (_REQUIRED when it must be set)."""

    name: str
    type: type
    help: str
    default: object = _REQUIRED

    @property
    def required(self) -> bool:
        """True when the spec must set this parameter."""
        return self.default is _REQUIRED

    def shown(self) -> str:
        """'k=4' for a default, 'p=P' for a required or computed value."""
        value = self.name.upper() if self.default in (_REQUIRED, None) else self.default
        return f"{self.name}={value}"


@dataclass(frozen=True)
class Entry:
    """A named topology: its builder (the name of a function of ``topologies.<module>``:
    :mod:`~topologies.builders` for a static graph, :mod:`~topologies.timevarying` for a
    schedule), parameters, and whether it is random (takes a seed)."""

    name: str
    builder: str
    params: tuple[Param, ...] = ()
    random: bool = False
    help: str = ""
    module: str = "builders"

    def __post_init__(self) -> None:
        if not (isinstance(self.builder, str) and self.builder.isidentifier()):
            raise SpecError(f"topology {self.name!r} has no builder ({self.builder!r}): give the "
                            f"name of its function in topologies.{self.module}")

    @property
    def build(self) -> Callable[..., Any]:
        """The builder function (imports its module, hence networkx)."""
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.builder)

    def usage(self) -> str:
        """e.g. 'watts-strogatz[:k=4,p=0.3]' or 'erdos-renyi:p=P'."""
        shown = [p for p in self.params if p.name != "seed"]
        if not shown:
            return self.name
        parts = ",".join(p.shown() for p in shown)
        optional = all(not p.required for p in shown)
        return f"{self.name}[:{parts}]" if optional else f"{self.name}:{parts}"


_SEED = Param("seed", int, "random seed (default: the seed argument)", None)
_ROWS = Param("rows", int, "number of rows (default: most square factorization of n)", None)


def _registry(kind: str, entries: list[Entry]) -> Registry[Entry]:
    """Entries by canonical name (lookups accept aliases, any case, '_' for '-')."""
    registry: Registry[Entry] = Registry(kind, error=SpecError, normalize=lambda n: _canonical(n),  # defined below
                                         form="module:function")
    for entry in entries:
        registry.register(entry.name, entry)
    return registry


STATIC = _registry("topology", [
    Entry("ring", "ring", help="cycle"),
    Entry("path", "path", help="path (ring minus one edge)"),
    Entry("torus", "torus", (_ROWS,), help="2-D periodic grid"),
    Entry("grid", "grid", (_ROWS,), help="2-D grid"),
    Entry("complete", "complete", help="all pairs"),
    Entry("star", "star", help="node 0 linked to all"),
    Entry("hypercube", "hypercube", help="n a power of 2"),
    Entry("exponential", "exponential", help="i ~ i +- 2^k"),
    Entry("directed-exponential", "directed_exponential", help="i -> i + 2^m"),
    Entry("directed-random", "directed_random",
          (Param("p", float, "probability of each extra arc in [0, 1]", 0.2), _SEED), True,
          "directed ring + random arcs (use --weights push or pull)"),
    Entry("erdos-renyi", "erdos_renyi",
          (Param("p", float, "edge probability in (0, 1]"), _SEED), True, "G(n, p), connected"),
    Entry("regular", "random_regular",
          (Param("k", int, "degree, 1 <= k < n"), _SEED), True, "random k-regular, connected"),
    Entry("geometric", "geometric",
          (Param("r", float, "connection radius in the unit square"), _SEED), True,
          "random geometric, connected"),
    Entry("watts-strogatz", "watts_strogatz",
          (Param("k", int, "even ring-lattice degree", 4), Param("p", float, "rewiring "
           "probability in [0, 1]", 0.3), _SEED), True, "small world, connected"),
])
"""The static topologies' builders (a :class:`~topologies.registry.Registry` of Entry)."""

TIME_VARYING = _registry("time-varying topology", [
    Entry("one-peer-exponential", "one_peer_exponential", help="time-varying: one peer 2^m away "
          "per round", module="timevarying"),
    Entry("matchings", "random_matchings", (_SEED,), True,
          "time-varying: random perfect matching per round", module="timevarying"),
    Entry("alternating-ring", "alternating_ring", help="time-varying: one ring neighbor per "
          "round, right then left", module="timevarying"),
    Entry("alternating-exp-ring", "alternating_exp_ring", help="time-varying: Decent-DP's "
          "i ~ i + 2^m, half the pairs per round (n a power of 2)", module="timevarying"),
])
"""The time-varying topologies' builders (functions of :mod:`topologies.timevarying` taking n,
their spec's parameters and ``weights=``, ``lazy=``; each returns a TimeVaryingTopology)."""

_ALIASES = {
    "cycle": "ring",
    "random-regular": "regular",
    "er": "erdos-renyi",
    "gnp": "erdos-renyi",
    "ws": "watts-strogatz",
    "small-world": "watts-strogatz",
    "exp": "exponential",
    "directed-exp": "directed-exponential",
    "one-peer": "one-peer-exponential",
    "one-peer-exp": "one-peer-exponential",
    "random-matchings": "matchings",
    "matching": "matchings",
    "one-peer-ring": "alternating-ring",
    "alternating-exponential-ring": "alternating-exp-ring",
}

def spec_help() -> str:
    """Multi-line list of every valid spec form (used in error messages and --help)."""
    from .io import GRAPH_SUFFIXES

    lines = [f"  {e.usage():<28} {e.help}" for e in (*STATIC.values(), *TIME_VARYING.values())]
    lines.append(f"  {'PATH':<28} graph file ({' '.join(GRAPH_SUFFIXES)})")
    lines.append(f"  {'module:function':<28} f(n) returning a networkx graph, or f(n, t) the graph")
    lines.append(f"  {'':<28} of round t = 1, 2, ... (time-varying); also path/to/file.py:f")
    return "\n".join(lines)


def canonical_name(spec: str) -> str:
    """The canonical topology name of a spec ('Erdos_Renyi:p=0.3' -> 'erdos-renyi')."""
    return _canonical(spec.partition(":")[0])


def _canonical(name: str) -> str:
    """Lower-case, '-' for '_', aliases resolved."""
    key = name.strip().lower().replace("_", "-")
    return _ALIASES.get(key, key)


def is_file_spec(spec: str) -> bool:
    """True when spec names a graph file (contains '/', has a graph suffix, or exists)."""
    target = parse_target(spec)
    if target is not None and not target.params and target.module.endswith(".py"):
        return False
    from .io import GRAPH_SUFFIXES

    return ("/" in spec or os.sep in spec or spec.lower().endswith(GRAPH_SUFFIXES)
            or os.path.isfile(spec))


def is_callable_spec(spec: str) -> bool:
    """True when spec looks like module:function (and the part before ':' is no topology name)."""
    target, head = parse_target(spec), spec.split(":", 1)[0]
    return target is not None and not target.params and head not in STATIC and head not in TIME_VARYING


def split(spec: str) -> tuple[str, dict[str, str]]:
    """('torus', {'rows': '4'}) from 'torus:rows=4' (name canonical, values still strings)."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty topology spec {spec!r}; valid specs:\n{spec_help()}")
    head, _, tail = spec.strip().partition(":")
    name = _canonical(head)
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in tail.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not key or not value:
            raise SpecError(
                f"{spec!r}: parameter {item!r} is not of the form key=value "
                "(e.g. 'erdos-renyi:p=0.3', 'watts-strogatz:k=4,p=0.3')"
            )
        if key in params:
            raise SpecError(f"{spec!r}: parameter {key!r} is given twice")
        params[key] = value
    return name, params


def convert(entry: Entry, params: dict[str, str], spec: str) -> dict[str, object]:
    """Typed keyword arguments for entry from string params; errors name the parameter."""
    known = {p.name: p for p in entry.params}
    out: dict[str, object] = {}
    for key, value in params.items():
        param = known.get(key)
        if param is None:
            valid = ", ".join(known) if known else "none"
            raise SpecError(
                f"{spec!r}: unknown parameter {key!r} for {entry.name!r}; valid: {valid}"
            )
        try:
            out[key] = param.type(value)
        except ValueError:
            kind = "an integer" if param.type is int else "a number"
            raise SpecError(
                f"{spec!r}: parameter {key!r} must be {kind} ({param.help}), got {value!r}"
            ) from None
    for param in entry.params:
        if param.required and param.name not in out:
            raise SpecError(
                f"{spec!r}: {entry.name!r} needs parameter {param.name!r} ({param.help}), "
                f"e.g. '{entry.usage()}'"
            )
    return out


def parse_edges(spec: str, n: int | None, seed: int = 0) -> EdgeList | None:
    """The :class:`~topologies.edgelist.EdgeList` of a named static topology whose builder has
    an array form (``<builder>_edges``: ring, torus, random regular, ...), else None.

    The same graph as :func:`parse` gives (``parse_edges(...).to_networkx()``), with the same
    errors, without building a networkx graph (seconds and gigabytes at 10^6 nodes).
    """
    if not isinstance(spec, str) or not spec.strip():
        return None
    spec = spec.strip()
    entry = STATIC.objects.get(_canonical(spec.partition(":")[0]))
    if entry is None:
        return None
    import importlib

    fast = getattr(importlib.import_module(f"{__package__}.{entry.module}"), f"{entry.builder}_edges",
                   None)
    if fast is None:
        return None
    kwargs = convert(entry, split(spec)[1], spec)
    if entry.random:
        kwargs.setdefault("seed", seed)
    if n is None:
        raise SpecError(f"{spec!r}: the number of nodes n is required (--nodes N)")
    edges = fast(n, **kwargs)
    edges.attrs["spec"] = spec
    return edges


def parse(spec: str, n: int | None, seed: int = 0) -> nx.Graph:
    """The networkx graph (nodes 0..n-1) that a spec string describes, for n nodes.

    For a graph file, n may be None (take the file's size); otherwise the file must have n nodes.
    """
    from .io import load, load_callable

    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty topology spec {spec!r}; valid specs:\n{spec_help()}")
    spec = spec.strip()
    name = _canonical(spec.partition(":")[0])
    if name in TIME_VARYING:
        raise SpecError(
            f"{spec!r} is time-varying (a graph per round); use topologies.build({spec!r}, n) "
            "to get a TimeVaryingTopology"
        )
    if name in STATIC:
        entry = STATIC[name]
        kwargs = convert(entry, split(spec)[1], spec)
        if entry.random:
            kwargs.setdefault("seed", seed)
        if n is None:
            raise SpecError(f"{spec!r}: the number of nodes n is required (--nodes N)")
        graph = entry.build(n, **kwargs)
        graph.graph["spec"] = spec
        return graph
    if is_callable_spec(spec):
        if n is None:
            raise SpecError(f"{spec!r}: the number of nodes n is required (--nodes N)")
        return load_callable(spec, n, seed=seed)
    if is_file_spec(spec):
        graph = load(spec)
        if n is not None and graph.number_of_nodes() != n:
            raise SpecError(
                f"{spec!r} has {graph.number_of_nodes()} nodes but n={n} was requested; pass "
                f"--nodes {graph.number_of_nodes()} (or run with that many processes)"
            )
        return graph
    close = difflib.get_close_matches(name, [*STATIC, *TIME_VARYING, *_ALIASES], n=1)
    hint = f" (did you mean {_canonical(close[0])!r}?)" if close else ""
    raise SpecError(f"unknown topology {spec!r}{hint}; valid specs:\n{spec_help()}")
