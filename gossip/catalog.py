"""The names a script's ``--help`` lists, readable without importing torch.

The registries (:data:`gossip.algorithms.ALGORITHMS`, :data:`gossip.compress.COMPRESSORS`,
:data:`gossip.problems.factory.BUILDERS`) hold classes and functions whose modules import torch,
which takes longer than a help text should. This module imports nothing but the standard
library and holds what the help texts and the parsers' ``choices`` need:

* the single definition of the plain name lists that the torch modules import from here:
  :data:`COMPRESSOR_SPECS` (the built-in compressors' spec forms and usage lines, registered by
  :mod:`gossip.compress`), :data:`PROBLEMS` (registered by :mod:`gossip.problems.factory`),
  :data:`DEFAULT_L1`, :data:`ESTIMATORS`, :data:`MODELS`, :data:`NORMS`, :data:`OPTIMIZERS`,
  :data:`SCHEDULES`;
* a copy of what the built-in algorithm classes declare (:data:`ALGORITHMS`, one
  :class:`Traits` each, read from a class by :func:`traits_of`).

The functions :func:`algorithms`, :func:`compressor_usage` and :func:`problems` read the live
registry once its module has been imported (so parts a user registered are listed too) and
these tables before that. ``tests/scripts/test_startup.py`` checks that the tables equal the
live registries and that every ``--help`` reads the same either way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    """What the help texts select algorithms by; :func:`traits_of` reads them from a class.

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

    gradients: bool = True
    trains: bool = True
    takes_optimizer: bool = False
    compressor: str = "any"
    complete: bool = False
    tunable: tuple[str, ...] = ()
    state_copies: int = 4
    neighbor_copies: int = 0
    asynchronous: bool = False


def traits_of(cls: Any) -> Traits:
    """The :class:`Traits` an :class:`~gossip.algorithms.Algorithm` subclass declares."""
    requires = cls.requires
    return Traits(gradients=bool(requires.gradients), trains=bool(cls.trains),
                  takes_optimizer=bool(cls.takes_optimizer), compressor=requires.compressor,
                  complete=bool(requires.graph.complete), tunable=tuple(cls.tunable),
                  state_copies=int(cls.state_copies), neighbor_copies=int(cls.neighbor_copies),
                  asynchronous=bool(cls.asynchronous))


_AVERAGING = {"gradients": False, "trains": False}
_ALLREDUCE = {"compressor": "identity", "complete": True}

ALGORITHMS: dict[str, Traits] = {
    "gossip": Traits(**_AVERAGING, state_copies=3),
    "dpsgd": Traits(takes_optimizer=True, state_copies=4),
    "choco": Traits(gradients=False, takes_optimizer=True, tunable=("gamma",), state_copies=6),
    "choco-arcs": Traits(gradients=False, takes_optimizer=True, compressor="stateless",
                         tunable=("gamma",), state_copies=4, neighbor_copies=4),
    "deepsqueeze": Traits(gradients=False, takes_optimizer=True, tunable=("gamma",), state_copies=7),
    "dcd": Traits(gradients=False, state_copies=8),
    "ecd": Traits(gradients=False, state_copies=5),
    "lead": Traits(compressor="bounded-variance", state_copies=12),
    "lead-arcs": Traits(compressor="bounded-variance", state_copies=8, neighbor_copies=5),
    "prox-lead": Traits(compressor="bounded-variance", state_copies=12),
    "prox-lead-arcs": Traits(compressor="bounded-variance", state_copies=8, neighbor_copies=5),
    "powergossip": Traits(gradients=False, takes_optimizer=True, compressor="identity",
                          state_copies=4, neighbor_copies=1),
    "beer": Traits(state_copies=11),
    "beer-arcs": Traits(compressor="stateless", state_copies=9, neighbor_copies=10),
    "diging": Traits(compressor="identity", state_copies=15),
    "extra": Traits(compressor="identity", state_copies=11),
    "c-gt": Traits(tunable=("gamma",), state_copies=15),
    "c-gt-arcs": Traits(compressor="stateless", tunable=("gamma",), state_copies=10,
                        neighbor_copies=10),
    "push-sum": Traits(gradients=False, tunable=("gamma",), state_copies=9),
    "cpp": Traits(tunable=("gamma",), state_copies=15),
    "docom": Traits(tunable=("gamma",), state_copies=17),
    "motef": Traits(state_copies=11),
    "c-ecl": Traits(compressor="stateless", tunable=("theta",), state_copies=4, neighbor_copies=3),
    "onebit-adam": Traits(**_ALLREDUCE, state_copies=10),
    "zero-one-adam": Traits(**_ALLREDUCE, state_copies=13),
    "onebit-lamb": Traits(**_ALLREDUCE, state_copies=13),
    "signum": Traits(**_ALLREDUCE, state_copies=6),
    "adasum": Traits(**_ALLREDUCE, state_copies=12),
    "dadam": Traits(compressor="identity", state_copies=9),
    "tracked-amsgrad": Traits(compressor="identity", state_copies=15),
    "choco-amsgrad": Traits(tunable=("gamma",), state_copies=15),
    "desloc": Traits(compressor="identity", state_copies=6),
    "fedavg": Traits(takes_optimizer=True, compressor="stateless", state_copies=14),
    "fedprox": Traits(takes_optimizer=True, compressor="stateless", state_copies=14),
    "fedadam": Traits(takes_optimizer=True, compressor="stateless", state_copies=14),
    "fedyogi": Traits(takes_optimizer=True, compressor="stateless", state_copies=14),
    "fedadagrad": Traits(takes_optimizer=True, compressor="stateless", state_copies=14),
    "scaffold": Traits(compressor="stateless", state_copies=24),
    "cada": Traits(compressor="stateless", state_copies=16),
    "g-cada": Traits(compressor="stateless", state_copies=14),
    "pairwise-gossip": Traits(**_AVERAGING, compressor="identity", state_copies=2,
                              asynchronous=True),
    "ad-psgd": Traits(takes_optimizer=True, compressor="identity", state_copies=3,
                      asynchronous=True),
    "gossip-learning": Traits(gradients=False, takes_optimizer=True, compressor="identity",
                              state_copies=3, asynchronous=True),
    "async-sgp": Traits(gradients=False, compressor="identity", state_copies=4, asynchronous=True),
    "async-choco": Traits(gradients=False, takes_optimizer=True, compressor="stateless",
                          tunable=("gamma",), state_copies=4, neighbor_copies=2, asynchronous=True),
}
"""The built-in algorithms' :class:`Traits`, in registration order (a copy of what their classes
declare; a test compares it with :func:`traits_of` of each registered class)."""


# ---------------------------------------------------------------- live or static
def _loaded(module: str, attr: str) -> Any:
    """``module.attr`` when the module has been imported (fully enough to have it), else None."""
    return getattr(sys.modules.get(module), attr, None)


def algorithm_traits() -> dict[str, Traits]:
    """Every registered algorithm's :class:`Traits` (the built-in ones until
    :mod:`gossip.algorithms` is imported)."""
    registry = _loaded("gossip.algorithms", "REGISTRY")
    if registry is None:
        return dict(ALGORITHMS)
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


__all__ = ["ALGORITHMS", "COMPRESSOR_SPECS", "DEFAULT_L1", "ESTIMATORS", "MODELS", "NORMS",
           "OPTIMIZERS", "PLUGIN_COMPRESSOR", "PROBLEMS", "SCHEDULES", "Traits", "algorithm_traits",
           "algorithms", "compressor_usage", "problems", "traits_of"]
