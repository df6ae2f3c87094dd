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

Closed forms (:func:`closed_form_spectrum`, used by `spectrum` above ``dense_max_n``):

* a W invariant under an abelian group acting on the nodes, W[i, j] = c(j - i) with node ids
  read as elements of Z_m1 x ... x Z_mk (mixed radix): the ring, the exponential graphs and the
  complete graph on Z_n (circulants), the torus on Z_rows x Z_cols, the hypercube on Z_2^d, with
  any weight rule that respects the symmetry (metropolis, max-degree, uniform, lazy or not, or
  explicit weights that happen to).  Its eigenvalues are lambda_chi = sum_g c(g) chi(g) over the
  group's characters, and 1 - lambda_chi = sum_g c(g) (2 sin^2(pi f) - i sin(2 pi f)) is summed
  directly (f the phase of chi(g)), so a gap of 1e-12 keeps its digits.  The symmetry is checked
  on W itself (every row has the same offsets with the same weights), never taken from a name.
* a star whose edges all carry the same weight a: W = I - a L, eigenvalues 1, 1 - a (n - 2
  times) and 1 - n a.

Time cap: ``spectrum(W, time_budget=s)`` stops the iterative solvers after about s seconds (a
sparse LU that has started is not interrupted), or does not start them when s seconds cannot
pay for :data:`MIN_PRODUCTS` products with W (one is timed), and returns bounds instead, ``method="estimated"``
and ``exact=False`` (rho <= 1, gap >= 0, lambda_min >= max(-1, min_i 2 w_ii - 1) by Gershgorin,
beta <= 2 - 2 min_i w_ii) for a nonnegative doubly stochastic W, ``method="skipped"`` with NaN
otherwise; the ``topologies.spectral`` logger says so with a warning.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse.csgraph import connected_components, reverse_cuthill_mckee

__all__ = ["Spectrum", "spectrum", "closed_form_spectrum", "rho", "spectral_gap", "beta", "lambda2",
           "DENSE_MAX_N", "TIME_BUDGET"]

logger = logging.getLogger(__name__)

DENSE_MAX_N = 2000
"""Up to this n, matrices are built and analysed densely."""
LU_BUDGET = 4e7
"""Largest RCM-bandwidth * n (a bound on the LU's size) for which sparse LU is used."""
ARPACK_TOL = 1e-10
"""Tolerance of the generic ARPACK fallbacks."""
SYMMETRY_TOL = 1e-12
STOCHASTIC_TOL = 1e-10
TIME_BUDGET = 5.0
"""Default seconds a Topology lets the iterative solvers run before it settles for bounds."""
CLOSED_FORM = "closed form"
MIN_PRODUCTS = 500
"""Matrix-vector products below which the iterative solvers are not started: Lanczos on a
graph without a closed form needs hundreds to thousands of them (its lambda_2 sits in a dense
edge of the spectrum: 105 s for a random 4-regular graph of 10^5 nodes), so a budget that
cannot pay for this many gives the bounds at once instead of after the budget."""


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
    exact: bool = True
    """False when the numbers are only bounds ("estimated") or missing ("skipped"): see `note`."""
    note: str = ""


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


def _spreads_fast(A: sp.csr_array, levels: int = 64, clock: _Clock | None = None) -> bool:
    """For a symmetric A: True when a breadth-first search from node 0 reaches every node in
    fewer than ``levels`` steps, and in so few that A cannot have the narrow band a sparse LU
    needs (so `_lu_feasible` would say False).

    With bandwidth b under any ordering, hops move at most b positions, so reaching every node
    takes at least (n - 1) / (2 b) steps; an expander does it in ~log n.  True also proves the
    support connected.  Costs a sparse product per level instead of a reverse Cuthill-McKee.
    """
    n = A.shape[0]
    widest = min(n / 8, LU_BUDGET / n)  # the widest band _lu_feasible accepts
    limit = min(levels, int((n - 1) / (2 * widest)))
    pattern = sp.csr_array((np.ones(A.nnz, dtype=np.float32), A.indices, A.indptr), shape=A.shape)
    seen = np.zeros(n, dtype=bool)
    seen[0] = True
    frontier = seen.astype(np.float32)
    for _ in range(limit):
        if clock is not None:
            clock.check()
        reached = (pattern @ frontier) > 0
        new = reached & ~seen
        if not new.any():
            return bool(seen.all())
        seen |= new
        frontier = new.astype(np.float32)
    return False


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


class _OutOfTime(Exception):
    """The iterative solvers ran past the time budget."""


class _Clock:
    """A deadline the solvers' matrix-vector products check (None: no deadline)."""

    def __init__(self, budget: float | None) -> None:
        self.budget = budget
        self.deadline = None if budget is None else time.monotonic() + float(budget)

    def check(self) -> None:
        """Raise _OutOfTime once the deadline has passed."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _OutOfTime

    def affords(self, W: sp.csr_array, products: int) -> bool:
        """Whether the time left pays for ``products`` products with W (one is timed)."""
        if self.deadline is None:
            return True
        x = np.ones(W.shape[0])
        tic = time.monotonic()
        W @ x
        return tic + products * (time.monotonic() - tic) <= self.deadline

    def timed(self, matvec):
        """matvec, checking the deadline before each product."""
        if self.deadline is None:
            return matvec

        def checked(x):
            self.check()
            return matvec(x)

        return checked


_NO_CLOCK = _Clock(None)


def _mean_op(n: int, matvec, clock: _Clock = _NO_CLOCK) -> spla.LinearOperator:
    """Symmetric LinearOperator of size n from a matvec (checking the clock's deadline)."""
    matvec = clock.timed(matvec)
    return spla.LinearOperator((n, n), matvec=matvec, rmatvec=matvec, dtype=np.float64)


def _timed_matrix(A: sp.csr_array, clock: _Clock):
    """A itself without a deadline, else a LinearOperator of A that checks it (same products)."""
    if clock.deadline is None:
        return A
    AT = A.T
    return spla.LinearOperator(A.shape, matvec=clock.timed(lambda x: A @ np.ravel(x)),
                               rmatvec=clock.timed(lambda x: AT @ np.ravel(x)), dtype=np.float64)


def _laplacian_mu2(M: sp.csr_array, clock: _Clock = _NO_CLOCK) -> float:
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

    top = spla.eigsh(_mean_op(n, pinv, clock), k=1, which="LA", v0=_v0(n),
                     return_eigenvectors=False)[0]
    return float(1.0 / top)


def _lambda_max_shift_invert(A: sp.csr_array, clock: _Clock = _NO_CLOCK) -> float:
    """Largest eigenvalue of symmetric A by shift-invert Lanczos just above its Gershgorin bound."""
    bound = float(np.abs(A).sum(axis=1).max())
    sigma = bound + max(1e-3, 1e-3 * bound)
    n = A.shape[0]
    solve = _solver(A - sigma * sp.eye_array(n, format="csr"))
    inverse = _mean_op(n, lambda x: solve(np.ravel(x)), clock)
    value = spla.eigsh(A, k=1, sigma=sigma, which="LM", OPinv=inverse,
                       v0=_v0(n), return_eigenvectors=False)[0]
    return float(value)


def _symmetric_stochastic(M: sp.csr_array, need_min: bool = True,
                          clock: _Clock = _NO_CLOCK) -> tuple[float, float, str]:
    """(lambda_2, lambda_min) of a symmetric nonnegative doubly stochastic sparse M, and the method.

    lambda_min is nan when need_min is False.
    """
    n = M.shape[0]
    quick = clock.deadline is not None and _spreads_fast(M, clock=clock)  # expander: no RCM
    clock.check()
    connected = quick or _connected(M)
    lmin = float("nan")
    if quick or not _lu_feasible(M):
        ncv = min(n, 40)

        def shifted(x: np.ndarray) -> np.ndarray:  # M - 2J: moves the eigenvalue 1 of ones to -1
            x = np.ravel(x)
            return M @ x - 2.0 * x.mean()

        try:
            lambda2_ = 1.0
            if connected:
                lambda2_ = float(spla.eigsh(_mean_op(n, shifted, clock), k=1, which="LA", ncv=ncv,
                                            maxiter=100, v0=_v0(n),
                                            return_eigenvectors=False)[0])
            if need_min:
                lmin = float(spla.eigsh(_timed_matrix(M, clock), k=1, which="SA", ncv=ncv,
                                        maxiter=100,
                                        v0=_v0(n), return_eigenvectors=False)[0])
            return lambda2_, lmin, "lanczos"
        except spla.ArpackNoConvergence:
            pass  # tiny gap on a wide-band graph: fall back to the LU path
    clock.check()
    lambda2_ = 1.0 - _laplacian_mu2(M, clock) if connected else 1.0
    if need_min:
        clock.check()
        lmin = 1.0 - _lambda_max_shift_invert(sp.eye_array(n, format="csr") - M, clock)
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


def _sparse_spectrum(W: sp.csr_array, clock: _Clock = _NO_CLOCK) -> Spectrum:
    """Spectrum of a large sparse W (see the module docstring for the methods)."""
    n = W.shape[0]
    WT = W.T.tocsr()
    symmetric = _max_abs(W - WT) <= SYMMETRY_TOL
    stochastic = _is_doubly_stochastic(W) and _is_nonnegative(W)
    I = sp.eye_array(n, format="csr")
    try:
        return _sparse_solve(W, WT, symmetric, stochastic, I, clock)
    except _OutOfTime as exc:
        raise _OutOfTime(symmetric, stochastic) from exc


def _sparse_solve(W, WT, symmetric: bool, stochastic: bool, I, clock: _Clock) -> Spectrum:
    """The solvers of _sparse_spectrum once W's kind is known."""
    n = W.shape[0]
    clock.check()
    if symmetric and stochastic:
        W = ((W + WT) * 0.5).tocsr()
        del WT
        lambda2_, lmin, method = _symmetric_stochastic(W, clock=clock)
        rho_ = max(lambda2_, -lmin)
        gap_ = min(1.0 - lambda2_, 1.0 + lmin)
        return Spectrum(rho_, gap_, 1.0 - lmin, lambda2_, lmin, True, method)
    if stochastic:
        M = (W.T @ W).tocsr()
        M = ((M + M.T) * 0.5).tocsr()
        lambda2_, _, method = _symmetric_stochastic(M, need_min=False, clock=clock)
        rho_ = float(np.sqrt(max(lambda2_, 0.0)))
        B = ((I - W).T @ (I - W)).tocsr()
        clock.check()
        if _lu_feasible(B):
            top = _lambda_max_shift_invert(B, clock)
        else:
            top = float(spla.eigsh(_timed_matrix(B, clock), k=1, which="LA", tol=ARPACK_TOL, ncv=min(n, 40),
                                   v0=_v0(n), return_eigenvectors=False)[0])
        return Spectrum(rho_, 1.0 - rho_, float(np.sqrt(top)), None, None, False, method)
    # generic fallback
    def minus_j(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        return W @ x - x.mean()

    def minus_j_t(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        return W.T @ x - x.mean()

    op = spla.LinearOperator((n, n), matvec=clock.timed(minus_j), rmatvec=clock.timed(minus_j_t),
                             dtype=np.float64)
    Wt = _timed_matrix(W, clock)
    if symmetric:
        rho_ = float(abs(spla.eigsh(op, k=1, which="LM", tol=ARPACK_TOL,
                                    v0=_v0(n), return_eigenvectors=False)[0]))
        eig = spla.eigsh(Wt, k=2, which="LA", tol=ARPACK_TOL, v0=_v0(n),
                         return_eigenvectors=False)
        lmin = float(spla.eigsh(Wt, k=1, which="SA", tol=ARPACK_TOL,
                                v0=_v0(n), return_eigenvectors=False)[0])
        beta_ = float(max(abs(1 - lmin), abs(1 - eig.max())))
        return Spectrum(rho_, 1.0 - rho_, beta_, float(np.sort(eig)[0]), lmin, True, "arpack")
    rho_ = float(spla.svds(op, k=1, tol=ARPACK_TOL, v0=_v0(n),
                           return_singular_vectors=False)[0])
    clock.check()
    beta_ = float(spla.svds(_timed_matrix((I - W).tocsr(), clock), k=1, tol=ARPACK_TOL, v0=_v0(n),
                            return_singular_vectors=False)[0])
    return Spectrum(rho_, 1.0 - rho_, beta_, None, None, False, "arpack")


# ---------------------------------------------------------------------------------------------
# closed forms


def _csr(W) -> sp.csr_array:
    """W as a CSR array with sorted indices and no stored zeros (W itself when it is one)."""
    A = sp.csr_array(W, dtype=np.float64)
    if A.has_canonical_format and (A.data != 0).all():
        return A
    A = sp.csr_array(A, copy=True)
    A.eliminate_zeros()
    A.sum_duplicates()
    return A


def _digits(ids: np.ndarray, moduli: tuple[int, ...]) -> list[np.ndarray]:
    """Mixed-radix digits of node ids (id = ((g_1) m_2 + g_2) m_3 + ...), most significant first."""
    if len(moduli) == 1:
        return [ids]
    out = []
    for m in reversed(moduli):
        ids, digit = np.divmod(ids, m)
        out.append(digit)
    return out[::-1]


def _encode(digits: list[np.ndarray], moduli: tuple[int, ...]) -> np.ndarray:
    """Node ids of mixed-radix digits (the inverse of _digits)."""
    ids = np.zeros_like(digits[0])
    for digit, m in zip(digits, moduli, strict=True):
        ids = ids * m + digit
    return ids


def _offset_ids(rows: np.ndarray, cols: np.ndarray, moduli: tuple[int, ...]) -> np.ndarray:
    """The group difference cols - rows of node ids, as node ids (one digit at a time)."""
    if all(m == 2 for m in moduli):  # Z_2^d: the digits are the bits, the difference is xor
        return rows ^ cols
    offset = np.zeros(rows.shape, dtype=np.int64)
    stride = 1
    for m in reversed(moduli):
        rows, row_digit = np.divmod(rows, m)
        cols, col_digit = np.divmod(cols, m)
        offset += (col_digit - row_digit) % m * stride
        stride *= m
    return offset


def _group_weights(A: sp.csr_array, moduli: tuple[int, ...],
                   block: int = 1 << 20) -> np.ndarray | None:
    """c with A[i, j] = c[j - i] (group difference of the mixed-radix ids), or None if A is not so.

    Row 0 gives c; every row must then have row 0's number of entries, all at offsets of row 0
    with row 0's weights (so the same offsets, the columns of a row being distinct).  Checked in
    blocks of rows, so the memory stays a few arrays of ``block`` entries.
    """
    n = A.shape[0]
    if len(moduli) == 0 or math.prod(moduli) != n or min(moduli) < 1 or A.nnz % n:
        return None
    per_row = A.nnz // n
    if np.any(np.diff(A.indptr) != per_row):  # rows of one length: a cheap first filter
        return None
    first = _offset_ids(np.zeros(per_row, dtype=np.int64),
                        A.indices[:per_row].astype(np.int64), moduli)
    c = np.zeros(n)
    c[first] = A.data[:per_row]
    present = np.zeros(n, dtype=bool)
    present[first] = True
    step = max(1, block // max(per_row, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        a, b = A.indptr[lo], A.indptr[hi]
        rows = np.repeat(np.arange(lo, hi, dtype=np.int64), per_row)
        offset = _offset_ids(rows, A.indices[a:b].astype(np.int64), moduli)
        if not present[offset].all() or np.abs(A.data[a:b] - c[offset]).max() > SYMMETRY_TOL:
            return None
    return c


def _group_spectrum(c: np.ndarray, moduli: tuple[int, ...]) -> Spectrum | None:
    """The spectrum of the group-invariant W with weights c (doubly stochastic only)."""
    n = c.size
    if n < 2 or abs(c.sum() - 1.0) > STOCHASTIC_TOL:
        return None
    support = np.flatnonzero(c)
    negated = _encode([(-d) % m for d, m in zip(_digits(support, moduli), moduli, strict=True)],
                      moduli)
    symmetric = bool(np.abs(c[support] - c[negated]).max() <= SYMMETRY_TOL)
    strides = [math.prod(moduli[i + 1:]) for i in range(len(moduli))]
    ids = np.arange(n, dtype=np.int64)
    real = np.zeros(n)  # sum_g c(g) (1 - cos 2 pi f_g(k)), k the character
    imag = None if symmetric else np.zeros(n)  # - sum_g c(g) sin 2 pi f_g(k)
    digit_of: dict[int, np.ndarray] = {}  # digit index -> that digit of every character k
    for g in support:
        if g == 0:
            continue
        phase = np.zeros(n)
        for axis, (d, m, stride) in enumerate(zip(_digits(np.array([g]), moduli), moduli,
                                                  strides, strict=True)):
            if d[0]:
                if axis not in digit_of:  # int32 when digit * d cannot overflow it
                    small = np.int32 if m * m < 2**31 else np.int64
                    digit_of[axis] = (ids // stride % m).astype(small)
                phase += (digit_of[axis] * int(d[0]) % m) / m
        phase %= 1.0
        real += c[g] * 2.0 * np.sin(np.pi * phase) ** 2
        if imag is not None:
            imag -= c[g] * np.sin(2.0 * np.pi * phase)
    # mu_k = 1 - lambda_k; k = 0 is the trivial character (the vector of ones, lambda = 1)
    if symmetric:
        rest = real[1:]
        lam_rest_max, lam_rest_min = 1.0 - rest.min(), 1.0 - rest.max()
        rho_ = max(abs(lam_rest_max), abs(lam_rest_min))
        gap_ = min(rest.min(), 2.0 - rest.max())  # 1 - rho without cancellation
        lmin = min(1.0, lam_rest_min)
        beta_ = float(np.abs(real).max())
        return Spectrum(float(rho_), float(gap_), beta_, float(lam_rest_max), float(lmin), True,
                        CLOSED_FORM)
    mu = real + 1j * imag
    rho_ = float(np.abs(1.0 - mu[1:]).max())
    return Spectrum(rho_, 1.0 - rho_, float(np.abs(mu).max()), None, None, False, CLOSED_FORM)


def _star_spectrum(A: sp.csr_array) -> Spectrum | None:
    """Spectrum of a symmetric doubly stochastic W on a star whose edges all weigh a: W = I - a L,
    L the star's Laplacian, eigenvalues 1, 1 - a (n - 2 times) and 1 - n a."""
    n = A.shape[0]
    if n < 3 or A.nnz > 3 * n or np.diff(A.indptr).max() < n - 1:
        return None
    off = A - sp.diags_array(A.diagonal()).tocsr()
    off.eliminate_zeros()
    degree = np.diff(off.indptr)
    hubs = np.flatnonzero(degree == n - 1)
    if hubs.size != 1 or off.nnz != 2 * (n - 1):
        return None
    hub = int(hubs[0])
    coo = off.tocoo()
    if not np.all((coo.row == hub) ^ (coo.col == hub)):
        return None
    a = float(coo.data[0])
    if np.abs(coo.data - a).max() > SYMMETRY_TOL or not _is_doubly_stochastic(A):
        return None
    mid, low = 1.0 - a, 1.0 - n * a
    rho_ = max(abs(mid), abs(low))
    gaps = [1.0 - abs(low) if low < 0 else n * a, 1.0 - abs(mid) if mid < 0 else a]
    lmin = min(mid, low)
    return Spectrum(rho_, min(gaps), max(a, n * a), max(mid, low), lmin, True, CLOSED_FORM)


def closed_form_spectrum(W, group: tuple[int, ...] | None = None) -> Spectrum | None:
    """The exact spectrum of W when it has a known symmetry, else None (module docstring).

    ``group`` (moduli m_1, ..., m_k with prod = n) names the group to try first, e.g.
    (rows, cols) for a torus or (2,) * d for a hypercube; Z_n (circulants) and the star are
    always tried.  Each candidate is verified on W's entries, so a wrong hint costs one pass.
    Only doubly stochastic W are handled.
    """
    A = _csr(W)
    n = A.shape[0]
    candidates = [tuple(int(m) for m in group)] if group else []
    if (n,) not in candidates:
        candidates.append((n,))
    for moduli in candidates:
        c = _group_weights(A, moduli)
        if c is not None:
            found = _group_spectrum(c, moduli)
            if found is not None:
                return found
    return _star_spectrum(A)


# ---------------------------------------------------------------------------------------------
# spectrum


def _bounds(W: sp.csr_array, budget: float | None, symmetric: bool | None = None,
            stochastic: bool | None = None) -> Spectrum:
    """What is known without solving (module docstring, "Time cap"): bounds or NaN.
    ``symmetric`` and ``stochastic``: W's kind when already known."""
    n = W.shape[0]
    why = f"not computed within time_budget={budget:g} s"
    if stochastic is None:
        stochastic = _is_doubly_stochastic(W) and _is_nonnegative(W)
    if symmetric is None:
        symmetric = _is_symmetric(W)
    if stochastic:
        low = float(max(-1.0, 2.0 * W.diagonal().min() - 1.0))
        note = (f"{why}; bounds only: rho <= 1, gap >= 0, beta <= {1.0 - low:.6g}"
                + (f", lambda_min >= {low:.6g}, lambda2 <= 1" if symmetric else ""))
        return Spectrum(1.0, 0.0, 1.0 - low, 1.0 if symmetric else None,
                        low if symmetric else None, symmetric, "estimated", False, note)
    nan = float("nan")
    return Spectrum(nan, nan, nan, None, None, symmetric, "skipped", False,
                    f"{why} (n={n}); W is not nonnegative doubly stochastic, so no bound is given")


def spectrum(W, *, dense_max_n: int = DENSE_MAX_N, group: tuple[int, ...] | None = None,
             time_budget: float | None = None, name: str | None = None,
             closed_form: bool = True) -> Spectrum:
    """rho, gap, beta (and lambda_2, lambda_min for symmetric W) in one computation.

    Up to ``dense_max_n`` nodes: dense and exact.  Above: a closed form when W has one
    (:func:`closed_form_spectrum`, ``group`` a hint), else the sparse solvers, stopped after
    ``time_budget`` seconds (None: no limit) with bounds instead of values (``exact=False``,
    logged as a warning naming ``name``).  ``closed_form=False`` skips the closed forms (to
    check the solvers against them).
    """
    clock = _Clock(time_budget)  # the budget counts from here
    W = _as_matrix(W)
    n = W.shape[0]
    if n <= dense_max_n:
        return _dense_spectrum(W.toarray() if sp.issparse(W) else W)
    W = W if sp.issparse(W) else sp.csr_array(W)
    found = closed_form_spectrum(W, group) if closed_form else None
    if found is not None:
        return found
    try:
        clock.check()
        if not clock.affords(W, MIN_PRODUCTS):  # (10^6 nodes: bounds now, not after the budget)
            raise _OutOfTime
        return _sparse_spectrum(W, clock)
    except _OutOfTime as exc:
        result = _bounds(W, time_budget, *exc.args)
        logger.warning("spectrum of %s (n=%d) %s: %s; pass time_budget=None (or a larger one) "
                       "for the values", name or "W", n, result.method, result.note)
        return result


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
