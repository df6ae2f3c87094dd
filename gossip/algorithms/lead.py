"""LEAD (Liu et al. ICLR'21; docs/algorithms/lead.md): linear convergence to the exact optimum.

NIDS in which the only message is a compressed difference ``q_i = C(y_i − h_i)`` against a
DIANA-style state ``h_i`` every neighbor can rebuild. Per node: ``x, d, h, hw = Σ_j w_ij h_j``.
First (no communication): ``x_i ← x_i⁰ − η ∇f_i(x_i⁰)``. Then each round::

    g = ∇f_i(x_i);  y_i = x_i − η g − η d_i;  q_i = C(y_i − h_i);  send q_i, receive q_j
    ŷ_i = h_i + q_i;   ŷw_i = hw_i + Σ_{j∈N_i⁺} w_ij q_j
    h_i ← (1 − α) h_i + α ŷ_i;   hw_i ← (1 − α) hw_i + α ŷw_i
    d_i ← d_i + γ_dual/(2η) (ŷ_i − ŷw_i);   x_i ← x_i − η g − η d_i     (same g, new d)

With the ``none`` compressor and γ_dual = 1 the iterates are NIDS's. Theory: unbiased
compressors with variance ω, α ≤ 1/(1+ω); biased ones (top-k, sign) work with smaller α, γ_dual.

Robust per arc (``arcs``, registered as ``lead-arcs``, docs/algorithms/lead-arcs.md): the state
is kept per arc, ``h_ij`` at both ends, moved by both only when ``q_ij = C(y_i − h_ij)`` was
delivered; the dual step becomes ``d_i += γ_dual/(2η) (Σ_j w_ji ŷ_ij − Σ_j w_ij ŷ_ji)``, whose
sum over the nodes stays 0 whatever was lost (W symmetric), so the fixed point stays x*. Every
arc draws its sender's numbers, so without loss the run is LEAD's to rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.core.algorithm import Algorithm, ArcsForm, Round, check_range
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.compensated import CompensatedSum
from gossip.core.requirements import Requirements


def default_lead_hparams(compressor: Any, dim: int, beta: float) -> dict[str, float]:
    """α and γ_dual suited to a compressor on a d-vector (docs/algorithms/lead.md; tune from here).

    * identity: α = γ_dual = 1 (NIDS);
    * quantizers (``lead:B``, ``qsgd``, ``natural``, casts): 0.5 / 1. Their worst-case ω is
      loose (``lead:2`` at d = 200: bound 7.1, typical 0.64) and 0.5 / 1 converges at NIDS speed;
    * rescaled rand-k, whose variance is ω‖x‖² for every x: γ_dual = min(1, 1/((3ω+1)β)) — half
      the recalled bound of docs/algorithms/lead.md, which sat at the edge of stability for rand-10% — and
      α = min(1/(1+ω), γ_dual);
    * biased compressors (top-k, sign, low-rank): 0.1 / 0.5.

    Read from the compressor's properties (``unbiased``, ``omega_for``, ``omega_exact``: the
    variance is ω‖x‖² for every x), so a user's compressor gets the rule its properties say.
    """
    if not compressor.unbiased:
        return {"alpha": 0.1, "gamma_dual": 0.5}
    omega = compressor.omega_for(dim)
    if omega == 0:
        return {"alpha": 1.0, "gamma_dual": 1.0}
    if compressor.omega_exact and omega is not None and omega > 1.0:
        gamma_dual = min(1.0, 1.0 / ((3.0 * omega + 1.0) * beta))
        return {"alpha": min(1.0 / (1.0 + omega), gamma_dual), "gamma_dual": gamma_dual}
    return {"alpha": 0.5, "gamma_dual": 1.0}


class LEAD(Algorithm):
    """LEAD: NIDS with compressed differences ``q_i = C(y_i − h_i)``; exact linear convergence.

    ``y_i = x_i − η g − η d_i``; send ``q_i``; ``h_i, hw_i`` move by ``α`` towards
    ``h_i + q_i`` and ``hw_i + Σ_j w_ij q_j``; ``d_i += γ_dual/(2η) (ŷ_i − ŷw_i)``;
    ``x_i ← x_i − η g − η d_i``. See docs/algorithms/lead.md. With its ``arcs`` option
    (``lead-arcs``) ``h`` is kept per arc and moved at both ends only on delivery, which keeps
    ``Σ_i d_i = 0`` under any loss (docs/algorithms/lead-arcs.md).

    Args:
        eta: step size (constant); ``1/L`` converges. Default 0.1.
        alpha: state momentum α in (0, 1]; default from the compressor's ω.
        gamma_dual: dual step in (0, 1] (1 = NIDS); default from ω and the graph's β.
    """
    name = "lead"
    state_copies = 12
    trains = True
    requires = Requirements(gradients=True, compressor="bounded-variance")
    step_rule = "exact"
    on_loss = "drop"  # q_j increments the receiver's state hw: a lost one is missed
    arcs_form = ArcsForm(  # out- and in-arc copies, their reconstructions, the differences
        state_copies=8, neighbor_copies=5,
        requires=Requirements(
            gradients=True, compressor="bounded-variance",
            compressor_message="{name} needs an unbiased compressor of bounded variance (or a "
                               "contractive one) and sends a different message on every arc; "
                               "'{spec}' is neither: use lead:2, qsgd, randk, topk or none"))

    def __init__(self, eta: float = 0.1, alpha: float | None = None, gamma_dual: float | None = None):
        check_range("eta", eta, 0.0, float("inf"), "Use eta = 1/L (the problem's smoothness).")
        if alpha is not None:
            check_range("alpha", alpha, 0.0, 1.0, "Theory: alpha <= 1/(1 + omega).")
        if gamma_dual is not None:
            check_range("gamma_dual", gamma_dual, 0.0, 1.0, "gamma_dual = 1 recovers NIDS.")
        self.eta = eta
        self.alpha = alpha
        self.gamma_dual = gamma_dual

    def setup(self, block: Block) -> None:
        hp = block.hparams
        if hp["alpha"] is None or hp["gamma_dual"] is None:  # the run's defaults, never self's
            defaults = default_lead_hparams(block.compressor, block.x.shape[1],
                                            float(block.topology.beta))
            hp.update({k: v for k, v in defaults.items() if hp[k] is None})
        x = block.x
        block.state["d"] = torch.zeros_like(x)
        block.workspace["dual"] = CompensatedSum(block, "d")  # Σ_i d_i = 0 kept to the last bit
        block.workspace["channel"] = self.channel(block, hp["alpha"])
        block.workspace.update(grad=torch.empty_like(x), y=torch.empty_like(x))
        x.add_(block.gradients(block.workspace["grad"]), alpha=-self.eta)  # X¹ = X⁰ − η∇F(X⁰)
        self.finish(block)

    def channel(self, block: Block, alpha: float) -> Channel:
        """Where ``y`` goes: public copies ``h`` and ``hw = Σ_j w_ij h_j`` damped by α
        (``block.state`` keys ``"h"`` and ``"gap"`` = ``hw − h``); per arc (``arcs``) the
        copies ``h_ij`` (``block.arc_state`` ``"h_to{j}"``: node i's out-arcs, ``"h_from{j}"``:
        its in-arcs), every arc drawing its sender's numbers."""
        return Channel(block, "y", memory=alpha, keys=("h", "gap"),
                       route=self.route(keys=("h_to{j}", "h_from{j}"), draws="sender"))

    def finish(self, block: Block) -> None:
        """The last line of a step (Prox-LEAD applies its prox here)."""

    def step(self, block: Block) -> Round:
        x, ws, eta = block.x, block.workspace, self.eta
        d, y, ch = block.state["d"], ws["y"], ws["channel"]
        g = block.gradients(ws["grad"])
        torch.sub(x, g, alpha=eta, out=y).sub_(d, alpha=eta)  # y = x − ηg − ηd
        inbox = yield ch.send(y)  # q = C(y − h)
        # d += γ_dual/(2η) (ŷ − ŷw), ŷw − ŷ being the channel's gap; h, hw move by α
        # (per arc: −(Σ_j w_ij ŷ_ji − Σ_j w_ji ŷ_ij), the copies of the delivered arcs moved)
        ws["dual"].add_(ch.gap(inbox), alpha=-block.hparams["gamma_dual"] / (2.0 * eta))
        x.sub_(g, alpha=eta).sub_(d, alpha=eta)
        self.finish(block)
