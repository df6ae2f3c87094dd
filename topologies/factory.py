"""`build`: the single entry point from a spec string to a Topology or TimeVaryingTopology."""

from __future__ import annotations

import logging

from .errors import SpecError
from .mixing import normalize_rule
from .spec import TIME_VARYING, canonical_name, convert, parse, split
from .timevarying import one_peer_exponential, random_matchings
from .topology import TimeVaryingTopology, Topology

__all__ = ["build"]

logger = logging.getLogger(__name__)


def build(
    spec: str,
    n: int | None,
    weights: str = "metropolis",
    lazy: bool = False,
    seed: int = 0,
) -> Topology | TimeVaryingTopology:
    """Topology for a spec (everything `parse` accepts, plus one-peer-exponential and matchings)."""
    rule = normalize_rule(weights)
    if isinstance(spec, str) and canonical_name(spec) in TIME_VARYING:
        name, params = split(spec)
        kwargs = convert(TIME_VARYING[name], params, spec)
        if n is None:
            raise SpecError(f"{spec!r}: the number of nodes n is required (--nodes N)")
        if name == "matchings":
            return random_matchings(n, kwargs.get("seed", seed), weights=rule, lazy=lazy)
        return one_peer_exponential(n, weights=rule, lazy=lazy)
    graph = parse(spec, n, seed=seed)
    if rule != "weights" and any("weight" in d for _, _, d in graph.edges(data=True)):
        logger.warning(
            "%s: the graph has 'weight' edge attributes but weights=%r ignores them; pass "
            "weights='weights' to use them as mixing weights", spec, rule,
        )
    return Topology(graph, rule=rule, lazy=lazy, name=spec.strip())
