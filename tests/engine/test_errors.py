"""The exception hierarchy: one module, one base, the builtin bases kept, fields at construction."""

from __future__ import annotations

import ast
import builtins
import inspect
import pickle
from pathlib import Path

import pytest

import gossip
import gossip.errors as errors
from gossip.errors import GossipError

ROOT = Path(__file__).resolve().parent.parent
CLASSES = [getattr(errors, name) for name in errors.__all__]
BUILTIN_BASES = (ValueError, TypeError, RuntimeError, KeyError)
FIELDS = ("round", "node", "sender", "receiver", "rank", "row")

# Plain builtin raises still allowed in gossip/, each with its reason (file -> how many).
ALLOWED_BUILTIN_RAISES: dict[str, int] = {}
# Exception classes still defined outside gossip/errors.py, each with its reason.
DEFINED_ELSEWHERE: dict[str, str] = {}


def test_every_class_of_the_module_is_listed_and_derives_from_gossip_error():
    defined = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__}
    assert defined == set(errors.__all__)
    for cls in CLASSES:
        assert issubclass(cls, GossipError), cls


@pytest.mark.parametrize("cls", [c for c in CLASSES if c is not GossipError], ids=lambda c: c.__name__)
def test_every_class_keeps_a_builtin_base(cls):
    assert issubclass(cls, BUILTIN_BASES), f"{cls.__name__} would escape `except ValueError/RuntimeError`"


def test_the_builtin_bases_that_callers_catch():
    for cls in (errors.ConfigError, errors.ConfigFileError, errors.CommConfigError, errors.PluginError,
                errors.WrapError, errors.CompressionError, errors.RowsError):
        assert issubclass(cls, ValueError), cls
    for cls in (errors.DivergenceError, errors.NodeError, errors.CommError, errors.CommTimeout,
                errors.CheckpointError, errors.TuningError, errors.Interrupted, errors.ContractError):
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(errors.ConfigTypeError, TypeError) and issubclass(errors.ConfigTypeError, errors.ConfigError)


def test_one_config_family():
    for cls in (errors.ConfigTypeError, errors.ConfigFileError, errors.CommConfigError, errors.PluginError,
                errors.WrapError, errors.CompressorSpecError):
        assert issubclass(cls, errors.ConfigError), cls
    assert issubclass(errors.CommTimeout, errors.CommError)
    assert issubclass(errors.RowsError, errors.CompressionError)


@pytest.mark.parametrize("cls", [c for c in CLASSES if c is not errors.Interrupted], ids=lambda c: c.__name__)
def test_fields_are_set_at_construction(cls):
    exc = cls("what went wrong; the fix", round=3, node=1, sender=2, receiver=4, rank=0, row=5)
    assert str(exc) == "what went wrong; the fix"
    assert (exc.round, exc.node, exc.sender, exc.receiver, exc.rank, exc.row) == (3, 1, 2, 4, 0, 5)
    bare = cls("no place known")
    assert all(getattr(bare, f) is None for f in FIELDS)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == str(exc) and back.round == 3 and back.sender == 2


def test_interrupted_carries_its_round_and_signal():
    exc = errors.Interrupted(15, round=40, rank=1)
    assert (exc.signum, exc.round, exc.rank, exc.node) == (15, 40, 1, None)
    assert "SIGTERM at round 40" in str(exc) and "--resume" in str(exc)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.signum, back.round, back.rank, str(back)) == (15, 40, 1, str(exc))


def test_the_tree_in_the_docstring_names_every_class():
    for name in errors.__all__:
        assert f" {name}" in errors.__doc__, name


def test_public_modules_reexport_the_same_classes():
    from gossip.checkpoint import CheckpointError, Interrupted
    from gossip.comm import CommError, CommTimeout
    from gossip.config import ConfigFileError
    from gossip.tuning import TuningError

    assert (CheckpointError, Interrupted, CommError, CommTimeout, ConfigFileError, TuningError) == (
        errors.CheckpointError, errors.Interrupted, errors.CommError, errors.CommTimeout,
        errors.ConfigFileError, errors.TuningError)
    for name in errors.__all__:
        assert getattr(gossip, name) is getattr(errors, name), name
        assert name in gossip.__all__, name


def _modules():
    for path in sorted((ROOT / "gossip").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def _builtin_raises(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError", "RuntimeError", "KeyError"):
                out.append((node.lineno, exc.id))
    return out


def test_no_plain_builtin_raise_in_the_library():
    found = {}
    for rel, tree in _modules():
        hits = _builtin_raises(tree)
        if hits:
            found[rel] = hits
    unexpected = {rel: hits for rel, hits in found.items() if len(hits) > ALLOWED_BUILTIN_RAISES.get(rel, 0)}
    assert not unexpected, ("raise a gossip.errors class (it keeps the builtin base) instead of: "
                            + "; ".join(f"{rel}:{line} {name}" for rel, hits in unexpected.items()
                                        for line, name in hits))
    stale = {rel: n for rel, n in ALLOWED_BUILTIN_RAISES.items() if len(found.get(rel, ())) < n}
    assert not stale, f"fewer plain raises than allowed now: lower ALLOWED_BUILTIN_RAISES for {stale}"


def test_every_exception_class_is_defined_in_gossip_errors():
    elsewhere = {}
    for rel, tree in _modules():
        if rel == "gossip/errors.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if (bases & (set(errors.__all__) | {"Exception", "BaseException"})
                        or any(isinstance(getattr(builtins, b, None), type)
                               and issubclass(getattr(builtins, b), BaseException) for b in bases)):
                    elsewhere[node.name] = rel
    assert elsewhere == DEFINED_ELSEWHERE
    for name, rel in DEFINED_ELSEWHERE.items():
        module = rel.removesuffix(".py").replace("/", ".")
        assert issubclass(getattr(__import__(module, fromlist=[name]), name), GossipError)
