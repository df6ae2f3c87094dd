"""User parts named on the command line: ``module:Name`` or ``path/to/file.py:Name``.

Scripts accept such a spec wherever they accept a registry name (``--algorithm``,
``--compressor``, ``--problem``, as ``--topology`` does), so a user's own class runs without
editing the package. Importing the module also runs any ``register_*`` calls it makes.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from gossip.errors import GossipError


class PluginError(GossipError, ValueError):
    """A ``module:Name`` spec that cannot be imported or does not name what was expected."""


_FILES: dict[str, object] = {}  # file path -> module, so a file is executed once per process


def looks_like_target(spec: str) -> bool:
    """True when ``spec`` reads as ``module:Name[...]`` (callers first try their registry)."""
    name, sep, rest = spec.partition(":")
    attr = rest.split(":", 1)[0]
    module_like = name.endswith(".py") or all(p.isidentifier() for p in name.split("."))
    return bool(sep) and module_like and attr.replace(".", "_").isidentifier()


def import_object(target: str) -> object:
    """The object ``module:attr`` (or ``file.py:attr``) names, with a clear error if it cannot."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"expected 'module:Name' (e.g. 'mypkg.parts:MyCompressor'), got {target!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            if not path.is_file():
                raise PluginError(f"{target!r}: file {module_name!r} does not exist")
            module = _FILES.get(str(path))
            if module is None:
                spec = importlib.util.spec_from_file_location(f"gossip_plugin_{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
                _FILES[str(path)] = module
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(
            f"{target!r}: cannot import module {module_name!r} ({exc}); put its folder on "
            "PYTHONPATH or give the file's path (path/to/file.py:Name)"
        ) from exc
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{target!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
