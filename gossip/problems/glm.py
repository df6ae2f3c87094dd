"""Generalized linear models: least squares, logistic regression, and their L1 versions.

Node ``i`` holds ``m_i`` samples ``(a_l, b_l)`` (rows of ``A_i`` and entries of ``b_i``, stored on
the problem's device) and

    f_i(x) = (1/m_i) Σ_l φ(a_lᵀx, b_l) + (l2/2)‖x‖²,        r(x) = l1·‖x‖₁ (Lasso, L1Logistic)

with ``φ(z, b) = (z − b)²/2`` (least squares) or ``log(1 + exp(−b z))`` (logistic, ``b = ±1``).
A per-sample gradient is ``φ'(a_lᵀx, b_l)·a_l + l2·x``: one scalar per sample carries all the
data-dependent information, which is why SAGA keeps ``m_i`` scalars instead of ``m_i × d``
(see :mod:`gossip.problems.oracles`).

The L2 weight follows the ``(l2/2)‖x‖²`` convention: the lasso experiment's ``0.025‖x‖²`` (docs/experiments.md) is
``l2 = 0.05``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch

from gossip.errors import ConfigError
from gossip.problems.base import Problem, Smoothness
from gossip.problems.regularizers import L1
from gossip.problems.solvers import (
    least_squares_hessian,
    logistic_value_grad,
    solve_composite,
    solve_least_squares,
    solve_logistic,
)

ArrayLike = np.ndarray | torch.Tensor

DENSE_EIG_MAX = 3000
"""Largest Gram size for which curvature constants come from a dense eigendecomposition."""


def _as_numpy64(a: ArrayLike) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def _gram_extremes(A: np.ndarray) -> tuple[float, float]:
    """``λ_max`` and ``λ_min`` of ``AᵀA/m`` (``λ_min = 0`` when ``m < d``), in float64."""
    import scipy.linalg  # here, not on import: see gossip.problems.solvers
    import scipy.sparse.linalg

    m, d = A.shape
    if min(m, d) <= DENSE_EIG_MAX:
        G = (A @ A.T) if m < d else (A.T @ A)
        ev = scipy.linalg.eigvalsh(G / m)
        lam_max = float(ev[-1])
        lam_min = 0.0 if m < d else max(float(ev[0]), 0.0)
        return lam_max, lam_min
    op = scipy.sparse.linalg.LinearOperator(
        (d, d), matvec=lambda v: A.T @ (A @ v) / m, dtype=np.float64
    )
    lam_max = float(scipy.sparse.linalg.eigsh(op, k=1, which="LA", return_eigenvectors=False)[0])
    return lam_max, 0.0  # λ_min of a huge Gram matrix: use the safe lower bound 0


class GLM(Problem):
    """Base of the linear-model problems (see the module docstring for the math).

    Args:
        A: per node, the ``m_i × dim`` feature matrix (numpy or torch).
        b: per node, the ``m_i`` targets (regression) or ±1 labels (classification).
        l2: weight of ``(l2/2)‖x‖²`` inside every ``f_i``.
        l1: weight of ``r(x) = l1·‖x‖₁`` (0 = no regularizer; only the L1 subclasses expose it).
        dtype, device: where the data and every vector live.

    Attributes:
        A, b: lists of per-node tensors on ``device`` (read them, do not modify them).
    """

    linear_model = True
    curvature: ClassVar[float]
    """``sup_z φ''(z, b)``: 1 for squares, 1/4 for the logistic loss."""
    loss_name: ClassVar[str]

    def __init__(
        self,
        A: Sequence[ArrayLike],
        b: Sequence[ArrayLike],
        *,
        l2: float = 0.0,
        l1: float = 0.0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if len(A) == 0 or len(A) != len(b):
            raise ConfigError(
                f"need one (A_i, b_i) pair per node, got {len(A)} matrices and {len(b)} vectors"
            )
        if not dtype.is_floating_point:
            raise ConfigError(f"dtype must be a floating point type, got {dtype}")
        for name, v in (("l2", l2), ("l1", l1)):
            if not np.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {v}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.n_nodes = len(A)
        self.l2 = float(l2)
        self.l1 = float(l1)
        self.regularizer = L1(self.l1) if self.l1 > 0 else None
        self.A: list[torch.Tensor] = []
        self.b: list[torch.Tensor] = []
        dim = None
        for i, (Ai, bi) in enumerate(zip(A, b, strict=True)):
            Ai = torch.as_tensor(Ai).to(device=self.device, dtype=dtype).contiguous()
            bi = torch.as_tensor(bi).to(device=self.device, dtype=dtype).reshape(-1).contiguous()
            if Ai.dim() != 2 or Ai.shape[0] == 0:
                raise ConfigError(
                    f"A_{i} must be a non-empty 2-D matrix, got shape {tuple(Ai.shape)}"
                )
            if dim is None:
                dim = Ai.shape[1]
            if Ai.shape[1] != dim:
                raise ConfigError(f"A_{i} has {Ai.shape[1]} columns, A_0 has {dim}")
            if bi.numel() != Ai.shape[0]:
                raise ConfigError(
                    f"A_{i} has {Ai.shape[0]} rows but b_{i} has {bi.numel()} entries"
                )
            if not (torch.isfinite(Ai).all() and torch.isfinite(bi).all()):
                raise ConfigError(f"A_{i} or b_{i} contains NaN or Inf")
            self.A.append(Ai)
            self.b.append(bi)
        self.dim = int(dim)
        self._check_targets()
        self._np_cache: list[tuple[np.ndarray, np.ndarray]] | None = None

    def _check_targets(self) -> None:
        """Subclasses validate ``b`` (labels must be ±1 for the logistic loss)."""

    # ---- the scalar loss -------------------------------------------------------------------

    @abstractmethod
    def _phi(self, z: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``φ(z, b)`` elementwise."""
        ...

    @abstractmethod
    def _dphi(self, z: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``∂φ/∂z (z, b)`` elementwise (may overwrite ``z``)."""
        ...

    # ---- Problem API --------------------------------------------------------------------

    def n_samples(self, i: int) -> int:
        return self.A[self.check_node(i)].shape[0]

    def local_loss(self, i: int, x: torch.Tensor) -> float:
        i = self.check_node(i)
        z = torch.mv(self.A[i], x)
        val = self._phi(z, self.b[i]).mean()
        return float(val) + 0.5 * self.l2 * float(torch.dot(x, x))

    def coefficients(
        self, i: int, x: torch.Tensor, idx: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``φ'(a_lᵀx, b_l)`` for the samples ``idx`` of node ``i`` (all samples if None)."""
        i = self.check_node(i)
        if idx is None:
            return self._dphi(torch.mv(self.A[i], x), self.b[i])
        rows = self.A[i].index_select(0, idx)
        return self._dphi(torch.mv(rows, x), self.b[i].index_select(0, idx))

    def grad_full(self, i: int, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        i = self.check_node(i)
        if out is None:
            out = torch.empty_like(x)
        elif out.data_ptr() == x.data_ptr():
            raise ConfigError("grad_full: out must not alias x")
        c = self.coefficients(i, x)
        torch.mv(self.A[i].T, c, out=out)
        out.mul_(1.0 / self.A[i].shape[0])
        if self.l2:
            out.add_(x, alpha=self.l2)
        return out

    def sample_grads(self, i: int, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        i = self.check_node(i)
        rows = self.A[i].index_select(0, idx)
        c = self._dphi(torch.mv(rows, x), self.b[i].index_select(0, idx))
        g = rows * c.unsqueeze(1)
        if self.l2:
            g.add_(x, alpha=self.l2)
        return g

    def batch_grad(
        self, i: int, idx: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        i = self.check_node(i)
        if out is None:
            out = torch.empty_like(x)
        elif out.data_ptr() == x.data_ptr():
            raise ConfigError("batch_grad: out must not alias x")
        rows = self.A[i].index_select(0, idx)
        c = self._dphi(torch.mv(rows, x), self.b[i].index_select(0, idx))
        torch.mv(rows.T, c, out=out)
        out.mul_(1.0 / idx.numel())
        if self.l2:
            out.add_(x, alpha=self.l2)
        return out

    # ---- float64 side: constants, optimum -------------------------------------------------

    def numpy_data(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per node ``(A_i, b_i)`` as float64 numpy arrays (exactly the stored values; cached)."""
        if self._np_cache is None:
            self._np_cache = [
                (_as_numpy64(A), _as_numpy64(b)) for A, b in zip(self.A, self.b, strict=True)
            ]
        return self._np_cache

    def _smoothness(self) -> Smoothness:
        lmax, lmin = zip(*(_gram_extremes(A) for A, _ in self.numpy_data()), strict=True)
        row = max(float((A * A).sum(axis=1).max()) for A, _ in self.numpy_data())
        c = self.curvature
        mu = self.l2 + (min(lmin) if self.loss_name == "squares" else 0.0)
        return Smoothness(L=c * max(lmax) + self.l2, L_max=c * row + self.l2, mu=mu)

    def _global_L(self) -> float:
        """Smoothness of the average ``f`` (≤ ``smoothness().L``), for the central solver's step."""
        if self.dim > DENSE_EIG_MAX:
            return self.smoothness().L
        import scipy.linalg

        H, _ = least_squares_hessian(self.numpy_data(), 0.0)
        return self.curvature * float(scipy.linalg.eigvalsh(H)[-1]) + self.l2

    def objective64(self, x: np.ndarray) -> float:
        x = np.asarray(x, dtype=np.float64)
        if self.loss_name == "squares":
            val = 0.5 * self.l2 * float(x @ x)
            for A, b in self.numpy_data():
                r = A @ x - b
                val += float(r @ r) / (2 * A.shape[0] * self.n_nodes)
        else:
            val = logistic_value_grad(self.numpy_data(), self.l2, x)[0]
        return val + self.l1 * float(np.abs(x).sum())

    def _solve(self) -> np.ndarray:
        data = self.numpy_data()
        if self.l1 > 0:
            return solve_composite(data, self.loss_name, self.l2, self.regularizer.prox_numpy,
                                   self._global_L())
        if self.loss_name == "squares":
            return solve_least_squares(data, self.l2)
        return solve_logistic(data, self.l2)

    def __repr__(self) -> str:
        sizes = sorted({A.shape[0] for A in self.A})
        m = sizes[0] if len(sizes) == 1 else f"{sizes[0]}..{sizes[-1]}"
        return (
            f"{type(self).__name__}(n_nodes={self.n_nodes}, dim={self.dim}, samples_per_node={m}, "
            f"l2={self.l2}, l1={self.l1}, dtype={self.dtype}, device={self.device})"
        )


class LeastSquares(GLM):
    """``f_i(x) = ‖A_i x − b_i‖²/(2 m_i) + (l2/2)‖x‖²`` (docs/experiments.md#least-squares with ``l2 = 0.1``)."""

    curvature = 1.0
    loss_name = "squares"
    quadratic = True

    def __init__(self, A, b, l2: float = 0.0, *, dtype=torch.float32, device="cpu"):
        super().__init__(A, b, l2=l2, l1=0.0, dtype=dtype, device=device)

    def local_quadratic(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``H_i = A_iᵀA_i/m_i + l2·I``, ``c_i = A_iᵀb_i/m_i`` (float64; the smooth part only)."""
        A, b = self.numpy_data()[self.check_node(i)]
        return A.T @ A / A.shape[0] + self.l2 * np.eye(self.dim), A.T @ b / A.shape[0]

    def _phi(self, z, b):
        return 0.5 * (z - b).square()

    def _dphi(self, z, b):
        return z.sub_(b)


class Lasso(LeastSquares):
    """Least squares plus ``r(x) = l1·‖x‖₁`` applied once to the average (docs/experiments.md#lasso)."""

    def __init__(self, A, b, l1: float, l2: float = 0.0, *, dtype=torch.float32, device="cpu"):
        if not l1 > 0:
            raise ConfigError(f"Lasso needs l1 > 0, got {l1} (use LeastSquares for l1 = 0)")
        GLM.__init__(self, A, b, l2=l2, l1=l1, dtype=dtype, device=device)


class Logistic(GLM):
    """``f_i(x) = (1/m_i) Σ_l log(1 + exp(−b_l a_lᵀx)) + (l2/2)‖x‖²`` with labels ``b_l = ±1``."""

    curvature = 0.25
    loss_name = "logistic"

    def __init__(self, A, b, l2: float, *, dtype=torch.float32, device="cpu"):
        if not l2 > 0:
            raise ConfigError(
                f"Logistic needs l2 > 0 (without it separable data has no minimizer), got {l2}"
            )
        super().__init__(A, b, l2=l2, l1=0.0, dtype=dtype, device=device)

    def _check_targets(self) -> None:
        for i, b in enumerate(self.b):
            if not bool(((b == 1) | (b == -1)).all()):
                bad = b[(b != 1) & (b != -1)][0].item()
                raise ConfigError(f"logistic labels must be +1 or -1; node {i} has label {bad}")

    def _phi(self, z, b):
        z = z.mul_(b).neg_()
        return torch.logaddexp(torch.zeros_like(z), z)  # log(1 + e^{−bz}), exact for all z

    def _dphi(self, z, b):
        # d/dz log(1 + e^{−bz}) = −b σ(−bz)
        return z.mul_(b).neg_().sigmoid_().mul_(b).neg_()


class L1Logistic(Logistic):
    """Logistic loss + ``(l2/2)‖x‖²`` in every ``f_i``, plus ``r(x) = l1·‖x‖₁`` once."""

    def __init__(self, A, b, l1: float, l2: float = 0.0, *, dtype=torch.float32, device="cpu"):
        if not l1 > 0:
            raise ConfigError(f"L1Logistic needs l1 > 0, got {l1} (use Logistic for l1 = 0)")
        GLM.__init__(self, A, b, l2=l2, l1=l1, dtype=dtype, device=device)
