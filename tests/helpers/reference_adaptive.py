"""Dense matrix-form references of the adaptive / all-reduce family (float64, all nodes at once).

Each function runs the rule as written in the algorithm's docstring on an ``(n, d)`` matrix of
node values, with the sums in node order, so the engine's runs can be compared to it to ~1e-12.
``grads(t, X)`` returns the ``(n, d)`` matrix of the nodes' gradients at round ``t``.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def scale(z: torch.Tensor, codec: str) -> torch.Tensor:
    if codec == "sign_l2":
        return torch.sqrt((z * z).sum()) / math.sqrt(z.numel())
    return z.abs().sum() / z.numel()


def sgn(z: torch.Tensor) -> torch.Tensor:
    """sgn with sgn(0) = +1."""
    return torch.where(z < 0, -1.0, 1.0).to(z.dtype)


class AllReduceRef:
    """Two-stage 1-bit all-reduce with worker errors E (n, D') and server errors S (n, c)."""

    def __init__(self, n: int, d: int, codec: str, dtype=torch.float64):
        self.n, self.d, self.codec = n, d, codec
        unit = n * math.lcm(n, 8) if codec != "none" else n
        self.padded = max(unit, -(-d // unit) * unit)
        self.c = self.padded // n
        self.E = torch.zeros(n, self.padded, dtype=dtype)
        self.S = torch.zeros(n, self.c, dtype=dtype)

    def __call__(self, U: torch.Tensor) -> torch.Tensor:
        n, c = self.n, self.c
        Z = torch.zeros(n, self.padded, dtype=U.dtype)
        Z[:, : self.d] = U
        out = torch.zeros(self.padded, dtype=U.dtype)
        if self.codec == "none":
            for j in range(n):
                r = torch.zeros(c, dtype=U.dtype)
                for i in range(n):
                    r += Z[i, j * c : (j + 1) * c]
                out[j * c : (j + 1) * c] = r / n
            return out[: self.d]
        Z += self.E
        A = torch.stack([scale(Z[i], self.codec) for i in range(n)])
        sig = sgn(Z)
        self.E = Z - A[:, None] * sig
        for j in range(n):
            r = torch.zeros(c, dtype=U.dtype)
            for i in range(n):
                r += A[i] * sig[i, j * c : (j + 1) * c]
            r = r / n + self.S[j]
            b = scale(r, self.codec)
            tau = sgn(r)
            self.S[j] = r - b * tau
            out[j * c : (j + 1) * c] = b * tau
        return out[: self.d]


def onebit_adam(x0, grads, rounds, *, eta, freeze_step, beta1=0.9, beta2=0.999, eps=1e-8,
                codec="sign_l2"):
    """1-bit Adam: returns the (n, d) models (identical rows) after ``rounds`` rounds."""
    n, d = x0.shape
    X = x0.clone()
    m = torch.zeros(d, dtype=X.dtype)
    v = torch.zeros(d, dtype=X.dtype)
    fp, ar = AllReduceRef(n, d, "none"), AllReduceRef(n, d, codec)
    for t in range(1, rounds + 1):
        G = grads(t, X)
        if t <= freeze_step:
            g = fp(G)
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
        else:
            m = ar(beta1 * m + (1 - beta1) * G) * (v != 0)
        X = X - eta * (m / (torch.sqrt(v) + eps))
    return X


# -- a small deterministic problem the engine and the references share ---------------------------


def quadratic_problem(n: int, d: int, seed: int = 0, scales=None):
    """Heterogeneous least squares ``f_i(x) = s_i/2 ‖A_i x − b_i‖²`` (float64).

    Returns ``(A, b, s)`` and a ``grads(t, X)`` for the references; :class:`QuadraticOracle`
    gives the same gradients to the engine's nodes.
    """
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(n, 12, d, generator=gen, dtype=torch.float64) / math.sqrt(12)
    b = torch.randn(n, 12, generator=gen, dtype=torch.float64) + 2.0 * torch.randn(
        1, 12, generator=gen, dtype=torch.float64)
    s = torch.ones(n, dtype=torch.float64) if scales is None else torch.tensor(scales, dtype=torch.float64)

    def grads(t, X):
        return torch.stack([s[i] * (A[i].T @ (A[i] @ X[i] - b[i])) for i in range(n)])

    return (A, b, s), grads


class QuadraticOracle:
    """Node i's gradient of :func:`quadratic_problem` (the engine's oracle protocol)."""

    def __init__(self, data, i: int):
        A, b, s = data
        self.A, self.b, self.s = A[i], b[i], float(s[i])

    def grad(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        g = self.s * (self.A.T @ (self.A @ x - self.b))
        if out is None:
            return g
        return out.copy_(g)


def run_engine(algorithm, topology, x0: torch.Tensor, data, rounds: int, compressor: str = "none"):
    """Run ``algorithm`` in process on the quadratic problem; returns (engine, (n, d) models)."""
    from gossip.engine import Engine

    eng = Engine(algorithm, topology, lambda i: x0[i], compressor=compressor,
                 oracles=lambda i, gen: QuadraticOracle(data, i), seed=1)
    eng.run(rounds, log_every=rounds)
    return eng, torch.stack([eng.nodes[i].x for i in range(topology.n)])


def zero_one_adam(x0, grads, rounds, *, eta, var_freeze_step, var_update_scaler,
                  local_step_scaler, local_step_clipper, beta1=0.9, beta2=0.999, eps=1e-8,
                  codec="sign_l2"):
    """0/1 Adam with DeepSpeed's T_v / T_u policies; returns the (n, d) models."""
    n, d = x0.shape
    X = x0.clone()
    M = torch.zeros(n, d, dtype=X.dtype)  # rows equal until the local steps
    v = torch.zeros(d, dtype=X.dtype)
    U = torch.zeros(n, d, dtype=X.dtype)
    fp, ar = AllReduceRef(n, d, "none"), AllReduceRef(n, d, codec)
    var_interval, var_counter, ls_interval, ls_counter, eta_sum = 1, 0, 1, 0, 0.0
    for t in range(1, rounds + 1):
        G = grads(t, X)
        if t <= var_freeze_step:
            if t % var_interval == 0:
                g = fp(G)
                v = beta2 * v + (1 - beta2) * g * g
            else:
                g = ar(G) * (v != 0)
            M = beta1 * M + (1 - beta1) * g
            X = X - eta * (M / (torch.sqrt(v) + eps))
            if t % var_interval == 0:
                var_counter += 1
                if var_counter == var_update_scaler:
                    var_counter, var_interval = 0, var_interval * 2
            continue
        if t == var_freeze_step + 1:
            ar.E.zero_()
            ar.S.zero_()
            Xsync = X.clone()
        M = beta1 * M + (1 - beta1) * G
        eta_sum += eta
        delta = eta * (M / (torch.sqrt(v) + eps))
        X, U = X - delta, U - delta
        if t % ls_interval == 0:
            denom = torch.sqrt(v) + eps
            ubar = ar(U * denom) * (v != 0)
            M = (ubar / -eta_sum).expand(n, d).clone()
            X = (Xsync + ubar / denom).expand(n, d).clone()
            Xsync = X.clone()
            U = torch.zeros_like(U)
            eta_sum = 0.0
        ls_counter += 1
        if ls_counter == local_step_scaler:
            ls_counter, ls_interval = 0, min(local_step_clipper, 2 * ls_interval)
    return X


def signum_vote(x0, grads, rounds, *, eta, beta=0.9, weight_decay=0.0, byzantine=()):
    """Signum with majority vote (tie -> 0); returns the (n, d) models."""
    n, d = x0.shape
    X = x0.clone()
    M = torch.zeros(n, d, dtype=X.dtype)
    flip = torch.tensor([-1.0 if i in byzantine else 1.0 for i in range(n)], dtype=X.dtype)
    for t in range(1, rounds + 1):
        M = beta * M + (1 - beta) * grads(t, X)
        s = torch.sign((sgn(M * flip[:, None])).sum(0))
        X = X - eta * (s + weight_decay * X)
    return X


def adasum_pair(a, b):
    dot, na, nb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1 - dot / (2 * na) if na >= 1e-8 else 1.0
    cb = 1 - dot / (2 * nb) if nb >= 1e-8 else 1.0
    return ca * a + cb * b


def adasum(x0, grads, rounds, *, eta, sizes, local="adam", beta1=0.9, beta2=0.999, eps=1e-8):
    """Adasum in delta mode: binary tree in node order, per tensor of ``sizes``."""
    n, d = x0.shape
    X = x0.clone()
    M = torch.zeros(n, d, dtype=X.dtype)
    V = torch.zeros(n, d, dtype=X.dtype)
    for t in range(1, rounds + 1):
        G = grads(t, X)
        if local == "adam":
            M = beta1 * M + (1 - beta1) * G
            V = beta2 * V + (1 - beta2) * G * G
            D = -eta * (M / (torch.sqrt(V) + eps))
        else:
            D = -eta * G
        parts = list(D)
        while len(parts) > 1:  # the tree: (0,1), (2,3), … then pairs of pairs
            nxt = []
            for k in range(0, len(parts), 2):
                a, b = parts[k], parts[k + 1]
                out, o = torch.empty_like(a), 0
                for s in sizes:
                    out[o : o + s] = adasum_pair(a[o : o + s], b[o : o + s])
                    o += s
                nxt.append(out)
            parts = nxt
        X = X + parts[0]
    return X


def dadam(x0, grads, rounds, W, *, eta, beta1=0.9, beta2=0.999, eps=1e-8, gossip_steps=1):
    X = x0.clone()
    M, V, Vmax = (torch.zeros_like(X) for _ in range(3))
    WK = torch.linalg.matrix_power(W, gossip_steps)
    for t in range(1, rounds + 1):
        G = grads(t, X)
        M = beta1 * M + (1 - beta1) * G
        V = beta2 * V + (1 - beta2) * G * G
        Vmax = torch.maximum(Vmax, V)
        X = WK @ X - eta * M / (torch.sqrt(Vmax) + eps)
    return X


def tracked_amsgrad(x0, grads, rounds, W, *, eta, beta1=0.9, beta2=0.999, eps=1e-8,
                    gossip_steps=1, track=None):
    """Decentralized AMSGrad with u-tracking; ``track(t, U, Vhat)`` is called every round."""
    X = x0.clone()
    M, V = torch.zeros_like(X), torch.zeros_like(X)
    Vhat, U = torch.full_like(X, eps), torch.full_like(X, eps)
    WK = torch.linalg.matrix_power(W, gossip_steps)
    for t in range(1, rounds + 1):
        G = grads(t, X)
        M = beta1 * M + (1 - beta1) * G
        V = beta2 * V + (1 - beta2) * G * G
        Vnew = torch.maximum(Vhat, V)
        U = WK @ U - Vhat + Vnew
        X = WK @ X - eta * M / torch.sqrt(torch.clamp(U, min=eps))
        Vhat = Vnew
        if track is not None:
            track(t, U, Vhat)
    return X


def desloc(x0, grads, rounds, W, *, eta, period_x, period_m, period_v, beta1=0.9, beta2=0.999,
           eps=1e-8, clip=1.0, gossip_steps=1):
    X = x0.clone()
    M, V = torch.zeros_like(X), torch.zeros_like(X)
    WK = torch.linalg.matrix_power(W, gossip_steps)
    for t in range(1, rounds + 1):
        G = grads(t, X)
        M = beta1 * M + (1 - beta1) * G
        V = beta2 * V + (1 - beta2) * G * G
        step = M / (torch.sqrt(V) + eps)
        X = X - eta * (torch.clamp(step, -clip, clip) if clip else step)
        if t % period_x == 0:
            X = WK @ X
        if period_m and t % period_m == 0:
            M = WK @ M
        if period_v and t % period_v == 0:
            V = WK @ V
    return X


def accum_adam(x0, grads, rounds, W, *, eta, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
               accum_iter=4, gamma=1.0, decoupled=False):
    """AccumAdam(W) (Decent-DP's accum_adam(w)_foreach) under D-PSGD's mixing, in matrix form:
    the gradient at X, then Y = X + γ (W − I) X, then the step of Y with moments that move
    once per window of ``accum_iter`` rounds from the window's mean gradient."""
    X = x0.clone()
    M, V, B = (torch.zeros_like(X) for _ in range(3))
    eye = torch.eye(W.shape[0], dtype=W.dtype)
    s = accum_iter
    for t in range(1, rounds + 1):
        G = grads(t, X)
        Y = X + gamma * ((W - eye) @ X)
        if decoupled:
            Y = (1 - eta * weight_decay) * Y
        else:
            G = G + weight_decay * Y
        B = B + G / s
        k = -(-t // s)
        Mt = beta1 * M + (1 - beta1) * G
        Vt = beta2 * V + (1 - beta2) * G * G
        X = Y - eta / (1 - beta1**k) * Mt / (torch.sqrt(Vt) / math.sqrt(1 - beta2**k) + eps)
        if t % s == 0:
            M = beta1 * M + (1 - beta1) * B
            V = beta2 * V + (1 - beta2) * B * B
            B = torch.zeros_like(B)
    return X


def onebit_lamb(x0, grads, rounds, *, eta, freeze_step, sizes, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.0, max_coeff=10.0, min_coeff=0.01, coeff_beta=0.9, factor_max=4.0,
                factor_min=0.5, factor_threshold=0.1, codec="sign_l2"):
    """1-bit LAMB per tensor of ``sizes``; returns the (n, d) models (identical rows)."""
    n, d = x0.shape
    x = x0[0].clone()
    m, v = torch.zeros(d, dtype=x.dtype), torch.zeros(d, dtype=x.dtype)
    v_fresh = torch.zeros(d, dtype=x.dtype)
    fp, ar = AllReduceRef(n, d, "none"), AllReduceRef(n, d, codec)
    parts, o = [], 0
    for s in sizes:
        parts.append(slice(o, o + s))
        o += s
    trust, scaling, last = [0.0] * len(parts), [1.0] * len(parts), [1.0] * len(parts)
    clip = lambda a, lo, hi: min(max(a, lo), hi)  # noqa: E731
    for t in range(1, rounds + 1):
        G = grads(t, x.expand(n, d))
        if t <= freeze_step:
            g = fp(G)
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
            if t == freeze_step:
                v_fresh = v.clone()
            upd = m / (torch.sqrt(v) + eps) + weight_decay * x
            x = x.clone()
            for k, p in enumerate(parts):
                wn, un = float(x[p].norm()), float(upd[p].norm())
                c = clip(wn / un, min_coeff, max_coeff) if wn > 0 and un > 0 else 1.0
                if c != 1.0:
                    trust[k] = coeff_beta * trust[k] + (1 - coeff_beta) * c
                x[p] = x[p] - eta * c * upd[p]
            continue
        if t == freeze_step + 1:
            rms = [float(m[p].norm()) / s ** 0.5 for p, s in zip(parts, sizes)]
            scaling = [sum(rms) / len(rms) / r if r > 0 else 1.0 for r in rms]
        k_vec = torch.cat([torch.full((s,), scaling[k], dtype=x.dtype) for k, s in enumerate(sizes)])
        m_old = m
        m = ar((beta1 * m + (1 - beta1) * G) * k_vec) / k_vec * (v != 0)
        g_rec = (m - beta1 * m_old) / (1 - beta1)
        v_fresh = beta2 * v_fresh + (1 - beta2) * g_rec * g_rec
        plain_upd = m / (torch.sqrt(v) + eps)
        upd = plain_upd + weight_decay * x
        x = x.clone()
        for k, p in enumerate(parts):
            f = float(((torch.sqrt(v[p]) + eps) / (torch.sqrt(v_fresh[p]) + eps)).max())
            if weight_decay:
                full = float(upd[p].norm())
                r = min(1.0, float(plain_upd[p].norm()) / full) if full > 0 else 1.0
                f = f * r + (1 - r)
            f = clip(f, factor_min, factor_max)
            f = clip(f, last[k] * (1 - factor_threshold), last[k] * (1 + factor_threshold))
            last[k] = f
            x[p] = x[p] - eta * trust[k] * f * upd[p]
    return x.expand(n, d).clone()


def choco_amsgrad(x0, grads, rounds, W, *, eta, gamma, compress, beta1=0.9, beta2=0.999,
                  eps=1e-8, track=None):
    """Tracked AMSGrad with CHOCO copies of x and u; ``compress(v) -> C(v)`` per row."""
    X = x0.clone()
    M, V = torch.zeros_like(X), torch.zeros_like(X)
    Vhat, U = torch.full_like(X, eps), torch.full_like(X, eps)
    Xh, Uh = torch.zeros_like(X), torch.zeros_like(X)
    rows = lambda A: torch.stack([compress(a) for a in A])  # noqa: E731
    for t in range(1, rounds + 1):
        G = grads(t, X)
        M = beta1 * M + (1 - beta1) * G
        V = beta2 * V + (1 - beta2) * G * G
        Vnew = torch.maximum(Vhat, V)
        U = U - Vhat + Vnew
        Vhat = Vnew
        X = X - eta * M / torch.sqrt(torch.clamp(U, min=eps))
        X = X + gamma * (W @ Xh - Xh)
        U = U + gamma * (W @ Uh - Uh)
        Xh = Xh + rows(X - Xh)
        Uh = Uh + rows(U - Uh)
        if track is not None:
            track(t, U, Vhat)
    return X


def topk(k: int):
    """Keep the k entries of largest magnitude (ties to the lowest index), as ``topk:K``."""
    def compress(v):
        keep = torch.from_numpy(np.argsort(-np.abs(v.numpy()), kind="stable")[:k])
        out = torch.zeros_like(v)
        out[keep] = v[keep]
        return out

    return compress


def lodadac(x0, grads, rounds, W, *, eta, gamma, local_steps, rule, compress=None, beta1=0.9,
            beta2=0.999, delta=1e-8, parts=None):
    """LoDAdaC (Algorithm 1 of the paper) in matrix form, with the paper's start x̂⁰ = x⁰ (the
    rows of ``x0`` equal): the step with the previous round's U, then every ``local_steps``-th
    round X̂ ← X̂ + Q(X − X̂), X ← X + γ (W X̂ − X̂). ``compress(v) -> Q(v)`` per row (None: the
    identity); ``parts``: Adam-mini's slices (default one over the whole row)."""
    X, Xh = x0.clone(), x0.clone()
    M, U, V = (torch.zeros_like(X) for _ in range(3))
    parts = parts or [slice(0, X.shape[1])]
    for t in range(1, rounds + 1):
        G = grads(t, X)
        M = beta1 * M + (1 - beta1) * G
        X = X - eta * M / (torch.sqrt(U) + delta)
        if rule == "adam":
            U = beta2 * U + (1 - beta2) * G * G
        elif rule == "amsgrad":
            V = beta2 * V + (1 - beta2) * G * G
            U = torch.maximum(U, V)
        elif rule == "adagrad":
            U = U + (G * G - U) / t
        elif rule == "adam-mini":
            S = torch.empty_like(G)
            for p in parts:
                S[:, p] = (G[:, p] * G[:, p]).mean(1, keepdim=True)
            U = beta2 * U + (1 - beta2) * S
        if t % local_steps == 0:
            D = X - Xh
            Xh = Xh + (D if compress is None else torch.stack([compress(r) for r in D]))
            X = X + gamma * (W @ Xh - Xh)
    return X


def choco_sgd(x0, grads, rounds, W, *, eta, gamma, compress):
    """CHOCO-SGD as in Koloskova, Stich, Jaggi (ICML 2019), Algorithm 2, node by node, with the
    copies starting at x⁰: x^{t+½} = x − η g;  q_i = Q(x_i^{t+½} − x̂_i);  x̂_j += q_j for all j;
    x_i ← x_i^{t+½} + γ Σ_j w_ij (x̂_j − x̂_i)."""
    X, Xh = x0.clone(), x0.clone()
    n = X.shape[0]
    for t in range(1, rounds + 1):
        X = X - eta * grads(t, X)
        Xh = Xh + torch.stack([compress(X[i] - Xh[i]) for i in range(n)])
        X = X + gamma * torch.stack([sum(W[i, j] * (Xh[j] - Xh[i]) for j in range(n)) for i in range(n)])
    return X


def squarm(x0, grads, rounds, W, *, eta, gamma, compress, beta=0.9, local_steps=5,
           threshold=2.0, threshold_step=0.0, threshold_every=0):
    """SQuARM-SGD (docs/algorithms/squarm-sgd.md): local Nesterov steps, CHOCO's consensus and
    copies every ``local_steps`` rounds, a node sending only when ``‖x_i − x̂_i‖² > c_t η²``.
    Returns the (n, d) models and the sends and skipped sends, summed over the nodes."""
    X = x0.clone()
    V, Xh = torch.zeros_like(X), torch.zeros_like(X)
    trigger = threshold > 0 or threshold_step > 0
    sends = skips = 0
    for t in range(1, rounds + 1):
        G = grads(t, X)
        V = beta * V + G
        X = X - eta * (G + beta * V)
        if t % local_steps:
            continue
        X = X + gamma * (W @ Xh - Xh)
        c = threshold + (threshold_step * ((t - 1) // threshold_every) if threshold_every else 0.0)
        for i in range(X.shape[0]):
            if not trigger or float(((X[i] - Xh[i]) ** 2).sum()) > c * eta * eta:
                Xh[i] = Xh[i] + compress(X[i] - Xh[i])
                sends += 1
            else:
                skips += 1
    return X, sends, skips
