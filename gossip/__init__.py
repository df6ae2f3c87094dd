"""gossip: decentralized learning with compressed communication over arbitrary graphs.

The public API, importable from here (loaded on first use, so ``import gossip`` stays cheap)::

    import gossip, topologies

    topo = topologies.build("ring", 8)
    engine = gossip.Engine(gossip.make_algorithm("choco", gamma=0.5), topo, x0,
                           compressor="topk:0.1")
    engine.run(100)

In your own training loop (``docs/wrap.md``), each process one node::

    model, opt = gossip.wrap(model, torch.optim.AdamW(model.parameters()), algorithm="choco",
                             compressor="topk:0.01", topology="ring")
    ...; loss.backward(); opt.step()          # one round of CHOCO-SGD

Extending it without editing the package (``docs/extending.md``): subclass :class:`Codec`
and call :func:`register_compressor`, subclass :class:`Algorithm` and call
:func:`register_algorithm`, or name either as ``module:Class`` on a script's command line.
Every exception the library raises for a bad input or a run that cannot go on derives from
:class:`GossipError` and keeps its builtin base (``ValueError``, ``TypeError`` or
``RuntimeError``); all are defined in :mod:`gossip.errors` (the tree is in its docstring), carry
``round``/``node``/``sender``/``receiver``/``rank``/``row`` fields where known, and are exported
here. (The standalone ``topologies`` package raises its own ``topologies.TopologyError``.)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS: dict[str, str] = {
    # running
    "Engine": "gossip.engine",
    "Block": "gossip.core",
    "World": "gossip.comm.world",
    "Layout": "gossip.layout",
    "Checkpointer": "gossip.checkpoint",
    "DecentralizedTrainer": "gossip.training",
    # algorithms
    "Algorithm": "gossip.core",
    "make_algorithm": "gossip.algorithms",
    "register_algorithm": "gossip.algorithms",
    # compressors
    "Compressor": "gossip.compress",
    "Codec": "gossip.compress",
    "Payload": "gossip.compress",
    "make_compressor": "gossip.compress",
    "register_compressor": "gossip.compress",
    # problems
    "Problem": "gossip.problems",
    "make_problem": "gossip.problems",
    "register_problem": "gossip.problems",
    # protocols
    "Stateful": "gossip.stateful",
    # errors (the tree: gossip/errors.py)
    "GossipError": "gossip.errors",
    "ConfigError": "gossip.errors",
    "ConfigTypeError": "gossip.errors",
    "ConfigFileError": "gossip.errors",
    "CommConfigError": "gossip.errors",
    "CompressionError": "gossip.errors",
    "RowsError": "gossip.errors",
    "CompressorSpecError": "gossip.errors",
    "RunFailed": "gossip.errors",
    "ContractError": "gossip.errors",
    "DivergenceError": "gossip.errors",
    "NodeError": "gossip.errors",
    "PluginError": "gossip.errors",
    "CommError": "gossip.errors",
    "CommTimeout": "gossip.errors",
    "CheckpointError": "gossip.errors",
    "OutputError": "gossip.errors",
    "TuningError": "gossip.errors",
    "Interrupted": "gossip.errors",
    "WrapError": "gossip.errors",
    # your own training loop (a callable module: gossip.wrap(model, opt, ...), gossip.wrap.NodeSampler)
    "wrap": "gossip.wrap",
}
_RENAMED = {"make_compressor": "make"}

__all__ = ["__version__", "available_algorithms", "available_compressors", *_EXPORTS]


def available_algorithms() -> list[str]:
    """Registered algorithm names (built-in and registered by the user)."""
    from gossip.algorithms import available

    return available()


def available_compressors() -> list[str]:
    """Compressor spec forms :func:`make_compressor` accepts (placeholders in capitals)."""
    from gossip.compress import available

    return available()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gossip' has no attribute {name!r}")
    imported = importlib.import_module(module)
    value = imported if name == module.rpartition(".")[2] else getattr(imported, _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
