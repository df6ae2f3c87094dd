"""Spectral quantities of a mixing matrix: rho = ||W - J||_2, gap = 1 - rho, beta = ||I - W||_2.

Small matrices (n <= DENSE_MAX_N) are handled densely: `numpy.linalg.eigvalsh` for symmetric W,
singular values for non-symmetric W.  Larger ones use `scipy.sparse.linalg`:

* symmetric, nonnegative, doubly stochastic W (every weight rule of `mixing.py`):
  lambda_2 comes from the smallest nonzero eigenvalue mu_2 of the Laplacian L = I - W, found with
  Lanczos on the pseudo-inverse of L applied through a sparse LU factorization of L with one
  node grounded; lambda_min from shift-invert Lanczos on L just above its Gershgorin bound.  Both
  converge in a few dozen iterations even when the gap is tiny (ring of 10,000 nodes: gap
  1.3e-7 to ~10 digits, well under a second).  This path is taken when the LU factor stays small
  (reverse Cuthill-McKee bandwidth <= n / 8 and bandwidth * n <= LU_BUDGET: rings, tori,
  grids, geometric graphs).
  Otherwise (expanders: exponential, random regular, Erdos-Renyi) plain Lanczos on W - 2J and W
  is used; it converges fast because such graphs have a large gap.  If it does not converge
  (tiny gap on a wide-band graph), the LU path is tried anyway.
* non-symmetric doubly stochastic W (directed exponential): rho^2 = lambda_2(W^T W), computed as
  above; beta from the largest eigenvalue of (I - W)^T (I - W).
* anything else (not doubly stochastic, negative weights): ARPACK `svds`/`eigsh` on W - J as a
  LinearOperator, to tolerance `ARPACK_TOL`; with gaps below ~1e-6 it may be slow or inaccurate.

Absolute accuracy of the dense path is about 1e-15, so gaps below ~1e-12 are not resolved there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse.csgraph import connected_components, reverse_cuthill_mckee

__all__ = ["Spectrum", "spectrum", "rho", "spectral_gap", "beta", "lambda2", "DENSE_MAX_N"]

DENSE_MAX_N = 2000
"""Up to this n, matrices are built and analysed densely."""
LU_BUDGET = 4e7
"""Largest RCM-bandwidth * n (a bound on the LU's size) for which sparse LU is used."""
ARPACK_TOL = 1e-10
"""Tolerance of the generic ARPACK fallbacks."""
SYMMETRY_TOL = 1e-12
STOCHASTIC_TOL = 1e-10


@dataclass(frozen=True)
class Spectrum:
    """Spectral summary of W (lambda2 / lambda_min are None for non-symmetric W)."""

    rho: float
    gap: float
    beta: float
    lambda2: float | None
    lambda_min: float | None
    symmetric: bool
    method: str


# ---------------------------------------------------------------------------------------------
# small predicates


def _as_matrix(W) -> np.ndarray | sp.csr_array:
    """W as a float64 dense array or CSR array (large dense inputs become sparse)."""
    if sp.issparse(W):
        return sp.csr_array(W, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"W must be a square matrix, got shape {W.shape}")
    return W


def _max_abs(A) -> float:
    """Largest absolute entry of a dense or sparse array (0 for an empty sparse array)."""
    if sp.issparse(A):
        return float(np.abs(A.data).max()) if A.nnz else 0.0
    return float(np.abs(A).max()) if A.size else 0.0


def _is_symmetric(W) -> bool:
    """True when W equals its transpose within SYMMETRY_TOL."""
    return _max_abs(W - W.T) <= SYMMETRY_TOL


def _is_doubly_stochastic(W) -> bool:
    """True when every row and column of W sums to 1 within STOCHASTIC_TOL."""
    rows = np.asarray(W.sum(axis=1)).ravel()
    cols = np.asarray(W.sum(axis=0)).ravel()
    worst = max(np.abs(rows - 1).max(), np.abs(cols - 1).max())
    return bool(worst <= STOCHASTIC_TOL)


def _is_nonnegative(W) -> bool:
    """True when no entry of W is negative."""
    data = W.data if sp.issparse(W) else W
    return data.size == 0 or float(data.min()) >= 0


def _connected(W: sp.csr_array) -> bool:
    """True when the support of W is (weakly) connected."""
    return connected_components(W, directed=True, connection="weak")[0] == 1


def _lu_feasible(A: sp.csr_array) -> bool:
    """True when a sparse LU of A stays small: A has a narrow band after RCM ordering.

    Graphs with small separators (rings, tori, grids, geometric graphs) qualify; expanders, whose
    bandwidth is a sizable fraction of n whatever the ordering, do not (and have large gaps).
    """
    n = A.shape[0]
    perm = reverse_cuthill_mckee(sp.csr_array(A), symmetric_mode=True)
    P = A[perm][:, perm].tocoo()
    bandwidth = int(np.abs(P.row - P.col).max()) if P.nnz else 0
    return bandwidth * 8 <= n and bandwidth * n <= LU_BUDGET


def _solver(A: sp.sparray):
    """solve(b) for a symmetric, nonsingular, diagonally dominant sparse A (no pivoting)."""
    lu = spla.splu(sp.csc_array(A), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                   options={"SymmetricMode": True})
    return lu.solve


# ---------------------------------------------------------------------------------------------
# symmetric, nonnegative, doubly stochastic M (large, sparse)


def _v0(n: int) -> np.ndarray:
    """Fixed ARPACK start vector: the same spectrum on every process, to the last bit."""
    return np.random.default_rng(20240601).standard_normal(n)


def _mean_op(n: int, matvec) -> spla.LinearOperator:
    """Symmetric LinearOperator of size n from a matvec."""
    return spla.LinearOperator((n, n), matvec=matvec, rmatvec=matvec, dtype=np.float64)


def _laplacian_mu2(M: sp.csr_array) -> float:
    """Smallest nonzero eigenvalue of L = I - M via Lanczos on L^+ (grounded-node sparse LU)."""
    n = M.shape[0]
    L = (sp.eye_array(n, format="csr") - M).tocsc()
    solve = _solver(L[:-1, :-1])

    def pinv(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        x = x - x.mean()
        y = np.zeros(n)
        y[:-1] = solve(x[:-1])
        return y - y.mean()

    top = spla.eigsh(_mean_op(n, pinv), k=1, which="LA", v0=_v0(n),
                     return_eigenvectors=False)[0]
    return float(1.0 / top)


def _lambda_max_shift_invert(A: sp.csr_array) -> float:
    """Largest eigenvalue of symmetric A by shift-invert Lanczos just above its Gershgorin bound."""
    bound = float(np.abs(A).sum(axis=1).max())
    sigma = bound + max(1e-3, 1e-3 * bound)
    n = A.shape[0]
    solve = _solver(A - sigma * sp.eye_array(n, format="csr"))
    inverse = _mean_op(n, lambda x: solve(np.ravel(x)))
    value = spla.eigsh(A, k=1, sigma=sigma, which="LM", OPinv=inverse,
                       v0=_v0(n), return_eigenvectors=False)[0]
    return float(value)


def _symmetric_stochastic(M: sp.csr_array, need_min: bool = True) -> tuple[float, float, str]:
    """(lambda_2, lambda_min) of a symmetric nonnegative doubly stochastic sparse M, and the method.

    lambda_min is nan when need_min is False.
    """
    n = M.shape[0]
    connected = _connected(M)
    lmin = float("nan")
    if not _lu_feasible(M):
        ncv = min(n, 40)

        def shifted(x: np.ndarray) -> np.ndarray:  # M - 2J: moves the eigenvalue 1 of ones to -1
            x = np.ravel(x)
            return M @ x - 2.0 * x.mean()

        try:
            lambda2_ = 1.0
            if connected:
                lambda2_ = float(spla.eigsh(_mean_op(n, shifted), k=1, which="LA", ncv=ncv,
                                            maxiter=100, v0=_v0(n),
                                            return_eigenvectors=False)[0])
            if need_min:
                lmin = float(spla.eigsh(M, k=1, which="SA", ncv=ncv, maxiter=100,
                                        v0=_v0(n), return_eigenvectors=False)[0])
            return lambda2_, lmin, "lanczos"
        except spla.ArpackNoConvergence:
            pass  # tiny gap on a wide-band graph: fall back to the LU path
    lambda2_ = 1.0 - _laplacian_mu2(M) if connected else 1.0
    if need_min:
        lmin = 1.0 - _lambda_max_shift_invert(sp.eye_array(n, format="csr") - M)
    return lambda2_, lmin, "sparse-lu"


# ---------------------------------------------------------------------------------------------
# spectrum


def _dense_spectrum(W: np.ndarray) -> Spectrum:
    """Exact spectrum of a dense W."""
    n = W.shape[0]
    J = np.full((n, n), 1.0 / n)
    if _is_symmetric(W):
        W = (W + W.T) / 2
        if _is_doubly_stochastic(W):
            eig = np.linalg.eigvalsh(W)  # ascending; 1 belongs to the eigenvector of ones
            drop = int(np.argmin(np.abs(eig - 1.0)))
            rest = np.delete(eig, drop)
            rho_ = float(np.abs(rest).max()) if rest.size else 0.0
            lambda2_ = float(rest[-1]) if rest.size else 0.0
        else:
            eig = np.linalg.eigvalsh(W)
            rho_ = float(np.abs(np.linalg.eigvalsh(W - J)).max())
            lambda2_ = float(eig[-2]) if n > 1 else 0.0
        lmin = float(eig[0])
        beta_ = float(np.abs(1.0 - eig).max())
        return Spectrum(rho_, 1.0 - rho_, beta_, lambda2_, lmin, True, "dense-eigvalsh")
    rho_ = float(np.linalg.norm(W - J, 2))
    beta_ = float(np.linalg.norm(np.eye(n) - W, 2))
    return Spectrum(rho_, 1.0 - rho_, beta_, None, None, False, "dense-svd")


def _sparse_spectrum(W: sp.csr_array) -> Spectrum:
    """Spectrum of a large sparse W (see the module docstring for the methods)."""
    n = W.shape[0]
    symmetric = _is_symmetric(W)
    stochastic = _is_doubly_stochastic(W) and _is_nonnegative(W)
    I = sp.eye_array(n, format="csr")
    if symmetric and stochastic:
        W = ((W + W.T) * 0.5).tocsr()
        lambda2_, lmin, method = _symmetric_stochastic(W)
        rho_ = max(lambda2_, -lmin)
        gap_ = min(1.0 - lambda2_, 1.0 + lmin)
        return Spectrum(rho_, gap_, 1.0 - lmin, lambda2_, lmin, True, method)
    if stochastic:
        M = (W.T @ W).tocsr()
        M = ((M + M.T) * 0.5).tocsr()
        lambda2_, _, method = _symmetric_stochastic(M, need_min=False)
        rho_ = float(np.sqrt(max(lambda2_, 0.0)))
        B = ((I - W).T @ (I - W)).tocsr()
        if _lu_feasible(B):
            top = _lambda_max_shift_invert(B)
        else:
            top = float(spla.eigsh(B, k=1, which="LA", tol=ARPACK_TOL, ncv=min(n, 40),
                                   v0=_v0(n), return_eigenvectors=False)[0])
        return Spectrum(rho_, 1.0 - rho_, float(np.sqrt(top)), None, None, False, method)
    # generic fallback
    def minus_j(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        return W @ x - x.mean()

    def minus_j_t(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        return W.T @ x - x.mean()

    op = spla.LinearOperator((n, n), matvec=minus_j, rmatvec=minus_j_t, dtype=np.float64)
    if symmetric:
        rho_ = float(abs(spla.eigsh(op, k=1, which="LM", tol=ARPACK_TOL,
                                    v0=_v0(n), return_eigenvectors=False)[0]))
        eig = spla.eigsh(W, k=2, which="LA", tol=ARPACK_TOL, v0=_v0(n),
                         return_eigenvectors=False)
        lmin = float(spla.eigsh(W, k=1, which="SA", tol=ARPACK_TOL,
                                v0=_v0(n), return_eigenvectors=False)[0])
        beta_ = float(max(abs(1 - lmin), abs(1 - eig.max())))
        return Spectrum(rho_, 1.0 - rho_, beta_, float(np.sort(eig)[0]), lmin, True, "arpack")
    rho_ = float(spla.svds(op, k=1, tol=ARPACK_TOL, v0=_v0(n),
                           return_singular_vectors=False)[0])
    beta_ = float(spla.svds((I - W).tocsr(), k=1, tol=ARPACK_TOL, v0=_v0(n),
                            return_singular_vectors=False)[0])
    return Spectrum(rho_, 1.0 - rho_, beta_, None, None, False, "arpack")


def spectrum(W, *, dense_max_n: int = DENSE_MAX_N) -> Spectrum:
    """rho, gap, beta (and lambda_2, lambda_min for symmetric W) in one computation."""
    W = _as_matrix(W)
    n = W.shape[0]
    if n <= dense_max_n:
        return _dense_spectrum(W.toarray() if sp.issparse(W) else W)
    return _sparse_spectrum(W if sp.issparse(W) else sp.csr_array(W))


def rho(W) -> float:
    """||W - J||_2: the factor by which one gossip step shrinks the distance to the average."""
    return spectrum(W).rho


def spectral_gap(W) -> float:
    """1 - rho(W): larger means faster consensus (1 for W = J, ~1/n^2 for a ring)."""
    return spectrum(W).gap


def beta(W) -> float:
    """||I - W||_2 (= 1 - lambda_min for symmetric W): enters step sizes of LEAD / NIDS."""
    return spectrum(W).beta


def lambda2(W) -> float:
    """Second-largest eigenvalue of symmetric W; for non-symmetric W its second-largest modulus."""
    W = _as_matrix(W)
    if _is_symmetric(W):
        value = spectrum(W).lambda2
        assert value is not None
        return value
    if W.shape[0] <= DENSE_MAX_N:
        dense = W.toarray() if sp.issparse(W) else W
        moduli = np.sort(np.abs(np.linalg.eigvals(dense)))[::-1]
    else:
        values = spla.eigs(sp.csr_array(W), k=2, which="LM", tol=ARPACK_TOL,
                           v0=_v0(W.shape[0]), return_eigenvectors=False)
        moduli = np.sort(np.abs(values))[::-1]
    return float(moduli[1])
