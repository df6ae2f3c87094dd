"""Float64 matrix-form references of the federated methods (numpy), line by line their papers'
rules (docs/algorithms/fedavg.md and the pages it links): the ground truth the engine's runs on
the star are compared with.

``grads[i](y)`` is client i's gradient (i = 1..N; index 0 unused); ``sample(t)`` the clients of
round t (1-based, with repetition); ``compress(v)`` what the server decodes of an uplink
message of ``v``. Returns the server model after every round, ``[x_0, x_1, ..., x_T]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Array = np.ndarray


def federated(x0: Array, grads: Sequence[Callable[[Array], Array]], rounds: int,
              sample: Callable[[int], list[int]], *, local_steps: int | Sequence[int], eta: float,
              server: str = "sgd", server_lr: float = 1.0, beta1: float = 0.9,
              beta2: float = 0.99, tau: float = 1e-3, weight_decay: float = 0.0,
              mu: float = 0.0, scaffold: bool = False,
              compress: Callable[[Array], Array] | None = None, ef21: bool = False,
              down_compress: Callable[[Array], Array] | None = None,
              data_weights: Sequence[float] | None = None, alpha: float | None = None,
              normalized: bool = False,
              power: tuple[int, Sequence[Callable[[Array], float]]] | None = None) -> list[Array]:
    """FedAvg / FedProx (``mu``) / SCAFFOLD (option II) with the server optimizers of Reddi et
    al. (``server``), an uplink ``compress`` with EF21 memories (``ef21``) and a downlink
    ``down_compress`` against a copy per client of what it knows (both ends keep it);
    ``data_weights`` (client i's at index i − 1) average the sampled clients by their data.
    FedDyn (``alpha``: Acar et al.'s Algorithm 1, ``g_k`` moved by what the server receives),
    FedNova (``normalized``: Δ_i / K_i up, the average times τ_eff = Σ p_i K_i), and
    power-of-choice (``power = (k, losses)``: ``sample(t)`` gives the candidates, each
    evaluates ``losses[i]`` at the model it received, the k highest train, ties to the lower
    id)."""
    N, d = len(grads) - 1, x0.size
    x = x0.astype(np.float64).copy()
    m, v = np.zeros(d), np.full(d, tau**2)
    c, ci = np.zeros(d), np.zeros((N + 1, d))
    up = 2 * d if scaffold else d
    h = np.zeros((N + 1, up))
    known = np.tile(np.concatenate((x, c)) if scaffold else x, (N + 1, 1))  # the downlink copies
    gk, hs = np.zeros((N + 1, d)), np.zeros(d)  # FedDyn's g_k and h
    out = [x.copy()]
    for t in range(1, rounds + 1):
        S = sample(t)
        sent, got = {}, {}
        for i in sorted(set(S)):
            sent_down = np.concatenate((x, c)) if scaffold else x
            if down_compress is not None:
                known[i] = known[i] + down_compress(sent_down - known[i])
                sent_down = known[i]
            got[i] = sent_down
        if power is not None:
            loss = {i: power[1][i](got[i][:d]) for i in got}
            S = sorted(sorted(loss, key=lambda i: (-loss[i], i))[: power[0]])
        for i in sorted(set(S)):
            sent_down = got[i]
            xi, cv = sent_down[:d], sent_down[d:]
            y = xi.copy()
            K = local_steps if isinstance(local_steps, int) else local_steps[i - 1]
            for _ in range(K):
                g = grads[i](y)
                if mu:
                    g = g + mu * (y - xi)
                if scaffold:
                    g = g - ci[i] + cv
                if alpha is not None:
                    g = g - gk[i] + alpha * (y - xi)
                y = y - eta * g
            u = y - xi
            if normalized:
                u = u / K
            if scaffold:
                ci_new = ci[i] - cv + (xi - y) / (K * eta)
                u = np.concatenate((u, ci_new - ci[i]))
            if compress is None:
                sent[i] = u
            elif ef21:
                h[i] = h[i] + compress(u - h[i])
                sent[i] = h[i].copy()
            else:
                sent[i] = compress(u)
            if scaffold:  # c_i moves by what the server receives (c_i⁺ when exact)
                ci[i] = ci[i] + sent[i][d:]
            if alpha is not None:
                gk[i] = gk[i] - alpha * sent[i][:d]
        if not S:
            out.append(x.copy())
            continue
        if data_weights is None:
            avg = sum(sent[i] for i in S) / len(S)
        else:
            w = {i: data_weights[i - 1] for i in S}
            avg = sum(w[i] * sent[i] for i in S) / sum(w[i] for i in S)
        delta = avg[:d]
        if normalized:
            Ks = [local_steps if isinstance(local_steps, int) else local_steps[i - 1] for i in S]
            p = [1.0] * len(S) if data_weights is None else [data_weights[i - 1] for i in S]
            delta = delta * sum(pi * k for pi, k in zip(p, Ks)) / sum(p)
        if server == "sgd":
            x_new = x + server_lr * delta
        else:
            m = beta1 * m + (1 - beta1) * delta
            if server == "adagrad":
                v = v + delta**2
            elif server == "yogi":
                v = v - (1 - beta2) * delta**2 * np.sign(v - delta**2)
            else:
                v = beta2 * v + (1 - beta2) * delta**2
            step = m / (np.sqrt(v) + tau)
            if server == "adamw":
                step = step - weight_decay * x
            x_new = x + server_lr * step
        if scaffold:
            c = c + len(S) / N * avg[d:]
        if alpha:
            hs = hs - alpha * len(S) / N * avg[:d]
            x_new = x_new - hs / alpha
        x = x_new
        out.append(x.copy())
    return out


def cada(x0: Array, grads: Sequence[Callable[[Array], Array]], rounds: int, *, rule: str,
         c: float, d_max: int, max_delay: int, server_lr: float, beta1: float = 0.9,
         beta2: float = 0.99, tau: float = 1e-3,
         compress: Callable[[Array], Array] | None = None) -> tuple[list[Array], list[set[int]]]:
    """CADA (``rule`` "cada1" / "cada2") and G-CADA (``rule`` "g-cada") of Chen et al. with
    deterministic gradients (docs/algorithms/cada.md): every worker's rule against
    ``(c/d_max) Σ_{d=1}^{d_max} ‖θ^{k+1−d} − θ^{k−d}‖²``, an upload at least every
    ``max_delay`` rounds (cada1: its snapshot then), the server's copies ``ĝ_m`` of the
    uploads (EF21 with ``compress``), ``∇ = mean_m ĝ_m`` and Adam in FedAdam's form on ``−∇``.
    Returns the server models ``[θ^0, ..., θ^T]`` and each round's uploaders."""
    N, d = len(grads) - 1, x0.size
    x = x0.astype(np.float64).copy()
    m, v = np.zeros(d), np.full(d, tau**2)
    held = np.zeros((N + 1, d))  # ĝ_m, on both ends
    anchor = np.tile(x, (N + 1, 1))  # cada1: snapshot θ̃; cada2: θ at the last upload
    delta = np.zeros((N + 1, d))  # cada1: δ of the last upload
    run = np.full(N + 1, max_delay - 1)  # skips in a row (the first round uploads)
    moves: list[float] = []  # ‖θ^k − θ^{k−1}‖², newest first
    out, uploads = [x.copy()], []
    for t in range(1, rounds + 1):
        rhs = c / d_max * sum(moves[:d_max])
        refresh = rule == "cada1" and (t - 1) % max_delay == 0
        up = set()
        for i in range(1, N + 1):
            g = grads[i](x)
            forced = refresh or run[i] >= max_delay - 1
            if refresh:
                anchor[i], delta[i] = x, 0.0
            if forced:
                send = True
            elif rule == "cada1":
                dk = g - grads[i](anchor[i])
                send = float(np.sum((dk - delta[i]) ** 2)) > rhs
                if send:
                    delta[i] = dk
            elif rule == "cada2":
                send = float(np.sum((g - grads[i](anchor[i])) ** 2)) > rhs
            else:
                send = float(np.sum((g - held[i]) ** 2)) > rhs
            if send and rule == "cada2":
                anchor[i] = x
            run[i] = 0 if send else run[i] + 1
            if send:
                up.add(i)
                held[i] = held[i] + (g - held[i] if compress is None else compress(g - held[i]))
        grad = held[1:].sum(0) / N
        m = beta1 * m + (1 - beta1) * -grad
        v = beta2 * v + (1 - beta2) * grad**2
        x_new = x + server_lr * m / (np.sqrt(v) + tau)
        moves.insert(0, float(np.sum((x_new - x) ** 2)))
        x = x_new
        out.append(x.copy())
        uploads.append(up)
    return out, uploads


def _adamw(y: Array, g: Array, m: Array, v: Array, t: int, *, eta: float, beta1: float,
           beta2: float, eps: float, weight_decay: float) -> tuple[Array, Array, Array]:
    """One step of torch's AdamW (decoupled decay first, bias correction at step ``t``)."""
    y = y * (1 - eta * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    y = y - eta / (1 - beta1**t) * m / (np.sqrt(v) / np.sqrt(1 - beta2**t) + eps)
    return y, m, v


def fedadamw(x0: Array, grads: Sequence[Callable[[Array], Array]], rounds: int,
             sample: Callable[[int], list[int]], *, local_steps: int, eta: float,
             beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
             weight_decay: float = 0.01, gamma: float = 0.5, clip: float | None = 10.0,
             server_lr: float = 1.0) -> list[Array]:
    """FedAdamW as the authors' code runs it (docs/algorithms/fedadamw.md): client i starts
    from x, m = 0, v = v̄ and the global step count (r − 1)·K; K times: clip the gradient's
    norm, an AdamW step, ``y ← y + (γ η/K) Δ̄``; the server adds the mean Δ_i (times η_s),
    sets v̄ to the mean v_i and Δ̄ to the mean Δ_i over η. Server models after every round."""
    d = x0.size
    x = x0.astype(np.float64).copy()
    vbar, dbar = np.zeros(d), np.zeros(d)
    out = [x.copy()]
    for r in range(1, rounds + 1):
        S = sample(r)
        sent = {}
        for i in sorted(set(S)):
            y, m, v = x.copy(), np.zeros(d), vbar.copy()
            for s in range(local_steps):
                g = grads[i](y)
                if clip is not None:
                    norm = np.sqrt(np.sum(g * g))
                    if clip / (norm + 1e-6) < 1:
                        g = g * (clip / (norm + 1e-6))
                y, m, v = _adamw(y, g, m, v, (r - 1) * local_steps + s + 1, eta=eta, beta1=beta1,
                                 beta2=beta2, eps=eps, weight_decay=weight_decay)
                y = y + gamma * eta / local_steps * dbar
            sent[i] = (y - x, v)
        if S:
            delta = sum(sent[i][0] for i in S) / len(S)
            vbar = sum(sent[i][1] for i in S) / len(S)
            dbar = delta / eta
            x = x + server_lr * delta
        out.append(x.copy())
    return out


def top_set(score: Array, k: int) -> Array:
    """Increasing indices of the k largest entries of ``score``, the lowest index first among
    ties."""
    return np.sort(np.argsort(-score, kind="stable")[:k])


def fedadam_ssm(x0: Array, grads: Sequence[Callable[[Array], Array]], rounds: int,
                sample: Callable[[int], list[int]], *, local_steps: int, eta: float,
                density: float, shared: bool = True, ef21: bool = True, beta1: float = 0.9,
                beta2: float = 0.999, eps: float = 1e-8) -> list[Array]:
    """FedAdam-SSM as docs/algorithms/fedadam-ssm.md states it: client i starts from the
    server's (x, m, v) and the global step count (r − 1)·K, takes K Adam steps, and sends
    (Δx, Δm, Δv) kept on the top-k set of |Δx| (``shared``) or each on its own top-k set
    (k = ⌊density·d⌋), with ``ef21`` against a memory h_i per client (the sparsified
    ``u − h_i`` is sent, ``h_i`` moves by it and the server uses the new ``h_i``); the server
    adds the mean of what it received to (x, m, v)."""
    d = x0.size
    k = max(1, int(density * d))
    x = x0.astype(np.float64).copy()
    m, v = np.zeros(d), np.zeros(d)
    h = np.zeros((len(grads), 3, d))
    out = [x.copy()]
    for r in range(1, rounds + 1):
        S = sample(r)
        sent = {}
        for i in sorted(set(S)):
            y, mi, vi = x.copy(), m.copy(), v.copy()
            for s in range(local_steps):
                y, mi, vi = _adamw(y, grads[i](y), mi, vi, (r - 1) * local_steps + s + 1,
                                   eta=eta, beta1=beta1, beta2=beta2, eps=eps, weight_decay=0.0)
            parts = [y - x, mi - m, vi - v]
            if ef21:
                parts = [p - h[i, j] for j, p in enumerate(parts)]
            kept = []
            for p in parts:
                keep = np.zeros(d)
                sel = top_set(np.abs(parts[0] if shared else p), k)
                keep[sel] = p[sel]
                kept.append(keep)
            if ef21:
                h[i] = h[i] + np.array(kept)
                kept = list(h[i].copy())
            sent[i] = kept
        if S:
            x, m, v = (base + sum(sent[i][j] for i in S) / len(S)
                       for j, base in enumerate((x, m, v)))
        out.append(x.copy())
    return out
