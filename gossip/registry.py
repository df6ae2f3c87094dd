"""The registries of algorithms, compressors and problems: :class:`topologies.registry.Registry`.

One type for every named part (``gossip.algorithms.ALGORITHMS``, ``gossip.compress.COMPRESSORS``,
``gossip.problems.factory.BUILDERS``, topologies' ``STATIC`` / ``TIME_VARYING``), with one
``module:Name[:PARAMS]`` / ``path/to/file.py:Name`` parser and loader. It lives in
``topologies`` because that package is standalone (imports nothing from gossip) and gossip
already depends on it; :func:`registry` gives gossip's registries their plug-in error,
:class:`~gossip.plugins.PluginError`.
"""

from __future__ import annotations

from typing import Any

from gossip.plugins import PluginError
from topologies.registry import Registry, Resolved, Target, import_target, parse_target

__all__ = ["PluginError", "Registry", "Resolved", "Target", "import_target", "parse_target", "registry"]


def registry(kind: str, *, error: type[Exception], **options: Any) -> Registry:
    """A :class:`Registry` of ``kind`` raising ``error`` for its own errors and
    :class:`PluginError` for a plug-in spec that cannot be imported."""
    return Registry(kind, error=error, plugin_error=PluginError, **options)
