"""User parts named on the command line: ``module:Name`` or ``path/to/file.py:Name``.

Scripts accept such a spec wherever they accept a registry name (``--algorithm``,
``--compressor``, ``--problem``, as ``--topology`` does), so a user's own class runs without
editing the package. Importing the module also runs any ``register_*`` calls it makes.
Specs are parsed and imported by :mod:`topologies.registry` (one parser for every registry,
see :mod:`gossip.registry`); this module keeps gossip's error class and the older helpers.
"""

from __future__ import annotations

from gossip.errors import PluginError
from topologies.registry import import_target, parse_target

__all__ = ["PluginError", "import_object", "looks_like_target"]


def looks_like_target(spec: str) -> bool:
    """True when ``spec`` reads as ``module:Name[:PARAMS]`` (callers first try their registry)."""
    return parse_target(spec) is not None


def import_object(target: str) -> object:
    """The object ``module:attr`` (or ``file.py:attr``) names, with a clear error if it cannot;
    ``:PARAMS`` after the attribute are ignored (they are the caller's)."""
    return import_target(target, error=PluginError)
