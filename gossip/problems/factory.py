"""Build problems by name (what scripts call) and suggest step sizes for them.

Users add their own with :func:`register_problem` (or name a builder as ``module:function``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from gossip.catalog import DEFAULT_L1
from gossip.catalog import PROBLEMS as BUILTIN_PROBLEMS
from gossip.errors import ConfigError, PluginError
from gossip.problems.base import Problem
from gossip.problems.data import load_libsvm, partition, synthetic
from gossip.problems.glm import GLM, L1Logistic, Lasso, LeastSquares, Logistic
from topologies.registry import Registry

ProblemBuilder = Callable[..., Problem]
"""``build(**options) -> Problem``; options are :func:`make_problem`'s keywords (``n_nodes``,
``dim``, ``seed``, ``dtype``, ``device``, …): take the ones you need and ``**_`` the rest."""

BUILDERS = Registry("problem", error=ConfigError, plugin_error=PluginError, form="module:function")
"""Every problem builder by name (a :class:`topologies.registry.Registry`); see :func:`register_problem`."""
_BUILDERS: dict[str, ProblemBuilder] = BUILDERS.objects
PROBLEMS: list[str] = []
"""Registered problem names (kept in sync by :func:`register_problem`)."""



def register_problem(name: str, build: ProblemBuilder, *, replace: bool = False) -> ProblemBuilder:
    """Make ``make_problem(name, ...)`` and ``optimize.py --problem NAME`` call ``build``.

    The same ``build`` again is a no-op; a name taken by another builder is refused, naming it,
    unless ``replace`` is set.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ConfigError(f"problem name {name!r} must be a non-empty string without ':'")
    if not callable(build):
        raise ConfigError(f"register_problem({name!r}, ...): build must be callable, got {build!r}")
    BUILDERS.register(name, build, replace=replace)
    if name not in PROBLEMS:
        PROBLEMS.append(name)
    return build


def _default_l2(name: str, total_samples: int) -> float:
    if name == "least-squares":
        return 0.1  # CHOCO / LEAD papers' least-squares experiments
    if name == "lasso":
        return 0.05  # 0.025‖x‖² = (0.05/2)‖x‖², the LEAD paper's lasso
    return 1.0 / total_samples  # λ = 1/N, the usual logistic-regression choice


def make_problem(
    name: str,
    *,
    n_nodes: int = 8,
    dim: int = 200,
    samples_per_node: int = 200,
    heterogeneity: float = 1.0,
    common: float = 1.0,
    seed: int = 0,
    data: str | os.PathLike | None = None,
    partition_scheme: str = "iid",
    l2: float | None = None,
    l1: float | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> GLM:
    """A problem by registry name (built in: ``least-squares``, ``logistic``, ``lasso``,
    ``l1-logistic``; see :func:`register_problem`) or ``module:function``.

    Without ``data`` the samples come from :func:`~gossip.problems.data.synthetic` (``n_nodes``,
    ``dim``, ``samples_per_node``, ``heterogeneity``, ``common``, ``seed``). With ``data`` (a LibSVM
    file) the file's samples are split over ``n_nodes`` by
    :func:`~gossip.problems.data.partition` (``partition_scheme``: ``iid``, ``sorted``,
    ``dirichlet:ALPHA``; seeded by ``seed``); labels are the regression targets for least squares
    and must be binary for the logistic problems. ``dim`` and ``samples_per_node`` are then ignored.

    Defaults: ``l2`` = 0.1 (least squares), 0.05 (lasso), ``1/N`` with ``N`` the total number
    of samples (logistic); ``l1`` = 0.02 (lasso), 1e-3 (l1-logistic: about a third of the
    coordinates of ``x*`` are non-zero on the default synthetic data).
    """
    options = dict(n_nodes=n_nodes, dim=dim, samples_per_node=samples_per_node,
                   heterogeneity=heterogeneity, common=common, seed=seed, data=data,
                   partition_scheme=partition_scheme, l2=l2, l1=l1, dtype=dtype, device=device)
    build = BUILDERS.get(name)
    if not callable(build):
        raise ConfigError(f"{name!r} is not callable")
    problem = build(**options)
    if not isinstance(problem, Problem):
        raise ConfigError(f"problem builder {name!r} returned a {type(problem).__name__}, not a "
                           "gossip.problems.Problem")
    return problem


def _glm(name: str) -> ProblemBuilder:
    """The builder of one built-in generalized linear model."""
    def build(**options: Any) -> GLM:
        return _make_glm(name, **options)

    build.__doc__ = f"The built-in {name} problem (see make_problem)."
    return build


def _make_glm(
    name: str,
    *,
    n_nodes: int,
    dim: int,
    samples_per_node: int,
    heterogeneity: float,
    common: float,
    seed: int,
    data: str | os.PathLike | None,
    partition_scheme: str,
    l2: float | None,
    l1: float | None,
    dtype: torch.dtype,
    device: torch.device | str,
) -> GLM:
    if data is not None:
        X, y = load_libsvm(data, binary=True if name in ("logistic", "l1-logistic") else None)
        parts = partition(y, n_nodes, partition_scheme, seed)
        A = [X[p] for p in parts]
        b = [y[p] for p in parts]
    else:
        syn = synthetic(name, n_nodes, dim, samples_per_node, heterogeneity, seed, common=common)
        A, b = syn.A, syn.b
    total = sum(a.shape[0] for a in A)
    l2 = _default_l2(name, total) if l2 is None else l2
    kw = dict(dtype=dtype, device=device)
    if name == "least-squares":
        return LeastSquares(A, b, l2, **kw)
    if name == "logistic":
        return Logistic(A, b, l2, **kw)
    l1 = DEFAULT_L1[name] if l1 is None else l1
    if name == "lasso":
        return Lasso(A, b, l1, l2, **kw)
    return L1Logistic(A, b, l1, l2, **kw)


for _name in BUILTIN_PROBLEMS:
    register_problem(_name, _glm(_name))


def default_hparams(problem: Problem, estimator: str = "full") -> dict[str, float]:
    """Step sizes that work on ``problem`` (docs/algorithms/README.md, step sizes).

    ``eta = 1/L`` for full gradients; ``eta = 1/(6 L_max)`` for the sampled estimators (``sgd``,
    ``lsvrg``, ``saga``; SGD then converges to a noise floor, the VR estimators to ``x*``).
    The constants are returned too (``L``, ``L_max``, ``mu``).
    """
    s = problem.smoothness()
    if estimator == "full":
        eta = 1.0 / s.L
    elif estimator in ("sgd", "lsvrg", "saga"):
        eta = 1.0 / (6.0 * s.L_max)
    else:
        raise ConfigError(f"unknown gradient estimator {estimator!r}; choose one of full, sgd, lsvrg, saga")
    return {"eta": float(eta), "L": s.L, "L_max": s.L_max, "mu": s.mu}

