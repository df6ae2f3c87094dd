"""One name registry and one ``module:Name`` plug-in loader, for topologies and for gossip.

:class:`Registry` maps names to objects (topology builders here; gossip's algorithms,
compressors and problems); ``get`` resolves a registered name or a plug-in spec
``module:Name[:PARAMS]`` / ``path/to/file.py:Name[:PARAMS]``, parsed by :func:`parse_target`
and imported by :func:`import_target`, the only parser and loader of such specs.

One error rule: a registry raises its ``error`` for its names (unknown, taken) and its
``plugin_error`` (by default ``error``) for a plug-in spec that cannot be loaded; gossip's
registries name :class:`gossip.errors.PluginError`, topologies' :class:`SpecError`.

Why it lives here: ``topologies`` is standalone (it imports nothing from ``gossip``) while
``gossip`` already depends on it, so the lower layer holds the single copy, which gossip
imports from here. This module imports nothing but the standard library
(``topologies/__init__`` loads its names lazily), so ``gossip.compress`` and
``gossip.algorithms`` get it without networkx or scipy.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "Resolved", "Target", "import_target", "parse_target"]

T = TypeVar("T")

_FILES: dict[str, object] = {}  # resolved file path -> module: a plug-in file runs once per process


@dataclass(frozen=True)
class Target:
    """A parsed plug-in spec: ``module`` (dotted, or a ``.py`` path), ``attr`` (dotted) and the
    ``:``-separated ``params`` after it (``"pkg.mod:Cls:0.1:x"`` -> params ``("0.1", "x")``)."""

    module: str
    attr: str
    params: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ":".join((self.module, self.attr, *self.params))


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'digits'?)`` when ``word`` is close to one of ``choices``, else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_target(spec: str) -> Target | None:
    """The :class:`Target` that ``spec`` reads as, or None when it is no plug-in spec.

    A file path ends at its first ``.py:`` (so a path may contain ``:``, e.g. ``C:/x.py:Cls``);
    otherwise the module ends at the first ``:``. The module must be a dotted name or end in
    ``.py``, the attribute a dotted name; what follows is left, unparsed, in ``params``.
    """
    if not isinstance(spec, str):
        return None
    spec = spec.strip()
    cut = spec.find(".py:")
    if cut > 0:
        module, rest = spec[:cut + 3], spec[cut + 4:]
    else:
        module, sep, rest = spec.partition(":")
        if not sep:
            return None
    attr, *params = rest.split(":")
    module_ok = module.endswith(".py") or all(p.isidentifier() for p in module.split("."))
    if not (module and module_ok and all(p.isidentifier() for p in attr.split("."))):
        return None
    return Target(module, attr, tuple(params))


def import_target(target: str | Target, *, error: type[Exception], form: str = "module:Name") -> object:
    """The object a plug-in spec names (its params are ignored: they are the caller's).

    Raises ``error`` saying what to fix: a spec that is not ``form``, a module that cannot be
    imported, a missing file or attribute. A ``.py`` file is executed once per process.
    """
    parsed = parse_target(target) if isinstance(target, str) else target
    if parsed is None:
        example = form.split(":", 1)[-1]
        raise error(f"expected {form!r} (e.g. 'mypkg.parts:{example}', or "
                    f"'path/to/file.py:{example}'), got {target!r}")
    module_name = parsed.module
    path = Path(module_name).resolve() if module_name.endswith(".py") else None
    if path is not None and not path.is_file():
        raise error(f"{str(target)!r}: file {module_name!r} does not exist")
    try:
        if path is not None:
            module = _FILES.get(str(path))
            if module is None:
                spec = importlib.util.spec_from_file_location(f"_plugin_file_{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
                _FILES[str(path)] = module
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(
            f"{str(target)!r}: cannot import module {module_name!r} ({exc}); put its folder on "
            "PYTHONPATH or give the file's path (path/to/file.py:Name)"
        ) from exc
    except Exception as exc:  # the user's module itself failed (a syntax error, a raise)
        if path is not None:
            sys.modules.pop(f"_plugin_file_{path.stem}", None)
        where = module_name if path is not None else f"module {module_name!r}"
        line = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise error(f"{str(target)!r}: importing {where} raised {line[:300]}; fix that file (run "
                    "it with python to see the traceback)") from exc
    obj: object = module
    for part in parsed.attr.split("."):
        if not hasattr(obj, part):
            raise error(f"{str(target)!r}: module {module_name!r} has no attribute {parsed.attr!r}")
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """What :meth:`Registry.resolve` found: the registry ``name`` (None for a plug-in), the
    object and the spec's ``:``-separated ``params``."""

    name: str | None
    obj: T
    params: tuple[str, ...] = ()


def _a(noun: str) -> str:
    """'an algorithm', 'a compressor'."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _owner(obj: object) -> str:
    """``module.QualName`` of a class or function, else its repr (for 'already registered')."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(obj)


class Registry(Generic[T]):
    """Named objects of one ``kind`` ("algorithm", "compressor", ...), plus plug-in specs.

    * ``register(name, obj, *, replace=False, **meta)`` (or ``@register(name, **meta)``): the
      same object again is a no-op apart from taking the new ``meta`` (a module imported twice);
      another object under a taken name raises ``error`` naming the owner unless ``replace``.
    * ``get(spec)``: the object of a registered name or of a ``module:Name`` plug-in spec;
      ``resolve(spec)`` also gives the spec's params (``takes_params``: ``"topk:0.1"``).
    * ``available()`` (sorted names), ``name in registry``, ``registry[name]``, ``len``,
      iteration, ``keys``/``values``/``items`` in registration order; ``meta(name)``.

    ``objects`` is the live ``name -> object`` dict (older module-level names alias it).
    ``normalize`` maps a looked-up name to its registered form (e.g. ``str.lower``);
    ``plugin_error`` is raised for a plug-in that cannot be imported (default ``error``).
    """

    def __init__(self, kind: str, *, error: type[Exception] = LookupError,
                 plugin_error: type[Exception] | None = None,
                 normalize: Callable[[str], str] | None = None, takes_params: bool = False,
                 form: str = "module:Name") -> None:
        self.kind = kind
        self.error = error
        self.plugin_error = plugin_error or error
        self.normalize = normalize or (lambda name: name)
        self.takes_params = takes_params
        self.form = form
        self.objects: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ registering
    def check(self, name: str, obj: object, *, replace: bool = False) -> None:
        """Raise what :meth:`register` would for ``name`` and ``obj``, without registering."""
        if not isinstance(name, str) or not name or ":" in name or name != name.strip():
            raise self.error(f"{self.kind} name {name!r} must be a non-empty string without ':' "
                             "or surrounding spaces")
        old = self.objects.get(name)
        if old is not None and old is not obj and not replace:
            raise self.error(f"{_a(self.kind)} named {name!r} is already registered ({_owner(old)}); "
                             "pick another name or pass replace=True")

    def register(self, name: str, obj: T | None = None, *, replace: bool = False, **meta: Any) -> Any:
        """Add ``obj`` under ``name`` and return it; without ``obj``, a decorator that does."""
        if obj is None:
            return lambda target: self.register(name, target, replace=replace, **meta)
        self.check(name, obj, replace=replace)
        self.objects[name] = obj
        self._meta[name] = dict(meta)
        return obj

    def meta(self, name: str) -> dict[str, Any]:
        """The keywords ``name`` was registered with (empty when it is not registered)."""
        return dict(self._meta.get(name, {})) if name in self.objects else {}

    # ------------------------------------------------------------------ looking up
    def available(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self.objects)

    def suggest(self, spec: object) -> str:
        """`` (did you mean 'choco'?)`` for a misspelt name close to a registered one, else ""."""
        text = str(spec).strip()
        head = text.partition(":")[0] if self.takes_params else text
        return did_you_mean(self.normalize(head), self.available())

    def unknown(self, spec: object) -> Exception:
        """The error for a spec that is neither a registered name nor a plug-in spec."""
        return self.error(f"unknown {self.kind} {spec!r}{self.suggest(spec)}; choose one of: "
                          f"{', '.join(self.available())}, or give {self.form}")

    def resolve(self, spec: str) -> Resolved[T]:
        """The registered name or plug-in ``spec``'s object, with the spec's params."""
        if not isinstance(spec, str):
            raise self.unknown(spec)
        spec = spec.strip()
        head, sep, tail = spec.partition(":") if self.takes_params else (spec, "", "")
        key = self.normalize(head)
        if key in self.objects:
            return Resolved(key, self.objects[key], tuple(tail.split(":")) if sep else ())
        target = parse_target(spec)
        if target is None:
            raise self.unknown(spec)
        if target.params and not self.takes_params:
            raise self.plugin_error(f"{spec!r}: {_a(self.kind)} spec is {self.form}, with nothing after "
                                    f"{target.attr!r}")
        return Resolved(None, import_target(target, error=self.plugin_error, form=self.form), target.params)

    def get(self, spec: str) -> T:
        """The object of a registered name or of a ``module:Name`` plug-in spec."""
        return self.resolve(spec).obj

    # ------------------------------------------------------------------ read-only mapping
    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.normalize(name) in self.objects

    def __getitem__(self, name: str) -> T:
        return self.objects[self.normalize(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.objects)

    def __len__(self) -> int:
        return len(self.objects)

    def keys(self):  # noqa: ANN201 - dict views
        return self.objects.keys()

    def values(self):  # noqa: ANN201
        return self.objects.values()

    def items(self):  # noqa: ANN201
        return self.objects.items()

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.objects)})"
