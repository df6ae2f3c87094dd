"""What the nodes optimize: the :class:`Problem` base class.

The global problem is ``min_x f(x) + r(x)`` with ``f = (1/n) Σ_i f_i``: node ``i`` holds the
smooth local function ``f_i`` (its data lives on the problem's torch device), ``r`` is an optional
non-smooth regularizer shared by all nodes and applied **once** to the average (a per-node prox
with ``r`` solves ``(1/n) Σ f_i + r``, not ``Σ f_i + r``; docs/algorithms/prox-lead.md).

Algorithms never call a problem directly: they ask it for an
:class:`~gossip.problems.oracles.Oracle` (``problem.oracle(i, generator, estimator)``) that owns
the node's gradient-estimator state.
Metrics use :meth:`Problem.objective` and :meth:`Problem.solution` (the exact optimum, computed
centrally in float64 and cached).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from gossip.errors import ConfigError
from gossip.problems.oracles import Oracle, OracleFactory, make_oracle

if TYPE_CHECKING:
    from gossip.problems.regularizers import Regularizer


@dataclass(frozen=True)
class Smoothness:
    """Curvature constants of a problem (float64 numbers, computed once).

    Attributes:
        L: ``max_i λ_max`` of the local Hessian bound — step size ``1/L`` is safe for every node.
        L_max: the largest per-sample smoothness ``max_{i,l} L_{i,l}`` (equals ``L`` when the
            problem is not a finite sum) — sets the step of variance-reduced estimators
            (``1/(6 L_max)``).
        mu: a lower bound on the local strong-convexity constants, ``min_i μ_i`` (0 if some ``f_i``
            is not strongly convex).
    """

    L: float
    L_max: float
    mu: float


class Problem(ABC):
    """A decentralized problem ``min_x (1/n) Σ_i f_i(x) + r(x)`` over torch tensors.

    Subclasses set ``n_nodes``, ``dim``, ``dtype``, ``device`` and ``regularizer`` and implement
    :meth:`local_loss`, :meth:`grad_full`, :meth:`_smoothness` and :meth:`_solve`. Finite sums
    (``f_i = (1/m_i) Σ_l f_{i,l}``) also implement :meth:`n_samples` and :meth:`sample_grads`, which
    unlocks the stochastic estimators (``sgd``, ``lsvrg``, ``saga``).

    Vectors are 1-D tensors of length ``dim`` with the problem's dtype and device. ``out``
    arguments must not alias the input ``x``.
    """

    n_nodes: int
    dim: int
    dtype: torch.dtype
    device: torch.device
    regularizer: Regularizer | None = None

    linear_model: ClassVar[bool] = False
    """``f_i(x) = (1/m) Σ_l φ(a_lᵀx, b_l) + (l2/2)‖x‖²`` with data ``A[i]``, ``b[i]`` and
    ``_dphi`` (:class:`~gossip.problems.glm.GLM`): the variance-reduced oracles then keep one
    scalar per sample instead of a gradient."""

    quadratic: ClassVar[bool] = False
    """Every ``f_i`` is a quadratic ``½ xᵀH_i x − c_iᵀx + const``: :meth:`local_quadratic` gives
    ``(H_i, c_i)`` and :meth:`local_prox` solves a node's proximal subproblem exactly (what
    decentralized ADMM's local step needs)."""

    block_gradients: ClassVar[bool] = False
    """:meth:`grad_full_block` computes several nodes' gradients in one batched operation with
    the same bits as :meth:`grad_full` node by node (what the ``full`` oracle's block path,
    :meth:`~gossip.problems.oracles.Oracle.grad_block`, asks of a problem)."""

    _smooth_cache: Smoothness | None = None
    _solution_cache: np.ndarray | None = None
    _prox_factors: dict[tuple[int, float], tuple[torch.Tensor, torch.Tensor]] | None = None

    def check_node(self, i: int) -> int:
        """``i`` as an int, or a :class:`ConfigError` naming the valid range."""
        if not isinstance(i, int | np.integer) or not 0 <= int(i) < self.n_nodes:
            raise ConfigError(f"node index must be an int in [0, {self.n_nodes}), got {i!r}")
        return int(i)

    # ---- values and gradients -------------------------------------------------------------

    @abstractmethod
    def local_loss(self, i: int, x: torch.Tensor) -> float:
        """``f_i(x)``: node ``i``'s smooth loss (without ``r``)."""

    def objective(self, x: torch.Tensor) -> float:
        """``(1/n) Σ_i f_i(x) + r(x)`` for one vector ``x`` (the averaged model, say)."""
        total = sum(self.local_loss(i, x) for i in range(self.n_nodes)) / self.n_nodes
        if self.regularizer is not None:
            total += self.regularizer.value(x)
        return float(total)

    @abstractmethod
    def grad_full(self, i: int, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``∇f_i(x)``, written into ``out`` when given (``out`` must not alias ``x``)."""

    def grad_full_block(self, nodes: Sequence[int], X: torch.Tensor,
                        out: torch.Tensor) -> torch.Tensor:
        """``out[k] = ∇f_{nodes[k]}(X[k])`` for every k, in one batched operation, the same bits
        as :meth:`grad_full` on each row (only for a problem with :attr:`block_gradients`:
        elementwise arithmetic rounds the same in a batch; a matrix product through BLAS may
        not, its kernels round by size and alignment)."""
        raise ConfigError(f"{type(self).__name__} has no block path for its gradients "
                          "(block_gradients is False): ask grad_full node by node")

    # ---- exact local solves (quadratic f_i) ------------------------------------------------------

    def local_quadratic(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(H_i, c_i)`` in float64 with ``f_i(x) = ½ xᵀH_i x − c_iᵀx + const``, for a problem
        whose ``f_i`` are quadratic (:attr:`quadratic`); :class:`ConfigError` for any other."""
        raise ConfigError(
            f"{type(self).__name__}'s local functions are not quadratic, so a node's subproblem "
            "has no closed-form solution (an exact local solve, as decentralized ADMM takes); "
            "use a gradient method (dlm: linearized ADMM, extra, lead) or a quadratic problem "
            "(least-squares, consensus)")

    def local_prox(self, i: int, v: torch.Tensor, eta: float,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """``argmin_x f_i(x) + ‖x − v‖²/(2η)``, the proximal step of node ``i``'s own ``f_i``,
        solved exactly for quadratic ``f_i``: ``(H_i + I/η) x = c_i + v/η``, with a Cholesky
        factor computed once per ``(i, η)`` in float64 and the solve in float64 (``out`` may
        alias ``v``). :class:`ConfigError` for a problem that is not :attr:`quadratic`."""
        i = self.check_node(i)
        if not (np.isfinite(eta) and eta > 0):
            raise ConfigError(f"local_prox needs a step eta > 0, got {eta}")
        if self._prox_factors is None:
            self._prox_factors = {}
        key = (i, float(eta))
        factor = self._prox_factors.get(key)
        if factor is None:
            H, c = self.local_quadratic(i)
            A = np.asarray(H, dtype=np.float64) + np.eye(self.dim) / eta
            chol = torch.linalg.cholesky(torch.from_numpy(A).to(self.device))
            factor = self._prox_factors[key] = (
                chol, torch.from_numpy(np.asarray(c, dtype=np.float64)).to(self.device))
        chol, c = factor
        rhs = v.to(torch.float64).div(eta).add_(c).unsqueeze(1)
        x = torch.cholesky_solve(rhs, chol).squeeze(1)
        if out is None:
            return x.to(v.dtype)
        return out.copy_(x)

    # ---- finite sums ------------------------------------------------------------------------

    def n_samples(self, i: int) -> int | None:
        """``m_i``, the number of samples of node ``i``; None when ``f_i`` is not a finite sum."""
        return None

    @property
    def finite_sum(self) -> bool:
        """True when every ``f_i`` is an average of per-sample losses (stochastic estimators)."""
        return self.n_samples(0) is not None

    def sample_grads(self, i: int, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per-sample gradients ``∇f_{i,l}(x)``, ``l`` in ``idx``: a ``len(idx) × dim`` tensor."""
        raise ConfigError(
            f"{type(self).__name__} is not a finite sum: it has no per-sample gradients"
        )

    def batch_grad(
        self, i: int, idx: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The mini-batch gradient ``(1/|idx|) Σ_{l∈idx} ∇f_{i,l}(x)``."""
        g = self.sample_grads(i, idx, x).mean(dim=0)
        if out is None:
            return g
        return out.copy_(g)

    # ---- constants and the optimum -------------------------------------------------------------

    def smoothness(self) -> Smoothness:
        """``L``, ``L_max`` and ``mu`` (computed once in float64, then cached)."""
        if self._smooth_cache is None:
            self._smooth_cache = self._smoothness()
        return self._smooth_cache

    @abstractmethod
    def _smoothness(self) -> Smoothness:
        """Compute the constants (called once)."""

    def solution(
        self, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """The exact minimizer ``x*`` of ``f + r``, solved centrally in float64 and cached.

        Returned in the problem's dtype/device unless others are asked for (use
        ``dtype=torch.float64`` to measure errors below float32 precision).
        """
        return torch.tensor(self.solution_numpy()).to(
            dtype=self.dtype if dtype is None else dtype,
            device=self.device if device is None else device,
        )

    def solution_numpy(self) -> np.ndarray:
        """``x*`` as a float64 numpy array (cached; do not modify it)."""
        if self._solution_cache is None:
            x = np.asarray(self._solve(), dtype=np.float64)
            x.setflags(write=False)
            self._solution_cache = x
        return self._solution_cache

    @abstractmethod
    def _solve(self) -> np.ndarray:
        """Compute ``x*`` in float64 (called once)."""

    def optimal_value(self) -> float:
        """``f(x*) + r(x*)``, evaluated in float64."""
        return self.objective64(self.solution_numpy())

    def objective64(self, x: np.ndarray) -> float:
        """The objective at a numpy vector, evaluated in float64 (for ``f(x) − f*`` metrics)."""
        return self.objective(torch.as_tensor(np.asarray(x, dtype=np.float64)).to(
            dtype=self.dtype, device=self.device))

    def initial_point(self) -> torch.Tensor:
        """Where every node starts by default: zeros."""
        return torch.zeros(self.dim, dtype=self.dtype, device=self.device)

    # ---- what algorithms use ------------------------------------------------------------------

    def oracle(
        self,
        i: int,
        generator: torch.Generator | None = None,
        estimator: str = "full",
        batch_size: int = 1,
        p: float | None = None,
    ) -> Oracle:
        """Node ``i``'s gradient oracle (docs/algorithms/prox-lead.md).

        Args:
            i: the node.
            generator: the node's ``torch.Generator``; all sampling randomness comes from it (needed
                by every estimator but ``full``).
            estimator: ``"full"`` (exact ``∇f_i``), ``"sgd"`` (mini-batch), ``"lsvrg"`` (loopless
                SVRG) or ``"saga"``.
            batch_size: samples per gradient estimate (stochastic estimators; ``full`` ignores it).
            p: LSVRG refresh probability (default ``1/m_i``).

        Raises:
            ValueError: unknown estimator, stochastic estimator on a problem without a finite sum,
                ``batch_size`` out of ``[1, m_i]``, or a missing generator.
        """
        return make_oracle(self, i, generator, estimator, batch_size, p)

    def oracles(self, estimator: str = "full", batch_size: int = 1,
                p: float | None = None) -> OracleFactory:
        """Every node's oracle, for ``Engine(oracles=...)``: ``factory(i, generator)`` is
        :meth:`oracle`, and where the estimator allows (``full`` on a problem with
        :attr:`block_gradients`) the engine takes a block's oracles as one object of arrays
        (:class:`~gossip.problems.oracles.FullGradientRows`) instead of one per node: the same
        gradients and counters, without a per-node object before one is read."""
        return OracleFactory(self, estimator, batch_size, p)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_nodes={self.n_nodes}, dim={self.dim}, "
            f"dtype={self.dtype}, device={self.device})"
        )
