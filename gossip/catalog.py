"""The names a script's ``--help`` lists, readable without importing torch.

The registries (:data:`gossip.algorithms.ALGORITHMS`, :data:`gossip.compress.COMPRESSORS`,
:data:`gossip.problems.factory.BUILDERS`) hold classes and functions whose modules import torch,
which takes longer than a help text should. This module imports nothing but the standard
library (and :mod:`gossip.errors`) and holds what the help texts and the parsers' ``choices`` need:

* the single definition of the plain name lists that the torch modules import from here:
  :data:`COMPRESSOR_SPECS` (the built-in compressors' spec forms and usage lines, registered by
  :mod:`gossip.compress`), :data:`PROBLEMS` (registered by :mod:`gossip.problems.factory`),
  :data:`DEFAULT_L1`, :data:`ESTIMATORS`, :data:`MODELS`, :data:`NORMS`, :data:`OPTIMIZERS`,
  :data:`SCHEDULES`;
* what the built-in algorithm classes declare (:func:`builtin_algorithms`, one :class:`Traits`
  each), read from their modules' source with :mod:`ast`, so each fact is written once, in its
  class (:func:`traits_of` reads the same from a class).

The functions :func:`algorithms`, :func:`compressor_usage` and :func:`problems` read the live
registry once its module has been imported (so parts a user registered are listed too) and
these tables before that. ``tests/scripts/test_startup.py`` checks that the tables equal the
live registries (the source reading included) and that every ``--help`` reads the same either way.
"""

from __future__ import annotations

import ast
import bisect
import functools
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gossip.errors import ContractError

# ---------------------------------------------------------------- compressors
COMPRESSOR_SPECS: dict[str, tuple[tuple[str, ...] | None, str | None]] = {
    "none": (None, None),
    "fp16": (None, None),
    "bf16": (None, None),
    "topk": (("topk:RATIO", "topk:K"),
             "topk:RATIO (0 < RATIO <= 1, e.g. topk:0.01) or topk:K (integer K >= 1)"),
    "randk": (("randk:RATIO", "randk:K", "randk:RATIO:unbiased", "randk:K:unbiased"),
              "randk:RATIO or randk:K, optionally :unbiased (e.g. randk:0.01:unbiased)"),
    "sign": (None, None),
    "sign_l1": (None, None),
    "sign_l2": (None, None),
    "qsgd": (("qsgd:BITS", "qsgd:s=LEVELS", "qsgd:BITS:biased", "qsgd:s=LEVELS:biased"),
             "qsgd:BITS (1..16, also '4bit') or qsgd:s=LEVELS (1..65536), optionally :biased"),
    "lead": (("lead:BITS",), "lead:BITS (1..16, also '2bit')"),
    "natural": (None, None),
    "lowrank": (("lowrank:RANK",), "lowrank:RANK (integer RANK >= 1)"),
    "vote": (("vote", "vote:ties"), "vote or vote:ties (unscaled signs, a zero plane with :ties)"),
}
"""Built-in compressor name -> (spec forms, usage line), in registration order; None means the
default of :func:`gossip.compress.register_compressor` (the name; the forms joined)."""

PLUGIN_COMPRESSOR = "module:Class[:PARAMS]"

# ---------------------------------------------------------------- problems, data, models
PROBLEMS: tuple[str, ...] = ("least-squares", "logistic", "lasso", "l1-logistic")
"""The built-in problems, in registration order."""

DEFAULT_L1: dict[str, float] = {"lasso": 0.02, "l1-logistic": 1e-3}
"""The lasso's l1 = 0.02 follows the LEAD paper's experiment (docs/experiments.md#lasso); the
logistic value keeps a sparse but non-trivial solution on the default synthetic data."""

ESTIMATORS: tuple[str, ...] = ("full", "sgd", "lsvrg", "saga")
"""Gradient estimators of :func:`gossip.problems.make_oracle`."""

MODELS: tuple[str, ...] = ("mlp", "cnn", "resnet20")
"""Models of :func:`gossip.training.make_model`."""

NORMS: tuple[str, ...] = ("batch", "group", "none")
"""Normalization layers of the convolutional models."""

OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "nesterov", "adam", "adamw")
"""Local optimizers of :func:`gossip.training.make_optimizer`."""

SCHEDULES: tuple[str, ...] = ("constant", "step", "cosine")
"""Learning-rate schedules of :func:`gossip.training.lr_multiplier`."""


# ---------------------------------------------------------------- algorithms
@dataclass(frozen=True)
class Traits:
    """What the help texts select algorithms by, as a class declares it (:func:`traits_of`; the
    built-in ones read from their source by :func:`builtin_algorithms`).

    Attributes:
        gradients: ``requires.gradients`` (needs a gradient oracle; consensus.py has none).
        trains: ``trains`` (can minimize a problem or train a model).
        takes_optimizer: ``takes_optimizer`` (its local step is a ``torch.optim`` optimizer).
        compressor: ``requires.compressor`` (``"identity"``: only ``none``).
        complete: ``requires.graph.complete`` (an all-reduce: ``--topology complete`` only).
        tunable: ``tunable`` (hyper-parameters ``--gamma auto`` and the like may search).
        state_copies: ``state_copies`` (model-sized vectors per node; :mod:`gossip.memory`).
        neighbor_copies: ``neighbor_copies`` (model-sized vectors per node and neighbor).
        asynchronous: ``asynchronous`` (runs on events in virtual time, not in rounds).
    """

    gradients: bool
    trains: bool
    takes_optimizer: bool
    compressor: str
    complete: bool
    tunable: tuple[str, ...]
    state_copies: int
    neighbor_copies: int
    asynchronous: bool


def traits_of(cls: Any) -> Traits:
    """The :class:`Traits` an :class:`~gossip.algorithms.Algorithm` subclass declares."""
    requires = cls.requires
    return Traits(gradients=bool(requires.gradients), trains=bool(cls.trains),
                  takes_optimizer=bool(cls.takes_optimizer), compressor=requires.compressor,
                  complete=bool(requires.graph.complete), tunable=tuple(cls.tunable),
                  state_copies=int(cls.state_copies), neighbor_copies=int(cls.neighbor_copies),
                  asynchronous=bool(cls.asynchronous))


# Reading the traits from the algorithm modules' source (no import: torch takes longer to import
# than a help text should). Only what the class bodies declare is kept and parsed: each class's
# header and its class-level assignments (``state_copies = 6``, ``requires = Requirements(...)``,
# ``requires = replace(Parent.requires, ...)``, ``state_copies = Other.state_copies``), which are
# then evaluated through the classes' bases (Python's method resolution order).
_ALGORITHMS_DIR = Path(__file__).resolve().parent / "algorithms"
_CORE_DIR = _ALGORITHMS_DIR.parent / "core"  # the Algorithm base and Requirements
_TOP = re.compile(r"\n[^\s#)\]}]")  # a line at column 0 (not closing a bracket)
_HEADER = re.compile(r"\nclass \w+(?:\([^)]*\))?:")
_ASSIGNMENT = re.compile(r"\n    [A-Za-z_]\w*[ \t]*(?::[^=\n]+)?=(?!=)[^\n]*(?:\n(?:        |    [)\]}])[^\n]*)*")
"""Line starts are matched as ``\\n`` (the text gets one in front), which the regular expression
engine finds several times faster than a ``^`` in multi-line mode."""


@dataclass
class _Source:
    """A class as its source declares it: module, bases (names) and class-level assignments."""

    module: str
    bases: list[str]
    body: dict[str, ast.expr]


def _class_lines(text: str) -> str:
    """The class headers (a ``pass`` after each) and class-level assignments of a module's
    source, indentation kept, leaving out functions, docstrings and everything else (regular
    expressions over the whole text: a fraction of a full parse's time)."""
    text = "\n" + text
    kept: list[str] = []
    quotes = _Quotes(text)
    for header in _HEADER.finditer(text):
        if quotes.inside(header.start()):
            continue
        top = _TOP.search(text, header.end())
        while top is not None and quotes.inside(top.start()):
            top = _TOP.search(text, top.end())
        end = len(text) if top is None else top.start()
        kept += [header.group(0), "\n    pass"]
        for m in _ASSIGNMENT.finditer(text, header.end(), end):
            if quotes.inside(m.start()):
                continue
            stop = m.end()
            if quotes.inside(stop):  # it opens a multi-line string: keep it up to its end
                stop = quotes.close(stop)
            kept.append(text[m.start():stop])
    return "".join(kept) + "\n"


def _find_all(text: str, word: str) -> list[int]:
    """Where ``word`` occurs in ``text`` (``str.find``: faster than a regular expression)."""
    found, at = [], text.find(word)
    while at >= 0:
        found.append(at)
        at = text.find(word, at + len(word))
    return found


class _Quotes:
    """Where a source's triple-quoted strings are (the positions of its triple quotes)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.marks = sorted(_find_all(text, '"""') + _find_all(text, "\'\'\'"))

    def inside(self, pos: int) -> bool:
        """True when an odd number of triple quotes precede ``pos``."""
        return bisect.bisect_left(self.marks, pos) % 2 == 1

    def close(self, pos: int) -> int:
        """The end of the line on which the string open at ``pos`` closes."""
        k = bisect.bisect_left(self.marks, pos)
        close = self.marks[k] if k < len(self.marks) else len(self.text)
        end = self.text.find("\n", close)
        return len(self.text) if end < 0 else end


def _sources(root: Path) -> list[str]:
    """The ``.py`` files under ``root``, relative to it, sorted."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".py")]
    return sorted(found)


def _classes_of(path: str, module: str) -> dict[str, _Source]:
    """The classes a module's source declares (its class-level assignments)."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    try:
        tree = ast.parse(_class_lines(text))
    except SyntaxError:  # a layout the line filter does not follow: read the whole module
        tree = ast.parse(text)
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body: dict[str, ast.expr] = {}
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and stmt.value is not None:
                    body.update({t.id: stmt.value for t in stmt.targets if isinstance(t, ast.Name)})
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
                    body[stmt.target.id] = stmt.value
            bases = [ast.unparse(b.value if isinstance(b, ast.Subscript) else b) for b in node.bases]
            found[node.name] = _Source(module, bases, body)
    return found


class _SourceReader:
    """The algorithm classes of ``gossip/algorithms`` as their source declares them."""

    def __init__(self, *roots: Path) -> None:
        self.classes: dict[str, _Source] = {}
        for root in roots:
            for rel in _sources(root):
                module = ".".join(("gossip", root.name, *rel[:-3].split(os.sep)))
                self.classes.update(_classes_of(os.path.join(root, rel), module))

    @functools.cache  # noqa: B019 (one reader per process)
    def mro(self, name: str) -> list[str]:
        """C3 linearization of the class ``name`` (bases outside the package are left out)."""
        bases = [b for b in self.classes[name].bases if b in self.classes]
        seqs = [self.mro(b) for b in bases] + [bases]
        out = [name]
        while any(seqs):
            seqs = [s for s in seqs if s]
            head = next(s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs))
            out.append(head)
            seqs = [s[1:] if s[0] == head else s for s in seqs]
        return out

    def attr(self, cls: str, attr: str) -> Any:
        """The value of ``cls.attr``: the first class of its MRO that assigns it, evaluated."""
        for owner in self.mro(cls):
            expr = self.classes[owner].body.get(attr)
            if expr is not None:
                return self.value(expr, owner)
        raise ContractError(f"{cls}.{attr} is assigned in no class of {self.mro(cls)} (gossip/algorithms, gossip/core)")

    def value(self, expr: ast.expr, where: str) -> Any:
        """What ``expr`` (a class-level assignment of class ``where``) evaluates to."""
        if isinstance(expr, ast.Constant):
            return expr.value
        if isinstance(expr, (ast.Tuple, ast.List)):
            return tuple(self.value(e, where) for e in expr.elts)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) \
                and expr.value.id in self.classes:
            return self.attr(expr.value.id, expr.attr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            func = expr.func.id
            kwargs = {k.arg: self.value(k.value, where) for k in expr.keywords if k.arg}
            if func == "replace" and len(expr.args) == 1:
                return {**self.value(expr.args[0], where), **kwargs}
            if func == "field" and not expr.args and set(kwargs) == {"default_factory"}:
                return kwargs["default_factory"]
            if func in self.classes and len(expr.keywords) == len(kwargs):
                fields = self.classes[func].body  # a dataclass: its fields and their defaults
                given = dict(zip(fields, (self.value(a, where) for a in expr.args)))
                return self.record(func, {**given, **kwargs})
        if isinstance(expr, ast.Name) and expr.id in self.classes:
            return self.record(expr.id, {})  # a default_factory
        if isinstance(expr, ast.Name) and expr.id in self.classes[where].body:
            return self.value(self.classes[where].body[expr.id], where)  # an earlier one of the body
        raise ContractError(f"{self.classes[where].module}.{where}: gossip.catalog cannot read "
                            f"{ast.unparse(expr)!r} without importing it; write a trait as a literal, "
                            "Requirements(...), replace(Parent.requires, ...) or Other.attribute")

    def record(self, cls: str, given: dict[str, Any]) -> dict[str, Any]:
        """The fields of an instance of the dataclass ``cls``: ``given``, defaults for the rest."""
        return {key: given[key] if key in given else self.value(expr, cls)
                for key, expr in self.classes[cls].body.items()}

    def traits(self, cls: str) -> Traits:
        """The :class:`Traits` of class ``cls`` (what :func:`traits_of` reads from the class)."""
        requires = self.attr(cls, "requires")
        return Traits(gradients=bool(requires["gradients"]), trains=bool(self.attr(cls, "trains")),
                      takes_optimizer=bool(self.attr(cls, "takes_optimizer")),
                      compressor=requires["compressor"], complete=bool(requires["graph"]["complete"]),
                      tunable=tuple(self.attr(cls, "tunable")), state_copies=int(self.attr(cls, "state_copies")),
                      neighbor_copies=int(self.attr(cls, "neighbor_copies")),
                      asynchronous=bool(self.attr(cls, "asynchronous")))


def _arcs_traits(reader: _SourceReader, cls: str) -> Traits | None:
    """The :class:`Traits` of ``cls``'s robust per-arc form (``NAME-arcs``), from the
    ``arcs_form = ArcsForm(...)`` its own body declares (or ``Other.arcs_form``); None without one."""
    expr = reader.classes[cls].body.get("arcs_form")
    while isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in reader.classes:
        expr = reader.classes[expr.value.id].body.get(expr.attr)
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "ArcsForm"):
        return None
    form = {k.arg: reader.value(k.value, cls) for k in expr.keywords if k.arg}
    requires = form["requires"]
    return replace(reader.traits(cls), gradients=bool(requires["gradients"]), compressor=requires["compressor"],
                   complete=bool(requires["graph"]["complete"]), state_copies=int(form["state_copies"]),
                   neighbor_copies=int(form["neighbor_copies"]))


def _registered(builtin: Path) -> list[str]:
    """The classes ``gossip/algorithms/builtin.py`` registers, in order: the names of its
    ``BUILTIN = (A, B, ...)`` tuple."""
    for node in ast.parse(builtin.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else \
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id == "BUILTIN" and isinstance(node.value, ast.Tuple):
            return [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    raise ContractError(f"{builtin}: no BUILTIN = (...) tuple of the built-in algorithm classes")


def read_algorithms() -> dict[str, Traits]:
    """The built-in algorithms' :class:`Traits`, in registration order, read from the source of
    ``gossip/algorithms`` without importing it (:func:`builtin_algorithms` caches it)."""
    reader = _SourceReader(_ALGORITHMS_DIR, _CORE_DIR)
    out: dict[str, Traits] = {}
    for cls in _registered(_ALGORITHMS_DIR / "builtin.py"):
        name = reader.attr(cls, "name")
        out[name] = reader.traits(cls)
        arcs = _arcs_traits(reader, cls)
        if arcs is not None:  # registered right after it (gossip.core.registry.register_algorithm)
            out[f"{name}-arcs"] = arcs
    return out


@functools.cache
def builtin_algorithms() -> dict[str, Traits]:
    """:func:`read_algorithms`, once per process and, between processes, from a
    ``catalog.json`` beside Python's ``.pyc`` files (``gossip/algorithms/__pycache__/``, or
    under ``PYTHONPYCACHEPREFIX``), used while every source file has the size and modification
    time it had when the file was written (as ``.pyc`` files are checked); nothing is written
    when Python writes no ``.pyc`` (``PYTHONDONTWRITEBYTECODE``). Reading the sources costs a
    help text 10-30 ms, the file about 1 ms. ``tests/scripts/test_startup.py`` checks the
    reading against the classes."""
    stamp = [[os.path.join(root.name, rel), st.st_size, st.st_mtime_ns] for root in (_ALGORITHMS_DIR, _CORE_DIR)
             for rel in _sources(root) for st in (os.stat(os.path.join(root, rel)),)]
    prefix = sys.pycache_prefix  # where Python keeps its .pyc files (PYTHONPYCACHEPREFIX)
    folder = Path(prefix, *_ALGORITHMS_DIR.parts[1:]) if prefix else _ALGORITHMS_DIR / "__pycache__"
    cache = folder / "catalog.json"
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved["stamp"] == stamp:
            return {name: Traits(**{**t, "tunable": tuple(t["tunable"])}) for name, t in saved["traits"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache yet, or one of another version: read the sources
    traits = read_algorithms()
    if not sys.dont_write_bytecode:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f"catalog.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"stamp": stamp, "traits": [[n, asdict(t)] for n, t in traits.items()]}),
                           encoding="utf-8")
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only install: every process reads the sources
    return traits


# ---------------------------------------------------------------- live or static
def _loaded(module: str, attr: str) -> Any:
    """``module.attr`` when the module has been imported (fully enough to have it), else None."""
    return getattr(sys.modules.get(module), attr, None)


def algorithm_traits() -> dict[str, Traits]:
    """Every registered algorithm's :class:`Traits` (the built-in ones until
    :mod:`gossip.algorithms` is imported)."""
    registry = _loaded("gossip.algorithms", "REGISTRY")
    if registry is None:
        return dict(builtin_algorithms())
    return {name: traits_of(cls) for name, cls in registry.items()}


def algorithms(where: Callable[[Traits], bool] | None = None) -> list[str]:
    """Registered algorithm names whose traits satisfy ``where`` (all without it), sorted."""
    return sorted(name for name, t in algorithm_traits().items() if where is None or where(t))


def compressor_usage() -> str:
    """:func:`gossip.compress.usage`: how to write every registered compressor's spec."""
    usage = _loaded("gossip.compress", "usage")
    if usage is not None:
        return usage()
    lines = [text or " or ".join(forms or (name,)) for name, (forms, text) in COMPRESSOR_SPECS.items()]
    return "; ".join(lines) + f"; or {PLUGIN_COMPRESSOR}"


def problems() -> list[str]:
    """:data:`gossip.problems.PROBLEMS`: the registered problem names, in registration order."""
    live = _loaded("gossip.problems.factory", "PROBLEMS")
    return list(PROBLEMS if live is None else live)


__all__ = ["builtin_algorithms", "read_algorithms", "COMPRESSOR_SPECS", "DEFAULT_L1", "ESTIMATORS", "MODELS", "NORMS",
           "OPTIMIZERS", "PLUGIN_COMPRESSOR", "PROBLEMS", "SCHEDULES", "Traits", "algorithm_traits",
           "algorithms", "compressor_usage", "problems", "traits_of"]
