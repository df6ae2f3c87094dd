"""The registry of algorithms: every :class:`~gossip.core.algorithm.Algorithm` by name.

:mod:`gossip.algorithms` registers the built-in methods here; a user's class joins with
:func:`register_algorithm` (or is named as ``module:Class``). The engine reads the registry
(never an algorithm module), and :func:`make_algorithm` builds a method by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from gossip.core.algorithm import Algorithm
from gossip.errors import ConfigError, PluginError
from topologies.registry import Registry

ALGORITHMS = Registry("algorithm", error=ConfigError, plugin_error=PluginError, form="module:Class")
"""Every algorithm by name (a :class:`topologies.registry.Registry`); join it with :func:`register_algorithm`."""
REGISTRY: dict[str, type[Algorithm]] = ALGORITHMS.objects
"""The live ``name -> class`` dict of :data:`ALGORITHMS` (read it; register through
:func:`register_algorithm`)."""


def register_algorithm(cls: type[Algorithm], *, replace: bool = False) -> type[Algorithm]:
    """Add an :class:`Algorithm` subclass to the registry under ``cls.name`` (usable as a decorator).

    Scripts then accept ``--algorithm NAME``. The same class again is a no-op (a module imported
    twice); a name taken by another class is refused, naming it, unless ``replace`` is set. A
    class that declares an ``arcs_form`` (its robust per-arc form, docs/extending.md) is
    registered with it: ``NAME-arcs`` is the class with ``arcs=True``.
    """
    if not (inspect.isclass(cls) and issubclass(cls, Algorithm)):
        raise ConfigError(f"register_algorithm takes an Algorithm subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise ConfigError(f"{cls.__name__}.name = {name!r}: give the class a `name` class attribute "
                          "(a string without ':' or spaces), its registry name")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ConfigError(f"{cls.__name__} cannot be registered: it does not define {missing}")
    forms = [cls, cls.with_arcs()] if vars(cls).get("arcs_form") else [cls]
    for form in forms:  # both names checked before either is taken
        ALGORITHMS.check(form.name, form, replace=replace)
    for form in forms:
        ALGORITHMS.register(form.name, form, replace=replace)
    return cls


register = register_algorithm
"""The former name of :func:`register_algorithm`."""


def available() -> list[str]:
    """Registered algorithm names, sorted."""
    return ALGORITHMS.available()


def algorithm_class(spec: str | type[Algorithm]) -> type[Algorithm]:
    """The class a registry name or a ``module:Class`` spec names (the class itself passes)."""
    if inspect.isclass(spec) and issubclass(spec, Algorithm):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(f"an algorithm is a registry name, 'module:Class' or an Algorithm, got {spec!r}")
    found = ALGORITHMS.resolve(spec)
    if found.name is not None:
        return found.obj
    obj = found.obj
    if not (inspect.isclass(obj) and issubclass(obj, Algorithm)):
        raise ConfigError(f"{spec!r} is not a gossip.algorithms.Algorithm subclass")
    if inspect.isabstract(obj):
        raise ConfigError(f"{spec!r} does not define {', '.join(sorted(obj.__abstractmethods__))}")
    return obj


def form_class(spec: str | type[Algorithm], hparams: Mapping[str, Any] | None = None) -> type[Algorithm]:
    """The class :func:`make_algorithm` builds for ``spec`` with ``hparams``: the method's
    per-arc form when ``hparams["arcs"]`` is true (what sizes its memory), else its class."""
    cls = algorithm_class(spec)
    return cls.with_arcs() if (hparams or {}).get("arcs") else cls


def make_algorithm(spec: str | type[Algorithm] | Algorithm, *, arcs: bool = False,
                   **hparams: Any) -> Algorithm:
    """Build an algorithm from a registry name, ``module:Class`` or class, with keyword
    hyper-parameters (unknown ones rejected, naming the accepted ones); an instance passes.
    ``arcs=True``: the method's robust per-arc form (``make_algorithm("choco", arcs=True)`` is
    ``make_algorithm("choco-arcs")``; :meth:`Algorithm.with_arcs`)."""
    if isinstance(spec, Algorithm):
        if hparams or arcs:
            given = sorted(hparams) + (["arcs"] if arcs else [])
            raise ConfigError(f"{spec.name} is already built; set {given} on its constructor")
        return spec
    cls = form_class(spec, {"arcs": arcs})
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = set(hparams) - accepted
    if unknown:
        raise ConfigError(
            f"{cls.name} does not take {sorted(unknown)}; its hyper-parameters are {sorted(accepted)}"
        )
    return cls(**hparams)


def accepted_hparams(spec: str | type[Algorithm]) -> set[str]:
    """The keyword hyper-parameters the algorithm's constructor takes."""
    return set(inspect.signature(algorithm_class(spec).__init__).parameters) - {"self"}
