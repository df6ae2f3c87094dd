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
              sample: Callable[[int], list[int]], *, local_steps: int, eta: float,
              server: str = "sgd", server_lr: float = 1.0, beta1: float = 0.9,
              beta2: float = 0.99, tau: float = 1e-3, weight_decay: float = 0.0,
              mu: float = 0.0, scaffold: bool = False,
              compress: Callable[[Array], Array] | None = None, ef21: bool = False,
              down_compress: Callable[[Array], Array] | None = None,
              data_weights: Sequence[float] | None = None) -> list[Array]:
    """FedAvg / FedProx (``mu``) / SCAFFOLD (option II) with the server optimizers of Reddi et
    al. (``server``), an uplink ``compress`` with EF21 memories (``ef21``) and a downlink
    ``down_compress`` against a copy per client of what it knows (both ends keep it);
    ``data_weights`` (client i's at index i − 1) average the sampled clients by their data."""
    N, d = len(grads) - 1, x0.size
    x = x0.astype(np.float64).copy()
    m, v = np.zeros(d), np.full(d, tau**2)
    c, ci = np.zeros(d), np.zeros((N + 1, d))
    up = 2 * d if scaffold else d
    h = np.zeros((N + 1, up))
    known = np.tile(np.concatenate((x, c)) if scaffold else x, (N + 1, 1))  # the downlink copies
    out = [x.copy()]
    for t in range(1, rounds + 1):
        S = sample(t)
        sent = {}
        for i in sorted(set(S)):
            sent_down = np.concatenate((x, c)) if scaffold else x
            if down_compress is not None:
                known[i] = known[i] + down_compress(sent_down - known[i])
                sent_down = known[i]
            xi, cv = sent_down[:d], sent_down[d:]
            y = xi.copy()
            for _ in range(local_steps):
                g = grads[i](y)
                if mu:
                    g = g + mu * (y - xi)
                if scaffold:
                    g = g - ci[i] + cv
                y = y - eta * g
            u = y - xi
            if scaffold:
                ci_new = ci[i] - cv + (xi - y) / (local_steps * eta)
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
        if not S:
            out.append(x.copy())
            continue
        if data_weights is None:
            avg = sum(sent[i] for i in S) / len(S)
        else:
            w = {i: data_weights[i - 1] for i in S}
            avg = sum(w[i] * sent[i] for i in S) / sum(w[i] for i in S)
        delta = avg[:d]
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
        x = x_new
        out.append(x.copy())
    return out
