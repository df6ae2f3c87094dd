"""Matrix-form simulators (numpy, float64) of decentralized ADMM and DLM, written from the
papers' recursions with the signless and signed Laplacians of the graph; the per-node code
must equal them. ``iterates[r]`` holds the models after r rounds (``iterates[0]`` = X⁰).

With ``A`` the 0/1 adjacency matrix, ``D`` the degrees, ``L₊ = D + A`` and ``L₋ = D − A``
(Shi, Ling, Yuan, Wu, Yin 2014)::

    ADMM:  ∇F(X^{k+1}) + Λ^k + 2cD X^{k+1} = c L₊ X^k;     Λ^{k+1} = Λ^k + c L₋ X^{k+1}
    DLM:   X^{k+1} = X^k − (2cD + ρI)^{-1} (∇F(X^k) + c L₋ X^k + Λ^k);   the same Λ step

with ``Λ⁰ = 0``. ADMM's first line is solved per node for quadratic ``f_i`` (``H_i``, ``c_i``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Array = np.ndarray


def laplacians(adjacency: Array) -> tuple[Array, Array, Array]:
    """``D``, ``L₊ = D + A``, ``L₋ = D − A`` of a 0/1 adjacency matrix."""
    A = (np.asarray(adjacency) != 0).astype(np.float64)
    np.fill_diagonal(A, 0.0)
    D = np.diag(A.sum(1))
    return D, D + A, D - A


def admm(X0: Array, adjacency: Array, quadratics: list[tuple[Array, Array]], c: float,
         T: int) -> list[Array]:
    """Decentralized ADMM on quadratic ``f_i(x) = ½ xᵀH_i x − c_iᵀx`` (``quadratics[i] =
    (H_i, c_i)``): ``(H_i + 2c d_i I) x_i^{k+1} = c (L₊ X^k)_i − λ_i^k + c_i``."""
    D, Lp, Lm = laplacians(adjacency)
    X = np.array(X0, dtype=np.float64)
    Lam = np.zeros_like(X)
    out = [X.copy()]
    dim = X.shape[1]
    for _ in range(T):
        rhs = c * (Lp @ X) - Lam
        X = np.stack([np.linalg.solve(H + 2 * c * D[i, i] * np.eye(dim), rhs[i] + ci)
                      for i, (H, ci) in enumerate(quadratics)])
        Lam = Lam + c * (Lm @ X)
        out.append(X.copy())
    return out


def dlm(X0: Array, adjacency: Array, grad: Callable[[Array], Array], c: float, rho: float,
        T: int) -> list[Array]:
    """DLM: ``X^{k+1} = X^k − (2cD + ρI)^{-1}(∇F(X^k) + c L₋ X^k + Λ^k)``, ``Λ += c L₋ X^{k+1}``."""
    D, _, Lm = laplacians(adjacency)
    X = np.array(X0, dtype=np.float64)
    Lam = np.zeros_like(X)
    step = 1.0 / (2 * c * np.diag(D) + rho)
    out = [X.copy()]
    for _ in range(T):
        X = X - step[:, None] * (grad(X) + c * (Lm @ X) + Lam)
        Lam = Lam + c * (Lm @ X)
        out.append(X.copy())
    return out
