"""LEAD (Liu et al. ICLR'21; ALGORITHMS.md §4): linear convergence to the exact optimum.

NIDS in which the only message is a compressed difference ``q_i = C(y_i − h_i)`` against a
DIANA-style state ``h_i`` every neighbor can rebuild. Per node: ``x, d, h, hw = Σ_j w_ij h_j``.
First (no communication): ``x_i ← x_i⁰ − η ∇f_i(x_i⁰)``. Then each round::

    g = ∇f_i(x_i);  y_i = x_i − η g − η d_i;  q_i = C(y_i − h_i);  send q_i, receive q_j
    ŷ_i = h_i + q_i;   ŷw_i = hw_i + Σ_{j∈N_i⁺} w_ij q_j
    h_i ← (1 − α) h_i + α ŷ_i;   hw_i ← (1 − α) hw_i + α ŷw_i
    d_i ← d_i + γ_dual/(2η) (ŷ_i − ŷw_i);   x_i ← x_i − η g − η d_i     (same g, new d)

With the ``none`` compressor and γ_dual = 1 the iterates are NIDS's. Theory: unbiased
compressors with variance ω, α ≤ 1/(1+ω); biased ones (top-k, sign) work with smaller α, γ_dual.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.algorithms.base import (
    Algorithm,
    ConfigError,
    Node,
    RoundGenerator,
    check_range,
    mix_into,
    send_payload,
)


def default_lead_hparams(compressor: Any) -> dict[str, float]:
    """α and γ_dual suited to a compressor (ALGORITHMS.md §4.4; tune upward from here).

    Identity: α = γ_dual = 1 (NIDS). Unbiased with ω ≤ 1 (e.g. ``lead:2``, ``natural``): 0.5 / 1.
    Unbiased with larger ω: α = 1/(1+ω), γ_dual = α. Biased (top-k, sign): 0.1 / 0.5.
    """
    omega = getattr(compressor, "omega", None)
    if compressor.unbiased and omega is not None and omega == 0:
        return {"alpha": 1.0, "gamma_dual": 1.0}
    if compressor.unbiased:
        if omega is None or omega <= 1.0:
            return {"alpha": 0.5, "gamma_dual": 1.0}
        a = 1.0 / (1.0 + omega)
        return {"alpha": a, "gamma_dual": a}
    return {"alpha": 0.1, "gamma_dual": 0.5}


class LEAD(Algorithm):
    name = "lead"
    needs_oracle = True

    def __init__(self, eta: float = 0.1, alpha: float | None = None, gamma_dual: float | None = None):
        check_range("eta", eta, 0.0, float("inf"), "Use eta = 1/L (the problem's smoothness).")
        if alpha is not None:
            check_range("alpha", alpha, 0.0, 1.0, "Theory: alpha <= 1/(1 + omega).")
        if gamma_dual is not None:
            check_range("gamma_dual", gamma_dual, 0.0, 1.0, "gamma_dual = 1 recovers NIDS.")
        self.eta = eta
        self.alpha = alpha
        self.gamma_dual = gamma_dual

    def validate(self, topology: Any, compressor: Any) -> None:
        defaults = default_lead_hparams(compressor)
        if self.alpha is None:
            self.alpha = defaults["alpha"]
        if self.gamma_dual is None:
            self.gamma_dual = defaults["gamma_dual"]
        if getattr(compressor, "spec", "").startswith("lowrank"):
            raise ConfigError("LEAD needs a compressor of bounded variance; lowrank has none")

    def setup(self, node: Node) -> None:
        x = node.x
        st = node.state
        st.update(
            d=torch.zeros_like(x), h=torch.zeros_like(x), hw=torch.zeros_like(x),
            grad=torch.empty_like(x), y=torch.empty_like(x), y_hat=torch.empty_like(x),
            yw_hat=torch.empty_like(x),
        )
        x.add_(node.oracle.grad(x, st["grad"]), alpha=-self.eta)  # X¹ = X⁰ − η∇F(X⁰)
        self.finish(node)

    def finish(self, node: Node) -> None:
        """The last line of a step (Prox-LEAD applies its prox here)."""

    def step(self, node: Node) -> RoundGenerator:
        x, st, eta = node.x, node.state, self.eta
        d, h, hw, y, y_hat, yw_hat = st["d"], st["h"], st["hw"], st["y"], st["y_hat"], st["yw_hat"]
        g = node.oracle.grad(x, st["grad"])
        torch.sub(x, g, alpha=eta, out=y).sub_(d, alpha=eta)  # y = x − ηg − ηd
        diff = y_hat  # scratch until ŷ is formed
        q = node.compressor.encode(torch.sub(y, h, out=diff), node.generator)
        inbox = yield send_payload(node, q, diff)
        y_hat.copy_(h)
        node.compressor.decode_add_(y_hat, q, 1.0)
        mix_into(node, yw_hat.copy_(hw), q, inbox)
        a = self.alpha
        h.mul_(1.0 - a).add_(y_hat, alpha=a)
        hw.mul_(1.0 - a).add_(yw_hat, alpha=a)
        d.add_(y_hat.sub_(yw_hat), alpha=self.gamma_dual / (2.0 * eta))
        x.sub_(g, alpha=eta).sub_(d, alpha=eta)
        self.finish(node)
