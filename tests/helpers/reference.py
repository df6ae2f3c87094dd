"""Vectorized matrix-form simulators of the algorithms in docs/algorithms/ (numpy, float64): the ground truth.

Every function is written line by line as the *matrix form* of its page in docs/algorithms/, so the
per-node torch implementations can be compared with it iteration by iteration.

Conventions (shared by all simulators):

* ``X`` is ``n × d`` with **row i = node i**; ``W`` is the dense ``n × n`` mixing matrix with
  ``(W X)_i = Σ_j w_ij x_j``.
* ``grad(X) -> G`` returns all nodes' gradient estimates, row-wise. Stochastic estimators are
  closures with their own state (e.g. the torch oracles of :mod:`gossip.problems`); every simulator
  calls ``grad`` exactly once per iteration, in the order the per-node algorithm does.
* ``compress(i, v) -> v̂`` compresses node ``i``'s vector; it is called row by row, ``i = 0..n−1``,
  so a stochastic compressor can keep one random stream per node (as per-node code does).
* ``eta`` is a float or, where the section allows a schedule (D-PSGD, CHOCO, DeepSqueeze, DCD,
  ECD), a callable ``eta(t)`` of the 0-based round index ``t``.
* **Rounds.** Every simulator returns ``iterates`` with ``iterates[r]`` = the models after ``r``
  rounds (``r`` exchanges of messages), ``r = 0..T`` — ``T + 1`` arrays. Round 0 is the state
  before any exchange, i.e. what a per-node engine holds after ``setup``. For NIDS, LEAD and
  Prox-LEAD the first, purely local gradient step happens at setup, so ``iterates[0]`` is the
  paper's ``X^1`` and ``iterates[r]`` is ``X^{r+1}``. For PowerGossip, ``iterates[s]`` is the state
  after ``s`` gossip steps (each of ``iterations`` exchanges); step 0 is skipped (a quirk of the
  reference code), so
  ``iterates[1] == iterates[0]``.
* ``trace(r, state)``, when given, is called after setup (``r = 0``) and after every round with a
  dict of the algorithm's arrays (``X``, and e.g. ``X_hat``, ``D``, ``H``, ``H_w``); the arrays are
  the live state — copy what you keep.

Deterministic compressors for tests (:func:`identity`, :class:`TopK`, :func:`scaled_sign`) and the
unbiased LEAD b-bit quantizer (:class:`LeadQuantizer`, seeded per node) are included.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Array = np.ndarray
Grad = Callable[[Array], Array]
Compress = Callable[[int, Array], Array]
Prox = Callable[[Array, float], Array]
Trace = Callable[[int, dict], None] | None
Step = float | Callable[[int], float]


# ---- helpers ---------------------------------------------------------------------------------


def ring(n: int) -> Array:
    """The ``n``-ring with weights 1/3 (self and both neighbours); ``n >= 3``."""
    W = np.zeros((n, n))
    for i in range(n):
        for j in (i - 1, i, i + 1):
            W[i, j % n] += 1.0 / 3.0
    return W


def rel_error(X: Array, x_star: Array) -> float:
    """``Σ_i ‖x_i − x*‖² / (n ‖x*‖²)`` (the metric of docs/experiments.md)."""
    return float(((X - x_star) ** 2).sum() / (X.shape[0] * (x_star @ x_star)))


def consensus_error(X: Array) -> float:
    """``(1/n) Σ_i ‖x_i − x̄‖²`` (rows may be flattened matrices)."""
    X = X.reshape(X.shape[0], -1)
    return float(((X - X.mean(axis=0)) ** 2).sum() / X.shape[0])


def identity(i: int, v: Array) -> Array:
    """No compression."""
    return v.copy()


class TopK:
    """Keep the ``k`` entries of largest magnitude; ties go to the lowest index."""

    def __init__(self, k: int):
        self.k = k

    def __call__(self, i: int, v: Array) -> Array:
        keep = np.argsort(-np.abs(v), kind="stable")[: self.k]
        out = np.zeros_like(v)
        out[keep] = v[keep]
        return out


def scaled_sign(i: int, v: Array) -> Array:
    """``(‖v‖₁/d) · sign(v)`` with ``sign(0) = +1`` (one scale per vector)."""
    return (np.abs(v).sum() / v.size) * np.where(v >= 0, 1.0, -1.0)


class LeadQuantizer:
    """LEAD's unbiased b-bit ∞-norm quantizer (docs/compressors.md), one numpy stream per node.

    ``C(v) = (‖v‖_∞/2^{b−1}) · sign(v) ⊙ ⌊2^{b−1}|v|/‖v‖_∞ + u⌋``, ``u ~ U[0,1)^d``;
    node ``i`` draws from ``numpy.random.default_rng([seed, i])``.
    """

    def __init__(self, bits: int = 2, seed: int = 0):
        self.levels = 2.0 ** (bits - 1)
        self.seed = seed
        self._rngs: dict[int, np.random.Generator] = {}

    def __call__(self, i: int, v: Array) -> Array:
        rng = self._rngs.get(i)
        if rng is None:
            rng = self._rngs[i] = np.random.default_rng([self.seed, i])
        norm = np.abs(v).max()
        if norm == 0:
            return np.zeros_like(v)
        u = rng.random(v.shape)
        return (norm / self.levels) * np.sign(v) * np.floor(self.levels * np.abs(v) / norm + u)


def _rows(compress: Compress, M: Array) -> Array:
    return np.stack([compress(i, M[i]) for i in range(M.shape[0])])


def _step(eta: Step, t: int) -> float:
    return float(eta(t)) if callable(eta) else float(eta)


def _check(X0: Array, W: Array) -> tuple[Array, Array]:
    X0 = np.array(X0, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or X0.shape[0] != W.shape[0]:
        raise ValueError(f"W must be n × n and X0 must have n rows; got {W.shape} and {X0.shape}")
    return X0, W


# ---- docs/algorithms/gossip.md, dpsgd.md gossip and D-PSGD ----------------------------------------


def gossip(X0: Array, W: Array, T: int, gamma: float = 1.0, trace: Trace = None) -> list[Array]:
    """docs/algorithms/gossip.md relaxed gossip ``X^{t+1} = X^t + γ (W − I) X^t`` (γ = 1: ``X ← W X``)."""
    X, W = _check(X0, W)
    out = [X.copy()]
    if trace:
        trace(0, {"X": X})
    for t in range(T):
        X = X + gamma * (W @ X - X)
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X})
    return out


def dpsgd(X0: Array, W: Array, grad: Grad, eta: Step, T: int, trace: Trace = None) -> list[Array]:
    """docs/algorithms/dpsgd.md D-PSGD ``X^{t+1} = W X^t − η G(X^t)`` (gradient at the pre-gossip point)."""
    X, W = _check(X0, W)
    out = [X.copy()]
    if trace:
        trace(0, {"X": X})
    for t in range(T):
        X = W @ X - _step(eta, t) * grad(X)
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X})
    return out


# ---- docs/algorithms/choco.md CHOCO --------------------------------------------------------------------------------


def choco(
    X0: Array,
    W: Array,
    T: int,
    gamma: float,
    compress: Compress,
    grad: Grad | None = None,
    eta: Step = 0.0,
    trace: Trace = None,
) -> list[Array]:
    """CHOCO-SGD in the ICLR'20 order, CHOCO-Gossip when ``grad`` is None (docs/algorithms/choco.md).

    ``X^{t+½} = X^t − η G(X^t)``; ``X^{t+1} = X^{t+½} + γ (W − I) X̂^t``;
    ``X̂^{t+1} = X̂^t + C(X^{t+1} − X̂^t)``; ``X̂^0 = 0`` (so ``S = W X̂ = 0``).
    Trace: ``X``, ``X_hat``.
    """
    X, W = _check(X0, W)
    Xh = np.zeros_like(X)
    out = [X.copy()]
    if trace:
        trace(0, {"X": X, "X_hat": Xh})
    for t in range(T):
        if grad is not None:
            X = X - _step(eta, t) * grad(X)
        X = X + gamma * (W @ Xh - Xh)
        Xh = Xh + _rows(compress, X - Xh)
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X, "X_hat": Xh})
    return out


# ---- docs/algorithms/deepsqueeze.md, dcd.md, ecd.md DeepSqueeze, DCD, ECD -------------------------


def deepsqueeze(
    X0: Array,
    W: Array,
    T: int,
    gamma: float,
    compress: Compress,
    grad: Grad | None = None,
    eta: Step = 0.0,
    trace: Trace = None,
) -> list[Array]:
    """docs/algorithms/deepsqueeze.md ``X^{t+½} = X^t − ηG; V = X^{t+½} + E; Cv = C(V); E ← V − Cv;
    X^{t+1} = X^{t+½} + γ (W − I) Cv`` with ``E = 0`` initially. Trace: ``X``, ``E``."""
    X, W = _check(X0, W)
    E = np.zeros_like(X)
    out = [X.copy()]
    if trace:
        trace(0, {"X": X, "E": E})
    for t in range(T):
        if grad is not None:
            X = X - _step(eta, t) * grad(X)
        V = X + E
        Cv = _rows(compress, V)
        E = V - Cv
        X = X + gamma * (W @ Cv - Cv)
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X, "E": E})
    return out


def dcd(
    X0: Array, W: Array, grad: Grad, eta: Step, T: int, compress: Compress, trace: Trace = None
) -> list[Array]:
    """docs/algorithms/dcd.md DCD-PSGD ``X^{t+1} = X^t + C(W X^t − η G(X^t) − X^t)``."""
    X, W = _check(X0, W)
    out = [X.copy()]
    if trace:
        trace(0, {"X": X})
    for t in range(T):
        X = X + _rows(compress, W @ X - _step(eta, t) * grad(X) - X)
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X})
    return out


def ecd(
    X0: Array, W: Array, grad: Grad, eta: Step, T: int, compress: Compress, trace: Trace = None
) -> list[Array]:
    """docs/algorithms/ecd.md ECD-PSGD, ``k = 1..T`` (round ``k−1`` uses ``eta(k−1)``), ``Ŷ^0 = X^0``:

    ``X^k = W Ŷ − η G(X^{k−1})``; ``Z = (1 − k/2) X^{k−1} + (k/2) X^k``;
    ``Ŷ ← (1 − 2/k) Ŷ + (2/k) C(Z)``. Trace: ``X``, ``Y_hat``.
    """
    X, W = _check(X0, W)
    Yh = X.copy()
    out = [X.copy()]
    if trace:
        trace(0, {"X": X, "Y_hat": Yh})
    for k in range(1, T + 1):
        Xk = W @ Yh - _step(eta, k - 1) * grad(X)
        Z = (1.0 - k / 2.0) * X + (k / 2.0) * Xk
        Yh = (1.0 - 2.0 / k) * Yh + (2.0 / k) * _rows(compress, Z)
        X = Xk
        out.append(X.copy())
        if trace:
            trace(k, {"X": X, "Y_hat": Yh})
    return out


# ---- docs/algorithms/lead.md NIDS, LEAD, docs/algorithms/prox-lead.md Prox-LEAD -------------------


def nids(X0: Array, W: Array, grad: Grad, eta: float, T: int, trace: Trace = None) -> list[Array]:
    """NIDS: ``X^1 = X^0 − η∇F(X^0)`` (setup, no exchange), then
    ``X^{k+1} = W̃ (2X^k − X^{k−1} − η∇F(X^k) + η∇F(X^{k−1}))`` with ``W̃ = (I + W)/2``.

    ``iterates[r] = X^{r+1}``.
    """
    X0, W = _check(X0, W)
    Wt = 0.5 * (np.eye(W.shape[0]) + W)
    G_prev = grad(X0)
    X_prev, X = X0, X0 - eta * G_prev
    out = [X.copy()]
    if trace:
        trace(0, {"X": X})
    for r in range(T):
        G = grad(X)
        X_new = Wt @ (2.0 * X - X_prev - eta * G + eta * G_prev)
        X_prev, X, G_prev = X, X_new, G
        out.append(X.copy())
        if trace:
            trace(r + 1, {"X": X})
    return out


def prox_lead(
    X0: Array,
    W: Array,
    grad: Grad,
    eta: float,
    alpha: float,
    gamma_dual: float,
    T: int,
    compress: Compress,
    prox: Prox | None,
    trace: Trace = None,
) -> list[Array]:
    """Prox-LEAD (docs/algorithms/prox-lead.md; ``prox=None``: LEAD). ``prox(v, eta)`` is ``prox_{ηr}`` of one row.

    Setup: ``D = H = H_w = 0``, ``X^1 = prox(X^0 − η G^0)``. Round ``k = 1..T``::

        G = grad(X);  Y = X − ηG − ηD;  Q = C(Y − H)
        Ŷ = H + Q;  Ŷ_w = H_w + W Q
        H = (1 − α) H + α Ŷ;  H_w = (1 − α) H_w + α Ŷ_w
        D = D + (γ_dual / (2η)) (Ŷ − Ŷ_w)
        X = prox(X − ηG − ηD)

    ``iterates[r] = X^{r+1}``. Trace: ``X``, ``D``, ``H``, ``H_w``, ``G`` (last gradient).
    """
    X0, W = _check(X0, W)

    def P(M: Array) -> Array:
        return M if prox is None else np.stack([prox(row, eta) for row in M])

    D = np.zeros_like(X0)
    H = np.zeros_like(X0)
    Hw = np.zeros_like(X0)
    G = grad(X0)
    X = P(X0 - eta * G)
    out = [X.copy()]
    if trace:
        trace(0, {"X": X, "D": D, "H": H, "H_w": Hw, "G": G})
    for r in range(T):
        G = grad(X)
        Y = X - eta * G - eta * D
        Q = _rows(compress, Y - H)
        Yh = H + Q
        Yhw = Hw + W @ Q
        H = (1.0 - alpha) * H + alpha * Yh
        Hw = (1.0 - alpha) * Hw + alpha * Yhw
        D = D + (gamma_dual / (2.0 * eta)) * (Yh - Yhw)
        X = P(X - eta * G - eta * D)
        out.append(X.copy())
        if trace:
            trace(r + 1, {"X": X, "D": D, "H": H, "H_w": Hw, "G": G})
    return out


def lead(
    X0: Array,
    W: Array,
    grad: Grad,
    eta: float,
    alpha: float,
    gamma_dual: float,
    T: int,
    compress: Compress,
    trace: Trace = None,
) -> list[Array]:
    """docs/algorithms/lead.md LEAD: :func:`prox_lead` without a prox (same conventions)."""
    return prox_lead(X0, W, grad, eta, alpha, gamma_dual, T, compress, None, trace)


# ---- docs/algorithms/beer.md BEER ---------------------------------------------------------------------------------


def beer(
    X0: Array,
    W: Array,
    grad: Grad,
    eta: float,
    gamma: float,
    T: int,
    compress: Compress,
    trace: Trace = None,
    init_grad: Grad | None = None,
) -> list[Array]:
    """docs/algorithms/beer.md BEER. Setup ``H = G = 0``, ``V = ∇F(X^0)``, ``grad_prev = V``,
    ``X = X − η V``; round ``t``::

        g = grad(X);   V = V + γ (W − I) G + g − grad_prev;   grad_prev = g
        H = H + C(X − H);   G = G + C(V − G)
        X = X + γ (W − I) H − η V

    ``compress`` is called for all rows of ``X − H``, then for all rows of ``V − G`` (per node:
    the H message first). ``V^0`` comes from ``init_grad(X^0)`` when given (e.g. full gradients
    while ``grad`` is stochastic), else from ``grad(X^0)``. Trace: ``X``, ``H``, ``V``, ``G``,
    ``grad_prev``.
    """
    X, W = _check(X0, W)
    H = np.zeros_like(X)
    Gc = np.zeros_like(X)
    V = (grad if init_grad is None else init_grad)(X)
    g_prev = V.copy()
    X = X - eta * V
    out = [X.copy()]
    if trace:
        trace(0, {"X": X, "H": H, "V": V, "G": Gc, "grad_prev": g_prev})
    for t in range(T):
        g = grad(X)
        V = V + gamma * (W @ Gc - Gc) + g - g_prev
        g_prev = g
        H = H + _rows(compress, X - H)
        Gc = Gc + _rows(compress, V - Gc)
        X = X + gamma * (W @ H - H) - eta * V
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X, "H": H, "V": V, "G": Gc, "grad_prev": g_prev})
    return out


# ---- docs/algorithms/powergossip.md PowerGossip ---------------------------------------------------


def orth(M: Array, eps: float = 1e-8) -> Array:
    """Gram–Schmidt on columns: ``col_i /= ‖col_i‖ + eps``, then remove it from later ones."""
    M = np.array(M, dtype=np.float64)
    r = M.shape[1]
    for i in range(r):
        M[:, i] /= np.linalg.norm(M[:, i]) + eps
        if i + 1 < r:
            M[:, i + 1 :] -= np.outer(M[:, i], M[:, i] @ M[:, i + 1 :])
    return M


Basis = Callable[[int, int, str, tuple[int, int]], Array]


def default_basis(seed: int = 0) -> Basis:
    """``N(0, 1)`` factors from one numpy stream per edge, ``default_rng([seed, lo, hi])``."""
    rngs: dict[tuple[int, int], np.random.Generator] = {}

    def basis(lo: int, hi: int, which: str, shape: tuple[int, int]) -> Array:
        rng = rngs.get((lo, hi))
        if rng is None:
            rng = rngs[(lo, hi)] = np.random.default_rng([seed, lo, hi])
        return rng.standard_normal(shape)

    return basis


def powergossip(
    Ms: Array,
    W: Array,
    T: int,
    gamma: float,
    rank: int = 1,
    warm_start: bool = True,
    basis: Basis | None = None,
    iterations: int = 1,
    eps: float = 1e-8,
    trace: Trace = None,
    active: Callable[[int, tuple[int, int]], bool] | None = None,
) -> list[Array]:
    """PowerGossip on one matrix parameter per node (``Ms``: ``n × m × k``), symmetric ``W``.

    Edges are ``(lo, hi)`` with ``lo < hi`` and ``w_hi,lo ≠ 0``; the shared state ``P_e`` (m × r),
    ``Q_e`` (k × r) describes ``M_hi − M_lo``. **Initial factors**: for every edge in sorted order,
    ``P_e = basis(lo, hi, "P", (m, r))`` then ``Q_e = basis(lo, hi, "Q", (k, r))`` — the draw order
    of the reference code on a per-edge stream. Without ``warm_start``, step ``t >= 1`` redraws its
    input factor with ``basis(lo, hi, "Q", (k, r))`` on odd ``t`` and ``basis(lo, hi, "P", (m, r))``
    on even ``t``. ``basis`` defaults to :func:`default_basis` (seed 0).

    A step runs ``iterations`` power iterations, each one exchange and one update (the counter
    ``t`` advances by one per iteration); the first step (``t = 0``) is skipped entirely and ``t``
    jumps to ``iterations`` (a quirk of the reference code). Iteration ``t`` (Jacobi: products use the models from the
    start of the iteration)::

        odd t:  Q̂ = orth(Q_e); P_e = M_hi Q̂ − M_lo Q̂; Q_e = Q̂
        even t: P̂ = orth(P_e); Q_e = M_hiᵀ P̂ − M_loᵀ P̂; P_e = P̂
        M_i ← M_i − γ Σ_j w_ij σ_ij P_e Q_eᵀ,   σ_ij = +1 if i > j else −1

    ``iterates[s]`` = models after ``s`` steps (``n × m × k``). Trace: ``M``, ``P``, ``Q`` (dicts
    keyed by edge), ``t``.

    ``active(t, e)`` (message loss, on_loss "edge"): False when edge ``e`` sits out iteration
    ``t`` — its input factor is still (redrawn and) orthonormalized, its output factor and the
    models keep their values.
    """
    M = np.array(Ms, dtype=np.float64)
    if M.ndim != 3:
        raise ValueError(f"Ms must be n × m × k, got shape {M.shape}")
    W = np.asarray(W, dtype=np.float64)
    if not np.allclose(W, W.T, rtol=0, atol=1e-15):
        raise ValueError("PowerGossip needs a symmetric W")
    n, m, k = M.shape
    r = min(rank, m, k)
    basis = default_basis(0) if basis is None else basis
    edges = [(lo, hi) for lo in range(n) for hi in range(lo + 1, n) if W[hi, lo] != 0]
    P: dict[tuple[int, int], Array] = {}
    Q: dict[tuple[int, int], Array] = {}
    for e in edges:
        P[e] = np.array(basis(*e, "P", (m, r)), dtype=np.float64)
        Q[e] = np.array(basis(*e, "Q", (k, r)), dtype=np.float64)
    t = 0
    out = [M.copy()]
    if trace:
        trace(0, {"M": M, "P": P, "Q": Q, "t": t})
    for s in range(T):
        if t == 0:
            t += iterations
        else:
            for _ in range(iterations):
                delta = np.zeros_like(M)
                for e in edges:
                    lo, hi = e
                    odd = t % 2 == 1
                    if not warm_start:
                        if odd:
                            Q[e] = np.array(basis(lo, hi, "Q", (k, r)), dtype=np.float64)
                        else:
                            P[e] = np.array(basis(lo, hi, "P", (m, r)), dtype=np.float64)
                    if active is not None and not active(t, e):
                        if odd:
                            Q[e] = orth(Q[e], eps)
                        else:
                            P[e] = orth(P[e], eps)
                        continue
                    if odd:
                        Qh = orth(Q[e], eps)
                        P[e] = M[hi] @ Qh - M[lo] @ Qh
                        Q[e] = Qh
                    else:
                        Ph = orth(P[e], eps)
                        Q[e] = M[hi].T @ Ph - M[lo].T @ Ph
                        P[e] = Ph
                    A = P[e] @ Q[e].T
                    delta[hi] -= gamma * W[hi, lo] * A
                    delta[lo] += gamma * W[lo, hi] * A
                M = M + delta
                t += 1
        out.append(M.copy())
        if trace:
            trace(s + 1, {"M": M, "P": P, "Q": Q, "t": t})
    return out
