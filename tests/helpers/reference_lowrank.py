"""Dense float64 reference of the low-rank all-reduce methods (greedylore, powersgd).

The rule of docs/algorithms/greedylore.md written per node and per matrix, all nodes at once,
with no buffers, chunks or messages: an all-reduce is the mean over the nodes in node order.
The probes and warm-start factors come from the run's shared stream, as the spec says
(``Stream(seed, [0], "lowrank-allreduce")``, one call per matrix in layout order; the initial
``Qᵀ`` factors at round 0).
"""

from __future__ import annotations

import math

import torch

from gossip.rng import Stream


def _mean(rows: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros_like(rows[0])
    for r in rows:
        total = total + r
    return total / len(rows)


def _gram_schmidt_rows(a: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Rows made orthonormal in order, each divided by max(‖row‖, eps)."""
    a = a.clone()
    for i in range(a.shape[0]):
        a[i] = a[i] / max(float(a[i].norm()), eps)
        for j in range(i + 1, a.shape[0]):
            a[j] = a[j] - (a[j] @ a[i]) * a[i]
    return a


def lowrank_allreduce(x0: torch.Tensor, grads, rounds: int, *, shapes, eta: float, rank: int,
                      refresh: int, start: int, min_compression: float, subspace: str,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The models ``(n, d)`` after ``rounds`` rounds and the error memories ``(n, d)``."""
    n, d = x0.shape
    X, E = x0.clone(), torch.zeros(n, d, dtype=x0.dtype)
    mats, off = [], 0
    for shape in shapes:
        size = math.prod(shape)
        if len(shape) > 1:
            a, b = shape[0], size // shape[0]
            r = min(rank, a, b)
            sent = r * max(a, b) if subspace == "greedy" else r * (a + b)
            if sent * min_compression < a * b:
                mats.append((off, a, b, r))
        off += size
    in_mat = torch.zeros(d, dtype=torch.bool)
    for o, a, b, _ in mats:
        in_mat[o : o + a * b] = True
    rng = Stream(seed, [0], "lowrank-allreduce")
    rng.begin_round(0)
    basis, Qt = {}, {}
    if subspace == "power":
        for o, _, b, r in mats:
            Qt[o] = rng.normal(r * b, dtype=x0.dtype)[0].view(r, b)

    def mat_of(v, o, a, b):
        return v[o : o + a * b].reshape(a, b)

    def short(M, a, b):
        return M if a < b else M.T

    for t in range(1, rounds + 1):
        G = grads(t, X)
        k = t - start - 1
        if k < 0 or not mats or (refresh and k % refresh == 0):
            gbar = _mean(list(G))
            if k >= 0 and mats:
                E.zero_()
                if subspace == "greedy":
                    for o, a, b, _ in mats:
                        basis[o] = torch.linalg.svd(short(mat_of(gbar, o, a, b), a, b),
                                                    full_matrices=False).U
        else:
            rng.begin_round(t)
            A = G + E
            gbar = _mean(list(A))  # the entries reduced in full (E is 0 there)
            gbar[in_mat] = 0.0
            for o, a, b, r in mats:
                As = [mat_of(A[i], o, a, b) for i in range(n)]
                if subspace == "greedy":
                    B = basis[o]
                    s, L = min(a, b), max(a, b)
                    z = rng.normal(s * L, dtype=x0.dtype)[0].view(s, L)
                    c = _mean([((B.T @ short(M, a, b)) * z).sum(1) for M in As])
                    order = sorted(range(s), key=lambda j: (-float(c[j] ** 2), j))[:r]
                    P = B[:, order]
                    R = [P.T @ short(M, a, b) for M in As]
                    for i in range(n):
                        Ei = short(As[i], a, b) - P @ R[i]
                        E[i, o : o + a * b] = (Ei if a < b else Ei.T).reshape(-1)
                    D = P @ _mean(R)
                    gbar[o : o + a * b] = (D if a < b else D.T).reshape(-1)
                else:
                    Pt = _gram_schmidt_rows(_mean([Qt[o] @ M.T for M in As]))
                    Qbar = _mean([Pt @ M for M in As])
                    approx = Pt.T @ Qbar
                    for i in range(n):
                        E[i, o : o + a * b] = (As[i] - approx).reshape(-1)
                    gbar[o : o + a * b] = approx.reshape(-1)
                    Qt[o] = Qbar if float(Qbar.norm()) >= 1e-12 else \
                        rng.normal(r * b, dtype=x0.dtype)[0].view(r, b)
        X = X - eta * gbar
    return X, E
