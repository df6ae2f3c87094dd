"""C-ECL: compressed edge-consensus learning (Takezawa, Niwa, Yamada 2023).

A primal-dual method: every edge (i, j) carries dual variables, neighbors exchange compressed
*dual* updates every K rounds, and no model is ever sent.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.algorithms.base import (
    Algorithm,
    ConfigError,
    Exchange,
    Node,
    RoundGenerator,
    check_range,
    received,
)
from gossip.algorithms.streams import PerNode


class CECL(Algorithm):
    r"""C-ECL on an undirected graph. Node i keeps its model ``w_i`` and, per neighbor j, its dual
    ``z_ij`` and a mirror ``r_ij`` of the neighbor's dual ``z_ji`` (which only i's messages
    change); ``A_ij = +1`` if ``i < j`` else ``−1``, ``|N_i|`` the degree. Every round::

        α_i = 1 / (η (K/ρ − 1) |N_i|)
        w_i ← (w_i/η − ∇f_i(w_i) − λ w_i + α_i Σ_j A_ij z_ij) / (1/η + α_i |N_i|)

    and every K-th round, on every edge, both ways::

        y_ij = z_ij − 2 A_ij w_i;   q_ij = C(y_ij − r_ij);   send q_ij to j;   r_ij += θ q_ij
        on receiving q_ji:   z_ij += θ q_ji

    With a random mask for C (``randk:ρ``) this is the authors' rule
    ``z_ij += θ mask ⊙ (y_ji − z_ij)``: the sender knows ``z_ij`` through its mirror, so only the
    masked values travel (rand-k sends its seed, not the indices). Any compressor works the same
    way; ρ enters the step α only. Per node: ``w`` plus three d-vectors per edge (dual,
    mirror, scratch for the message). One message per edge direction every K rounds.

    Reaches the exact optimum on heterogeneous data (no gradient tracking needed); compression
    costs rounds, not accuracy.

    Args:
        eta: step size η (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
        period: K, rounds between dual exchanges (default 5).
        rho: kept fraction ρ in α (default: k/d for the sparsifiers, e.g. ``randk:0.2`` → 0.2;
            1 otherwise). Needs ``K/ρ > 1``.
        theta: dual step θ ∈ (0, 1] (default 1).
        weight_decay: λ, an extra L2 term on the model (default 0; the authors use 0.001).
    """

    name = "c-ecl"
    trains = True
    needs_oracle = True
    tunable = ("theta",)

    def __init__(self, eta: float = 0.05, period: int = 5, rho: float | None = None,
                 theta: float = 1.0, weight_decay: float = 0.0):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.1/L to 0.3/L.")
        if not isinstance(period, int) or period < 1:
            raise ConfigError(f"period = {period!r} must be an integer >= 1 (rounds between exchanges)")
        if rho is not None:
            check_range("rho", rho, 0.0, 1.0, "The fraction of a dual update a message keeps.")
        check_range("theta", theta, 0.0, 1.0, "The dual step; 1 in the authors' scripts.")
        if weight_decay < 0:
            raise ConfigError(f"weight_decay = {weight_decay} must be >= 0")
        self.eta = eta
        self.period = period
        self.rho = rho
        self.theta = theta
        self.weight_decay = weight_decay
        self._work = PerNode(_Edges)

    def validate(self, topology: Any, compressor: Any) -> None:
        if getattr(compressor, "stateful", False):
            raise ConfigError(f"c-ecl sends one stream per edge; '{compressor.spec}' keeps state "
                              "per stream: use a stateless compressor (randk, topk, qsgd, lead)")
        if self.rho is not None:
            self._check_rho(self.rho)

    def _check_rho(self, rho: float) -> None:
        if self.period / rho <= 1.0:
            raise ConfigError(
                f"c-ecl needs period/rho > 1 (its step α = 1/(η (K/ρ − 1) |N_i|)), got K = "
                f"{self.period}, ρ = {rho:g}; use --period 2 or more, or a compressor that "
                "keeps a fraction (e.g. randk:0.2)"
            )

    def kept_fraction(self, node: Node) -> float:
        """ρ: given, else the fraction of entries a sparsifier keeps (k/d), else 1."""
        if self.rho is not None:
            return self.rho
        k_for = getattr(node.compressor, "k_for", None)
        d = node.x.numel()
        return min(1.0, k_for(d) / d) if k_for is not None else 1.0

    def setup(self, node: Node) -> None:
        x, st = node.x, node.state
        nbrs = node.view.neighbors
        if not nbrs:
            raise ConfigError(f"node {node.id} has no neighbors; c-ecl needs a connected graph")
        st["z"] = [torch.zeros_like(x) for _ in nbrs]  # in the order of sorted(neighbors)
        st["r"] = [torch.zeros_like(x) for _ in nbrs]
        self._work(node)
        st["grad"] = torch.empty_like(x)
        st["acc"] = torch.empty_like(x)
        self._check_rho(self.kept_fraction(node))

    def step(self, node: Node) -> RoundGenerator:
        x, st, i = node.x, node.state, node.id
        work = self._work(node)
        nbrs, msg = work.neighbors, work.msg
        z, r = dict(zip(nbrs, st["z"], strict=True)), dict(zip(nbrs, st["r"], strict=True))
        deg = len(nbrs)
        mu = 1.0 / self.eta
        alpha = 1.0 / (self.eta * (self.period / self.kept_fraction(node) - 1.0) * deg)
        g = node.oracle.grad(x, st["grad"])
        acc = st["acc"].copy_(x).mul_(mu - self.weight_decay).sub_(g)
        for j in nbrs:
            acc.add_(z[j], alpha=alpha if i < j else -alpha)
        x.copy_(acc).div_(mu + alpha * deg)
        if node.round % self.period:
            return
        comp, theta = node.compressor, self.theta
        sent, bufs = {}, {}
        for j in nbrs:  # y_ij − r_ij = z_ij − 2 A_ij w_i − r_ij
            d = torch.sub(z[j], r[j], out=msg[j]).add_(x, alpha=-2.0 if i < j else 2.0)
            sent[j] = comp.encode(d, node.rng)
            bufs[j] = sent[j].to_bytes()
        inbox = yield Exchange(bufs, comp.max_nbytes(x))
        for j in nbrs:
            comp.decode_add_(r[j], sent[j], theta)
            comp.decode_add_(z[j], received(comp, inbox, j, x), theta)


class _Edges:
    """A node's sorted neighbors and its per-edge message buffers (scratch, outside node.state)."""

    def __init__(self, node: Node):
        self.neighbors = sorted(node.view.neighbors)
        self.msg = {j: torch.empty_like(node.x) for j in self.neighbors}
