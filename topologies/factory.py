"""`build`: the single entry point from a spec string to a Topology or TimeVaryingTopology."""

from __future__ import annotations

import logging

from .errors import SpecError
from .io import load_function, takes_round
from .mixing import normalize_rule
from .spec import TIME_VARYING, canonical_name, convert, is_callable_spec, parse, parse_edges, split
from .spectral import TIME_BUDGET
from .timevarying import from_function
from .topology import TimeVaryingTopology, Topology

__all__ = ["build"]

logger = logging.getLogger(__name__)


def build(
    spec: str,
    n: int | None,
    weights: str = "metropolis",
    lazy: bool = False,
    seed: int = 0,
    time_budget: float | None = TIME_BUDGET,
) -> Topology | TimeVaryingTopology:
    """Topology for a spec: everything `parse` accepts (a static graph), the time-varying
    names (one-peer-exponential, matchings, alternating-ring, alternating-exp-ring) and a
    time-varying ``module:function`` ``f(n, t)``.

    Named graphs with an array builder (ring, torus, random regular, ...) skip networkx
    (``Topology.graph`` makes it on first use).  ``time_budget``: seconds a static
    topology's spectrum may take when it has no closed form (None: no limit), see
    :attr:`Topology.spectrum`."""
    rule = normalize_rule(weights)
    if isinstance(spec, str) and canonical_name(spec) in TIME_VARYING:
        name, params = split(spec)
        entry = TIME_VARYING[name]
        kwargs = convert(entry, params, spec)
        if entry.random:
            kwargs.setdefault("seed", seed)
        if n is None:
            raise SpecError(f"{spec!r}: the number of nodes n is required (--nodes N)")
        return entry.build(n, **kwargs, weights=rule, lazy=lazy)
    if isinstance(spec, str) and is_callable_spec(spec.strip()) and takes_round(load_function(spec.strip())):
        if n is None:
            raise SpecError(f"{spec!r}: the number of nodes n is required (--nodes N)")
        return from_function(spec.strip(), n, seed, weights=rule, lazy=lazy)
    edges = parse_edges(spec, n, seed=seed)  # the builders' graphs, without networkx
    if edges is not None:
        return Topology(edges, rule=rule, lazy=lazy, name=spec.strip(), time_budget=time_budget)
    graph = parse(spec, n, seed=seed)
    if rule != "weights" and any("weight" in d for _, _, d in graph.edges(data=True)):
        logger.warning(
            "%s: the graph has 'weight' edge attributes but weights=%r ignores them; pass "
            "weights='weights' to use them as mixing weights", spec, rule,
        )
    return Topology(graph, rule=rule, lazy=lazy, name=spec.strip(), time_budget=time_budget)
