"""The label of a user part named on the command line (``module:Name`` or
``path/to/file.py:Name``) in tables, plots and log records.

Scripts accept such a spec wherever they accept a registry name (``--algorithm``,
``--compressor``, ``--problem``, ``--topology``); the registries load it
(:class:`topologies.registry.Registry`, the one parser and loader of plug-in specs).
"""

from __future__ import annotations

from gossip.errors import PluginError
from topologies.registry import import_target, parse_target

__all__ = ["short_label"]


def short_label(spec: str) -> str:
    """The label of a part in tables, plots and log records: ``spec`` itself for a registered
    name (``topk:0.1``); for a plug-in spec (``path/to/my_parts.py:StochasticInt8:PARAMS`` or
    ``module:Class``), the name the class is registered under (``int8``, ``local-gossip``),
    else its own name, followed by the spec's parameters. A path says where the code is, not
    what the run was; the config record keeps the spec as given."""
    target = parse_target(spec) if isinstance(spec, str) else None
    if target is None:
        return spec
    try:
        obj = import_target(target, error=PluginError)
    except PluginError:
        return spec  # the run refuses it with the reason; a label is no place for that
    name = _registered_name(obj) or target.attr.rsplit(".", 1)[-1]
    return ":".join((name, *target.params))


def _registered_name(obj: object) -> str | None:
    """The name ``obj`` is registered under as a compressor or an algorithm (None if neither)."""
    from gossip.algorithms import REGISTRY
    from gossip.compress import COMPRESSORS

    for registry in (COMPRESSORS.objects, REGISTRY):
        for name, value in registry.items():
            if value is obj:
                return name
    return None
