"""Central float64 solvers that give the exact optimum ``x*`` of the convex problems.

They see the whole data set (all nodes' ``A_i``, ``b_i`` as float64 numpy arrays) and solve
``min_x (1/n) Σ_i f_i(x) + r(x)`` to machine precision, so that "distance to optimum" curves of
decentralized runs can go down to 1e-25:

* least squares + L2: one linear solve of the normal equations;
* logistic + L2: Newton's method with backtracking (L-BFGS for large ``dim``);
* anything + L1: FISTA with adaptive restart, finished by plain proximal-gradient steps, until the
  relative change of a step is below ``1e-14``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from gossip.errors import ConfigError

# scipy is imported by the solvers that use it, when they first run: problems built without an
# exact optimum (and the training code, which imports gossip.problems.data) never load it.

log = logging.getLogger(__name__)

Data = Sequence[tuple[np.ndarray, np.ndarray]]
"""Per node ``(A_i, b_i)`` in float64."""

NEWTON_MAX_DIM = 4000
"""Above this dimension the logistic solver uses L-BFGS instead of dense Newton steps."""


def _weights(data: Data) -> list[float]:
    """``1/(n m_i)``: the weight of one sample of node ``i`` in the average objective."""
    n = len(data)
    return [1.0 / (n * A.shape[0]) for A, _ in data]


def least_squares_hessian(data: Data, l2: float) -> tuple[np.ndarray, np.ndarray]:
    """``H = Σ_i A_iᵀA_i/(n m_i) + l2·I`` and ``c = Σ_i A_iᵀ b_i/(n m_i)``."""
    d = data[0][0].shape[1]
    H = l2 * np.eye(d)
    c = np.zeros(d)
    for (A, b), w in zip(data, _weights(data), strict=True):
        H += w * (A.T @ A)
        c += w * (A.T @ b)
    return H, c


def solve_least_squares(data: Data, l2: float) -> np.ndarray:
    """Minimizer of ``(1/n) Σ_i ‖A_i x − b_i‖²/(2 m_i) + (l2/2)‖x‖²`` (normal equations)."""
    import scipy.linalg

    H, c = least_squares_hessian(data, l2)
    try:
        return scipy.linalg.solve(H, c, assume_a="pos")
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
        # singular (l2 = 0 and rank-deficient data): the minimum-norm solution
        return scipy.linalg.lstsq(H, c)[0]


def logistic_value_grad(data: Data, l2: float, x: np.ndarray) -> tuple[float, np.ndarray]:
    """``f(x)`` and ``∇f(x)`` of ``(1/n) Σ_i (1/m_i) Σ_l log(1 + exp(−b_l a_lᵀx)) + (l2/2)‖x‖²``."""
    from scipy.special import expit

    val = 0.5 * l2 * float(x @ x)
    grad = l2 * x
    for (A, b), w in zip(data, _weights(data), strict=True):
        z = b * (A @ x)
        val += w * float(np.logaddexp(0.0, -z).sum())
        grad = grad - w * (A.T @ (b * expit(-z)))
    return val, grad


def solve_logistic(data: Data, l2: float, gtol: float = 1e-13) -> np.ndarray:
    """Minimizer of the L2-regularized logistic loss (labels ±1).

    Newton's method with Armijo backtracking from ``x = 0`` until ``‖∇f‖ ≤ gtol`` (quadratic
    convergence, so this is machine precision). Newton systems are solved densely up to
    :data:`NEWTON_MAX_DIM` dimensions, above by conjugate gradients with Hessian-vector products
    (the ``d × d`` Hessian is never formed).
    """
    import scipy.linalg
    import scipy.sparse.linalg
    from scipy.special import expit

    d = data[0][0].shape[1]
    ws = _weights(data)

    def newton_step(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        curv = [expit(b * (A @ x)) for A, b in data]
        curv = [s * (1.0 - s) for s in curv]
        if d <= NEWTON_MAX_DIM:
            H = l2 * np.eye(d)
            for (A, _), w, c in zip(data, ws, curv, strict=True):
                H += w * ((A.T * c) @ A)
            return scipy.linalg.solve(H, g, assume_a="pos")

        def hessp(p: np.ndarray) -> np.ndarray:
            out = l2 * p
            for (A, _), w, c in zip(data, ws, curv, strict=True):
                out = out + w * (A.T @ (c * (A @ p)))
            return out

        op = scipy.sparse.linalg.LinearOperator((d, d), matvec=hessp, dtype=np.float64)
        step, _ = scipy.sparse.linalg.cg(op, g, rtol=1e-12, atol=0.0, maxiter=10 * d)
        return step

    x = np.zeros(d)
    val, g = logistic_value_grad(data, l2, x)
    for _ in range(200):
        if np.linalg.norm(g) <= gtol:
            break
        step = newton_step(x, g)
        slope = float(g @ step)
        t = 1.0
        while True:
            x_new = x - t * step
            val_new, g_new = logistic_value_grad(data, l2, x_new)
            if val_new <= val - 1e-4 * t * slope or t < 1e-10:
                break
            t *= 0.5
        if t < 1e-10 and val_new > val:  # no progress possible in floating point
            break
        x, val, g = x_new, val_new, g_new
    else:
        log.warning("logistic Newton solver stopped after 200 steps with ‖∇f‖ = %.2e",
                    np.linalg.norm(g))
    return x


def fista(
    grad: Callable[[np.ndarray], np.ndarray],
    prox: Callable[[np.ndarray, float], np.ndarray],
    L: float,
    x0: np.ndarray,
    tol: float = 1e-14,
    max_iter: int = 1_000_000,
) -> np.ndarray:
    """Minimize ``f + r`` (f L-smooth, r proximable) to a relative step change below ``tol``.

    FISTA with gradient-based adaptive restart (O'Donoghue & Candès) gets near the optimum at the
    accelerated rate; plain proximal-gradient steps (step ``1/L``) then finish, since for them the
    step length is exactly the optimality residual. ``prox(v, eta)`` is ``prox_{eta r}(v)``.
    """
    eta = 1.0 / L
    x = x0.copy()
    y = x.copy()
    theta = 1.0
    it = 0

    def small(step: np.ndarray, ref: np.ndarray) -> bool:
        return np.linalg.norm(step) <= tol * max(np.linalg.norm(ref), 1e-300)

    while it < max_iter:
        it += 1
        x_new = prox(y - eta * grad(y), eta)
        if small(x_new - x, x_new):
            x = x_new
            break
        if float((y - x_new) @ (x_new - x)) > 0:  # momentum points uphill: restart
            theta = 1.0
            y = x_new.copy()
        else:
            theta_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * theta * theta))
            y = x_new + ((theta - 1.0) / theta_new) * (x_new - x)
            theta = theta_new
        x = x_new
    while it < max_iter:
        it += 1
        x_new = prox(x - eta * grad(x), eta)
        done = small(x_new - x, x_new)
        x = x_new
        if done:
            return x
    log.warning("proximal gradient solver hit max_iter=%d before a relative change of %.0e",
                max_iter, tol)
    return x


def solve_composite(
    data: Data,
    loss: str,
    l2: float,
    prox: Callable[[np.ndarray, float], np.ndarray],
    L: float,
) -> np.ndarray:
    """Minimizer of ``(1/n) Σ f_i + (l2/2)‖x‖² + r`` with ``loss`` "squares" or "logistic"."""
    d = data[0][0].shape[1]
    if loss == "squares":
        H, c = least_squares_hessian(data, l2)

        def grad(x: np.ndarray) -> np.ndarray:
            return H @ x - c

        # a smooth warm start: the ridge solution
        x0 = solve_least_squares(data, l2) if l2 > 0 else np.zeros(d)
    elif loss == "logistic":

        def grad(x: np.ndarray) -> np.ndarray:
            return logistic_value_grad(data, l2, x)[1]

        x0 = np.zeros(d)
    else:
        raise ConfigError(f"unknown loss {loss!r}; solve_composite takes 'squares' or 'logistic'")
    return fista(grad, prox, L, x0)
