"""CHOCO-Gossip and CHOCO-SGD (Koloskova et al. ICML'19 / ICLR'20; docs/algorithms/choco.md).

Every node keeps a public copy ``x̂_i`` that all its neighbors agree on, and only compressed
differences ``q_i = C(x_i − x̂_i)`` travel. Memory-efficient form: ``x``, ``x̂_i`` and
``s_i = Σ_{j∈N_i⁺} w_ij x̂_j`` (self term included). One round, ICLR'20 order::

    x_i ← x_i − η ∇f_i(x_i)                  (CHOCO-SGD only: when the node has an oracle)
    x_i ← x_i + γ (s_i − x̂_i)                (consensus step with the old copies)
    q_i = C(x_i − x̂_i);  send q_i, receive q_j
    x̂_i ← x̂_i + q_i;  s_i ← s_i + Σ_{j∈N_i⁺} w_ij q_j

Works with any contractive compressor; an unbiased one with variance ω enters rescaled, as
``C/(1 + ω)`` (the copies move by 1/(1 + ω) of each message: CHOCO's form of such a compressor).
γ defaults to a rule from the compressor's δ and the graph (:mod:`gossip.algorithms.consensus_step`);
too large a γ diverges, sometimes late. The sender updates x̂_i with the decoded message, exactly
what receivers add.

Robust per arc (``arcs``, registered as ``choco-arcs``, docs/algorithms/choco-arcs.md): the
channel keeps a copy ``x̂_ij`` per arc instead, held by both ends and moved by both only when
``q_ij = C(x_i − x̂_ij)`` was delivered; the consensus step becomes
``x_i ← x_i + γ Σ_j w_ij (x̂_ji − x̂_ij)``, whose sum over the nodes is zero whatever was lost
(W symmetric), so the average moves only by the local steps. The round is the same code.

Precision: the channel keeps ``s_i − x̂_i`` rather than ``s_i`` (it shrinks with the consensus
error, so its roundings do too) and, for a float32 model, keeps and sums it in float64: the
error stays where it converged and the average where it was
(:mod:`gossip.core.channel`, tests/algorithms/test_precision.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.consensus_step import copy_damping, default_gamma
from gossip.core.algorithm import Algorithm, ArcsForm, Round, check_range, scheduled
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError

log = logging.getLogger(__name__)


class Choco(Algorithm):
    """CHOCO-Gossip / CHOCO-SGD: compressed differences against public copies ``x̂``.

    One round: ``x_i ← x_i − η ∇f_i(x_i)`` (with an oracle); ``x_i ← x_i + γ (s_i − x̂_i)``;
    send ``q_i = C(x_i − x̂_i)``; ``x̂_i += q_i``; ``s_i += Σ_{j∈N_i⁺} w_ij q_j``.
    See docs/algorithms/choco.md. With its ``arcs`` option (``choco-arcs``) the public copies
    are kept per arc and acknowledged: ``x_i ← x_i + γ Σ_j w_ij (x̂_ji − x̂_ij)``, ``q_ij`` on
    every arc, applied at both ends where delivered (docs/algorithms/choco-arcs.md).

    Args:
        gamma: consensus step, > 0 (too large diverges). CHOCO's analysis covers (0, 1]; above 1
            a warning is logged (PowerGossip's reference code runs 1.3 with sign on a ring), and
            a γ at which even exact gossip diverges on the graph, ``γ ≥ 2 / (1 − λ_min(W))``, is
            refused. Default (None): ``min(1, δ / (3 max_i (1 − w_ii)))`` from the compressor's
            contraction δ (1/(1 + ω) for an unbiased one) and the mixing weights
            (:func:`gossip.algorithms.consensus_step.default_gamma`), resolved at setup into
            ``block.hparams`` (the log's config record); 1 with no compression.
        eta: local step size or schedule (training uses the node's optimizer). Default 0.
    """
    name = "choco"
    state_copies = 7  # x, the copies x̂ and s − x̂, the first round's decodes and weighted sums
    wide_copies = 6  # all but x in float64 for a float32 model (peak RSS measured, docs/notes/scale-setup.md)
    trains = True
    takes_optimizer = True
    overlaps = "next"  # the mix changes only x̂ and s
    tunable = ("gamma",)
    step_schedule = True
    step_rule = "dgd"
    on_loss = "drop"  # q_j increments the receiver's copy x̂_j: a lost one is missed
    arcs_form = ArcsForm(  # x̂_ij and x̂_ji per arc; the message scratch and rows per arc
        state_copies=4, neighbor_copies=4,
        requires=Requirements(
            compressor="stateless",
            compressor_message="{name} sends a different message on every arc; '{spec}' keeps "
                               "state per stream: use a stateless compressor (topk, randk, qsgd, "
                               "sign, none)"))

    def __init__(self, gamma: float | None = None, eta: float | Callable[[int], float] = 0.0):
        if gamma is not None:
            check_range("gamma", gamma, 0.0, math.inf, "CHOCO's consensus step; tune it on a grid.",
                        include_high=False)
        self.gamma = gamma
        self.eta = eta

    def validate(self, topology: Any, compressor: Any) -> None:
        """Refuse a γ at which the exact iteration ``x ← x + γ (W − I) x`` already diverges
        (its eigenvalues ``1 + γ (λ − 1)`` leave [−1, 1] for ``γ ≥ 2 / (1 − λ_min)``); warn
        above 1, where convergence depends on the compressor."""
        if self.gamma is None or self.gamma <= 1.0:  # the default rule gives at most 1
            return
        spectrum = getattr(topology, "spectrum", None)
        lam = getattr(spectrum, "lambda_min", None)
        if lam is not None and lam == lam and self.gamma * (1.0 - lam) >= 2.0:
            raise ConfigError(
                f"gamma = {self.gamma:g} makes {self.name} diverge on {topology.name} even without "
                f"compression: x + γ(W − I)x contracts only for γ < 2/(1 − λ_min(W)) = "
                f"{2.0 / (1.0 - lam):.4g}; use --gamma at most 1 (the range CHOCO's analysis covers) "
                "or below that bound")
        log.warning("gamma = %g is above 1, outside the range CHOCO's analysis covers (0, 1]; "
                    "it converges only when the compressor is accurate enough: watch the "
                    "consensus error", self.gamma)

    def resolve(self, block: Block) -> float:
        """Fill the default γ into ``block.hparams`` (an explicit one is kept as given) and
        return how far the public copies move by each message: 1, or 1/(1 + ω) for an unbiased
        compressor (``"choco"`` memory when 1)."""
        numel = block.x.shape[1]
        if block.hparams["gamma"] is None:
            block.hparams["gamma"] = default_gamma(block.compressor, numel, block.topology,
                                                   name=self.name, warn=0 in block.ids)
        return copy_damping(block.compressor, numel)

    def setup(self, block: Block) -> None:
        # x̂ and s − x̂ in block.state, updated by one decode of the messages; per arc x̂_ij
        # ("x_hat_to{j}") and x̂_ji ("x_hat_from{j}") in block.arc_state, a randomized
        # compressor drawing from the arcs' "arc" streams
        alpha = self.resolve(block)
        block.workspace["channel"] = Channel(
            block, "x", memory="choco" if alpha == 1.0 else alpha, keys=("x_hat", "gap"),
            route=self.route(keys=("x_hat_to{j}", "x_hat_from{j}"), stream="arc"))
        if block.has_oracle:
            block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block: Block) -> Round:
        x, ws = block.x, block.workspace
        ch = ws["channel"]
        if block.has_oracle:
            block.local_step(block.gradients(ws["grad"]), scheduled(self.eta, block.round))
        x.add_(ch.gap(), alpha=block.hparams["gamma"])  # x ← x + γ (s − x̂), the last copies
        inbox = yield ch.send(x)  # q = C(x − x̂)
        ch.update(inbox)  # x̂ += q;  s += Σ_j w_ij q_j (kept as s − x̂); per arc: where delivered
