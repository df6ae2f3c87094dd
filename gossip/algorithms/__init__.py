"""Decentralized algorithms, one module each, built by name from the registry.

``docs/algorithms/<name>.md`` describes each one; a user's own algorithm joins with
:func:`register_algorithm` or is named as ``module:Class`` (``docs/extending.md``).
"""

from __future__ import annotations

import gossip.algorithms.builtin  # noqa: F401  (registers the built-in algorithms)
from gossip.core.algorithm import Algorithm, Round
from gossip.core.registry import (
    ALGORITHMS,
    REGISTRY,
    accepted_hparams,
    algorithm_class,
    available,
    form_class,
    make_algorithm,
    register,
    register_algorithm,
)
from gossip.core.requirements import Graph, Requirements
from gossip.errors import ConfigError

__all__ = ["ALGORITHMS", "Algorithm", "ConfigError", "Graph", "REGISTRY", "Requirements", "Round",
           "accepted_hparams",
           "algorithm_class", "available", "form_class", "make_algorithm", "register", "register_algorithm"]
