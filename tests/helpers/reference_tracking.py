"""Matrix-form simulators (numpy, float64) of the tracking, directed, momentum and primal-dual
methods, written line by line from their update rules; the per-node code must equal them.

Conventions as in tests/helpers/reference.py: ``X`` is ``n × d`` (row i = node i), ``(M X)_i = Σ_j m_ij x_j``,
``grad(X)`` returns all nodes' gradients, ``compress(i, v)`` compresses node i's vector, and
``iterates[r]`` holds the models after r rounds (``iterates[0]`` = after setup).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.helpers.reference import Compress, Grad, _rows

Array = np.ndarray
Trace = Callable[[int, dict], None] | None


class Comm:
    """The compressed stream of a matrix M: ``Q = C(Z − H)``, ``Ẑ = H + Q``,
    ``Ẑ_M = H_M + M Q``, ``H ← (1−α)H + αẐ``, ``H_M ← (1−α)H_M + αẐ_M``."""

    def __init__(self, M: Array, shape: tuple[int, int], alpha: float, compress: Compress):
        self.M, self.alpha, self.compress = M, alpha, compress
        self.H = np.zeros(shape)
        self.HM = np.zeros(shape)

    def __call__(self, Z: Array) -> tuple[Array, Array]:
        Q = _rows(self.compress, Z - self.H)
        Z_hat, ZM_hat = self.H + Q, self.HM + self.M @ Q
        a = self.alpha
        self.H = (1 - a) * self.H + a * Z_hat
        self.HM = (1 - a) * self.HM + a * ZM_hat
        return Z_hat, ZM_hat


def cgt(X0: Array, W: Array, grad: Grad, eta: float, gamma: float, alpha: float, T: int,
        compress: Compress, R: Array | None = None,
        C: Array | None = None, trace: Trace = None) -> list[Array]:
    """C-GT (R = C = W) or CPP (X pulled with row-stochastic R, Y pushed with column-stochastic C)::

        X̂, X̂_R = COMM_R(X);  Ŷ, Ŷ_C = COMM_C(Y)
        X ← X − γ(X̂ − X̂_R) − ηY;  G' = ∇F(X);  Y ← Y − γ(Ŷ − Ŷ_C) + G' − G

    ``compress`` is called for all rows of the X stream, then all rows of the Y stream.
    Trace: X, Y, G.
    """
    X = np.array(X0, dtype=np.float64)
    R = W if R is None else R
    C = W if C is None else C
    cx = Comm(R, X.shape, alpha, compress)
    cy = Comm(C, X.shape, alpha, compress)
    G = grad(X)
    Y = G.copy()
    out = [X.copy()]
    if trace:
        trace(0, {"X": X, "Y": Y, "G": G})
    for t in range(T):
        Xh, XR = cx(X)
        Yh, YC = cy(Y)
        X = X - gamma * (Xh - XR) - eta * Y
        Gn = grad(X)
        Y = Y - gamma * (Yh - YC) + Gn - G
        G = Gn
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X, "Y": Y, "G": G})
    return out


def extra(X0: Array, W: Array, grad: Grad, eta: float, T: int) -> list[Array]:
    """EXTRA: ``X¹ = W X⁰ − η∇F(X⁰)``; ``X^{k+1} = (I+W)X^k − W̃X^{k−1} − η(∇F(X^k) − ∇F(X^{k−1}))``."""
    n = W.shape[0]
    Wt = (np.eye(n) + W) / 2
    X_prev = np.array(X0, dtype=np.float64)
    G_prev = grad(X_prev)
    X = W @ X_prev - eta * G_prev
    out = [X_prev.copy(), X.copy()]
    for _ in range(T - 1):
        G = grad(X)
        X, X_prev = X + W @ X - Wt @ X_prev - eta * (G - G_prev), X
        G_prev = G
        out.append(X.copy())
    return out[: T + 1]


def pull_matrix(C: Array) -> Array:
    """Row-stochastic R on the support of C: ``r_ij = 1/(1 + |N_in(i)|)``."""
    S = (C != 0).astype(np.float64)
    np.fill_diagonal(S, 1.0)
    return S / S.sum(axis=1, keepdims=True)


def push_sum(X0: Array, C: Array | Callable[[int], Array], T: int, compress: Compress,
             gamma: float = 1.0, grad: Grad | None = None, eta: float = 0.0,
             exact: bool = False, trace: Trace = None) -> list[Array]:
    """Push-sum with column-stochastic C (a matrix, or ``C(t)`` for round t = 1, 2, ...)::

        S ← S − η∇F(S / w);  Ŝ, Ŝ_C = COMM_C(S) (α = 1; stateless when exact);
        S ← S + γ(Ŝ_C − Ŝ);  w ← C w;  X = S / w

    Trace: S, w.
    """
    S = np.array(X0, dtype=np.float64)
    n = S.shape[0]
    w = np.ones(n)
    Ct = C if callable(C) else (lambda t: C)
    comm = Comm(Ct(1), S.shape, 0.0 if exact else 1.0, compress)
    out = [S.copy()]
    if trace:
        trace(0, {"S": S, "w": w})
    for t in range(1, T + 1):
        if grad is not None:
            S = S - eta * grad(S / w[:, None])
        comm.M = Ct(t)
        Sh, SC = comm(S)
        S = S + gamma * (SC - Sh)
        w = comm.M @ w
        out.append(S / w[:, None])
        if trace:
            trace(t, {"S": S, "w": w})
    return out


def docom(X0: Array, W: Array, grad: Grad, eta: float, gamma: float, beta: float, T: int,
          compress: Compress, grad_pair: Callable[[Array, Array], tuple[Array, Array]] | None = None,
          trace: Trace = None) -> list[Array]:
    """DoCoM (full gradients unless ``grad_pair(X, X_prev)`` gives both at one sample)::

        G, G_old = ∇F(X), ∇F(X_prev);  V' = G + (1−β)(V − G_old);  Y += V' − V;  V = V'
        Y += γ(W Ĥy − Ĥy);  X_prev = X;  X = X − ηY + γ(W Ĥx − Ĥx)
        Ĥx += C(X − Ĥx);  Ĥy += C(Y − Ĥy)       (x rows compressed first, then y rows)

    Trace: X, Y, V.
    """
    X = np.array(X0, dtype=np.float64)
    V = grad(X)
    Y = V.copy()
    X_prev = X.copy()
    Hx, Hy = np.zeros_like(X), np.zeros_like(X)
    out = [X.copy()]
    if trace:
        trace(0, {"X": X, "Y": Y, "V": V})
    for t in range(T):
        G, G_old = (grad(X), grad(X_prev)) if grad_pair is None else grad_pair(X, X_prev)
        Vn = G + (1 - beta) * (V - G_old)
        Y = Y + Vn - V
        V = Vn
        Y = Y + gamma * (W @ Hy - Hy)
        X_prev = X
        X = X - eta * Y + gamma * (W @ Hx - Hx)
        Hx = Hx + _rows(compress, X - Hx)
        Hy = Hy + _rows(compress, Y - Hy)
        out.append(X.copy())
        if trace:
            trace(t + 1, {"X": X, "Y": Y, "V": V})
    return out


def motef(X0: Array, W: Array, grad: Grad, eta: float, gamma: float, lam: float, T: int,
          compress: Compress) -> list[Array]:
    """MoTEF (BEER tracking a momentum), with ``M⁰ = V⁰ = ∇F(X⁰)``, ``H = G = 0``,
    ``X¹ = X⁰ − ηV⁰``; a round::

        M' = (1−λ)M + λ∇F(X);  V += γ(W − I)G + M' − M;  M = M'
        H += C(X − H);  G += C(V − G);  X += γ(W − I)H − ηV
    """
    X = np.array(X0, dtype=np.float64)
    H, Gc = np.zeros_like(X), np.zeros_like(X)
    V = grad(X)
    M = V.copy()
    X = X - eta * V
    out = [X.copy()]
    for _ in range(T):
        Mn = (1 - lam) * M + lam * grad(X)
        V = V + gamma * (W @ Gc - Gc) + Mn - M
        M = Mn
        H = H + _rows(compress, X - H)
        Gc = Gc + _rows(compress, V - Gc)
        X = X + gamma * (W @ H - H) - eta * V
        out.append(X.copy())
    return out


def cecl(X0: Array, W: Array, grad: Grad, eta: float, K: int, rho: float, theta: float, T: int,
         compress: Compress, weight_decay: float = 0.0) -> list[Array]:
    """C-ECL, edge by edge (the neighbors of i are the j with ``W[i, j] != 0``)::

        α_i = 1/(η(K/ρ − 1)|N_i|);  x_i ← (x_i/η − ∇f_i(x_i) − λx_i + α_i Σ_j A_ij z_ij) / (1/η + α_i|N_i|)
        every K-th round:  z_ij ← z_ij + θ C(y_ji − z_ij),  y_ji = z_ji − 2A_ji x_j

    ``A_ij = 1`` if i < j else −1; the message from j is compressed by ``compress(j, ·)``.
    """
    X = np.array(X0, dtype=np.float64)
    n = X.shape[0]
    nbrs = [[j for j in range(n) if j != i and W[i, j] != 0] for i in range(n)]
    Z = {(i, j): np.zeros(X.shape[1]) for i in range(n) for j in nbrs[i]}
    out = [X.copy()]
    for t in range(1, T + 1):
        G = grad(X)
        Xn = np.empty_like(X)
        for i in range(n):
            deg = len(nbrs[i])
            a = 1.0 / (eta * (K / rho - 1.0) * deg)
            dual = sum((1.0 if i < j else -1.0) * Z[(i, j)] for j in nbrs[i])
            Xn[i] = (X[i] / eta - G[i] - weight_decay * X[i] + a * dual) / (1.0 / eta + a * deg)
        X = Xn
        if t % K == 0:
            Y = {(j, i): Z[(j, i)] - 2.0 * (1.0 if j < i else -1.0) * X[j] for (i, j) in Z}
            Z = {(i, j): Z[(i, j)] + theta * compress(j, Y[(j, i)] - Z[(i, j)]) for (i, j) in Z}
        out.append(X.copy())
    return out


def atc_dgd(X0: Array, W: Array, grad: Grad, eta: float, T: int, gamma: float = 1.0) -> list[Array]:
    """Adapt-then-combine DGD (diffusion): ``Ψ = X − η∇F(X)``; ``X ← Ψ + γ(W Ψ − Ψ)``."""
    X = np.array(X0, dtype=np.float64)
    out = [X.copy()]
    for _ in range(T):
        Psi = X - eta * grad(X)
        X = Psi + gamma * (W @ Psi - Psi)
        out.append(X.copy())
    return out


def atc_tracking(X0: Array, W: Array | Callable[[int], Array], grad: Grad, eta: float, T: int,
                 tracker: str, trace: Trace = None) -> list[Array]:
    """ATC gradient tracking, ``Y⁰ = ∇F(X⁰)``, ``X ← W(X − ηY)`` and, with ``tracker``:

    * ``"atc"`` (ATC-DIGing / AugDGM): ``Y ← W(Y + ∇F(X_new) − ∇F(X))``;
    * ``"cta"`` (NEXT / SONATA): ``Y ← W Y + ∇F(X_new) − ∇F(X)``.

    ``W`` a matrix, or ``W(t)`` for round t = 1, 2, ...; ATC-DIGing combines the tracker of
    iteration t with ``W(t + 1)``: its exchange opens round t + 1. Trace: X, Y, G.
    """
    X = np.array(X0, dtype=np.float64)
    Wt = W if callable(W) else (lambda t: W)
    G = grad(X)
    Y = G.copy()
    out = [X.copy()]
    for t in range(1, T + 1):
        M = Wt(t)
        X = M @ (X - eta * Y)
        Gn = grad(X)
        Y = Wt(t + 1) @ (Y + Gn - G) if tracker == "atc" else M @ Y + Gn - G
        G = Gn
        out.append(X.copy())
        if trace:
            trace(t, {"X": X, "Y": Y, "G": G})
    return out


def exact_diffusion(X0: Array, W: Array, grad: Grad, mu: float, T: int) -> list[Array]:
    """Exact diffusion (Yuan, Ying, Zhao, Sayed 2019), adapt–correct–combine with
    ``W̄ = (I + W)/2`` and ``Ψ⁰ = X⁰``::

        Ψ^{k+1} = X^k − μ∇F(X^k);  Φ^{k+1} = Ψ^{k+1} + X^k − Ψ^k;  X^{k+1} = W̄ Φ^{k+1}
    """
    Wb = (np.eye(W.shape[0]) + W) / 2
    X = np.array(X0, dtype=np.float64)
    Psi = X.copy()
    out = [X.copy()]
    for _ in range(T):
        Psi_new = X - mu * grad(X)
        X = Wb @ (Psi_new + X - Psi)
        Psi = Psi_new
        out.append(X.copy())
    return out


def led(X0: Array, W: Array, grad: Grad, alpha: float, beta: float, tau: int, T: int,
        lazy: bool = True) -> list[Array]:
    """LED (Alghunaim 2024), Algorithm 1, ``Y⁰ = 0``, mixing with ``M = (I + W)/2`` (lazy) or W::

        Φ = X;  τ times: Φ ← Φ − α∇F(Φ) − βY;   X ← M Φ;   Y ← Y + Φ − X
    """
    M = (np.eye(W.shape[0]) + W) / 2 if lazy else W
    X = np.array(X0, dtype=np.float64)
    Y = np.zeros_like(X)
    out = [X.copy()]
    for _ in range(T):
        Phi = X.copy()
        for _ in range(tau):
            Phi = Phi - alpha * grad(Phi) - beta * Y
        X = M @ Phi
        Y = Y + Phi - X
        out.append(X.copy())
    return out


# -- variance-reduced tracking (gossip/algorithms/gt_vr.py): the papers' recursions, sample by sample


def vr_picks(seed: int, n: int, sizes: list[int], batch: int, round_: int) -> list[list[int]]:
    """The sample indices every node draws in engine round ``round_`` (its keyed stream)."""
    from gossip.algorithms.gt_vr import STREAM, draw_samples
    from gossip.rng import Stream

    rng = Stream(seed, list(range(n)), STREAM)
    rng.begin_round(round_)
    return [p.tolist() for p in draw_samples(rng, sizes, batch)]


def _sample_grads(problem, i: int, idx: list[int], x: np.ndarray) -> np.ndarray:
    import torch

    return problem.sample_grads(i, torch.tensor(idx), torch.from_numpy(x)).numpy()


def gt_saga(W, X0, problem, eta: float, rounds: int, batch: int, seed: int) -> list[np.ndarray]:
    """GT-SAGA (Xin, Khan, Kar 2020), matrix form: ``X ← W X − η Y``; per node a table ``z`` of
    every sample's last gradient (all at ``x⁰`` first), ``g_i = (1/B) Σ_{s∈S} (∇f_{i,s}(x_i) −
    z_{i,s}) + mean_l z_{i,l}``, then ``z_{i,s} ← ∇f_{i,s}(x_i)``; ``Y ← W Y + G_new − G``.
    Start ``Y = G = ∇F(X⁰)``. The samples of the estimate at ``X^t`` are engine round t + 1's."""
    n = len(X0)
    sizes = [problem.n_samples(i) for i in range(n)]
    X = np.array(X0, dtype=np.float64)
    Z = [_sample_grads(problem, i, list(range(sizes[i])), X[i]) for i in range(n)]
    G = np.stack([z.mean(0) for z in Z])
    Y = G.copy()
    out = [X.copy()]
    for t in range(1, rounds + 1):
        X = W @ X - eta * Y
        picks = vr_picks(seed, n, sizes, batch, t + 1)
        G_new = np.empty_like(G)
        for i in range(n):
            fresh = _sample_grads(problem, i, picks[i], X[i])
            G_new[i] = (fresh - Z[i][picks[i]]).mean(0) + Z[i].mean(0)
            Z[i][picks[i]] = fresh
        Y = W @ Y + G_new - G
        G = G_new
        out.append(X.copy())
    return out


def gt_sarah(W, X0, problem, eta: float, rounds: int, batch: int, period: int,
             seed: int) -> list[np.ndarray]:
    """GT-SARAH (Xin, Khan, Kar), matrix form: ``X ← W X − η Y``; the estimate at ``X^t`` is the
    full local gradient when ``t % q == 0``, else ``V_i + (1/B) Σ_{l∈S} (∇f_{i,l}(x_i^t) −
    ∇f_{i,l}(x_i^{t−1}))``; ``Y ← W Y + V_new − V``. Start ``Y = V = ∇F(X⁰)``."""
    n = len(X0)
    sizes = [problem.n_samples(i) for i in range(n)]

    def full(i, x):
        return _sample_grads(problem, i, list(range(sizes[i])), x).mean(0)

    X = np.array(X0, dtype=np.float64)
    V = np.stack([full(i, X[i]) for i in range(n)])
    Y = V.copy()
    out = [X.copy()]
    for t in range(1, rounds + 1):
        X_prev, X = X, W @ X - eta * Y
        V_new = np.empty_like(V)
        if t % period == 0:
            for i in range(n):
                V_new[i] = full(i, X[i])
        else:
            picks = vr_picks(seed, n, sizes, batch, t + 1)
            for i in range(n):
                V_new[i] = V[i] + (_sample_grads(problem, i, picks[i], X[i])
                                   - _sample_grads(problem, i, picks[i], X_prev[i])).mean(0)
        Y = W @ Y + V_new - V
        V = V_new
        out.append(X.copy())
    return out


def kgt(X0: Array, W: Array, grad: Grad, eta: float, eta_s: float, K: int, T: int) -> list[Array]:
    """K-GT (Liu, Koloskova, Jaggi, Lin 2023), one local step per round, C⁰ = 0::

        Z ← Z − η(∇F(Z) + C);   every K-th round:  Δ = (S − Z)/(Kη);  C ← C + WΔ − Δ;
        Z ← S ← W(S − Kηη_s Δ)
    """
    S = np.array(X0, dtype=np.float64)
    Z, C = S.copy(), np.zeros_like(S)
    out = [Z.copy()]
    for t in range(1, T + 1):
        Z = Z - eta * (grad(Z) + C)
        if t % K == 0:
            D = (S - Z) / (K * eta)
            C = C + W @ D - D
            Z = S = W @ (S - K * eta * eta_s * D)
        out.append(Z.copy())
    return out


def gt_next(X0: Array, W: Array, grad: Grad, eta: float, T: int) -> list[Array]:
    """Gradient tracking, adapt-then-combine x (NEXT; Koloskova, Lin, Stich 2021's form)::

        X ← W(X − ηY);   Y ← WY + ∇F(X_new) − ∇F(X_old);   Y⁰ = ∇F(X⁰)
    """
    X = np.array(X0, dtype=np.float64)
    G = grad(X)
    Y = G.copy()
    out = [X.copy()]
    for _ in range(T):
        X = W @ (X - eta * Y)
        Gn = grad(X)
        Y = W @ Y + Gn - G
        G = Gn
        out.append(X.copy())
    return out


def scaffnew(X0: Array, W: Array, grad: Grad, gamma: float, p: float, tau: float,
             coins: list[bool], T: int) -> list[Array]:
    """Decentralized Scaffnew (ProxSkip on a graph), H⁰ = 0, ``coins[t-1]``: round t communicates::

        X̂ = X − γ(∇F(X) − H);  heads: X = X̂ − τ(I − W)X̂, H ← H + (p/γ)(X − X̂);  tails: X = X̂
    """
    X = np.array(X0, dtype=np.float64)
    H = np.zeros_like(X)
    out = [X.copy()]
    for t in range(1, T + 1):
        Xh = X - gamma * (grad(X) - H)
        if coins[t - 1]:
            X = Xh - tau * (Xh - W @ Xh)
            H = H + p / gamma * (X - Xh)
        else:
            X = Xh
        out.append(X.copy())
    return out
