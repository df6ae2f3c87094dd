"""Build problems by name (what scripts call) and suggest step sizes for them."""

from __future__ import annotations

import os

import torch

from gossip.problems.base import Problem
from gossip.problems.data import load_libsvm, partition, synthetic
from gossip.problems.glm import GLM, L1Logistic, Lasso, LeastSquares, Logistic

PROBLEMS = ("least-squares", "logistic", "lasso", "l1-logistic")

DEFAULT_L1 = {"lasso": 0.02, "l1-logistic": 1e-3}
"""ALGORITHMS.md §11.6 uses l1 = 0.02 for the lasso; the logistic value keeps a sparse but
non-trivial solution on the §11.3 recipe."""


def _default_l2(name: str, total_samples: int) -> float:
    if name == "least-squares":
        return 0.1  # §11.2
    if name == "lasso":
        return 0.05  # §11.6: 0.025‖x‖² = (0.05/2)‖x‖²
    return 1.0 / total_samples  # §11.3: λ = 1/(n m)


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
    """A problem by name: ``least-squares``, ``logistic``, ``lasso`` or ``l1-logistic``.

    Without ``data`` the samples come from :func:`~gossip.problems.data.synthetic` (``n_nodes``,
    ``dim``, ``samples_per_node``, ``heterogeneity``, ``common``, ``seed``). With ``data`` (a LibSVM
    file) the file's samples are split over ``n_nodes`` by
    :func:`~gossip.problems.data.partition` (``partition_scheme``: ``iid``, ``sorted``,
    ``dirichlet:ALPHA``; seeded by ``seed``); labels are the regression targets for least squares
    and must be binary for the logistic problems. ``dim`` and ``samples_per_node`` are then ignored.

    Defaults: ``l2`` = 0.1 (least squares, §11.2), 0.05 (lasso, §11.6), ``1/N`` with ``N`` the
    total number of samples (logistic, §11.3); ``l1`` = 0.02 (lasso), 1e-3 (l1-logistic: about a
    third of the coordinates of ``x*`` are non-zero on the default synthetic data).
    """
    if name not in PROBLEMS:
        raise ValueError(f"unknown problem {name!r}; choose one of {PROBLEMS}")
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


def default_hparams(problem: Problem, estimator: str = "full") -> dict[str, float]:
    """Step sizes that work on ``problem`` (ALGORITHMS.md §4.4 and §5.3).

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
        raise ValueError(f"unknown gradient estimator {estimator!r}")
    return {"eta": float(eta), "L": s.L, "L_max": s.L_max, "mu": s.mu}

