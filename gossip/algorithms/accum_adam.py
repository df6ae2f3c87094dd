"""Decentralized AccumAdam / AccumAdamW (Wang, Zhang, Wu, Johansson, ICLR 2025; Decent-DP 0.2.3).

D-PSGD's round (send ``x_i``, take the gradient at that ``x_i``, mix) with, as the local step,
Adam whose persistent moments move once per window of ``s = accum_iter`` rounds, from the
window's mean gradient, while every round still steps with a moment that includes the current
gradient (docs/algorithms/accum-adam.md)::

    g = ∇f_i(x_i);   y = x_i + γ (Σ_j w_ij x_j − x_i)             (gradient at the sent x_i)
    accum-adam:  g ← g + λ y          accum-adamw:  y ← (1 − η λ) y
    b ← b + g/s;   m̃ = β1 m + (1−β1) g;   ṽ = β2 v + (1−β2) g²;   k = ⌈t/s⌉
    x_i ← y − η/(1−β1^k) · m̃ / (√ṽ/√(1−β2^k) + ε)
    every s-th round:  m ← β1 m + (1−β1) b;   v ← β2 v + (1−β2) b²;   b ← 0

The paper's point: with small local batches the per-step gradient is noisy, and moments built
from the mean of ``s`` of them behave like those of an ``s`` times larger batch, without
delaying the model's steps. With ``s = 1`` it is Adam (AdamW) under D-PSGD's mixing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import torch

from gossip.algorithms.allreduce import adaptive_hparams, check_betas
from gossip.algorithms.dpsgd import DPSGD
from gossip.core.algorithm import Round, check_range, scheduled
from gossip.core.block import Block
from gossip.errors import ConfigError


class AccumAdam(DPSGD):
    r"""AccumAdam: D-PSGD's round with Adam whose moments accumulate over ``accum_iter`` rounds.

    ::

        g = ∇f_i(x_i);   y = x_i + γ (Σ_j w_ij x_j − x_i);   g ← g + λ y   (L2, on the mixed y)
        b ← b + g/s;   m̃ = β1 m + (1−β1) g;   ṽ = β2 v + (1−β2) g²;   k = ⌈t/s⌉
        x_i ← y − η/(1−β1^k) · m̃ / (√ṽ/√(1−β2^k) + ε)
        t ≡ 0 (mod s):  m ← β1 m + (1−β1) b;   v ← β2 v + (1−β2) b²;   b ← 0

    ``t`` is the round (1, 2, ...). What travels is the model, exact, as in D-PSGD (the gradient
    is taken at the model sent, so ``--overlap`` computes it while the messages travel).
    :class:`AccumAdamW` decays the mixed model instead, ``y ← (1 − ηλ) y``, and leaves ``g``
    alone. See docs/algorithms/accum-adam.md.

    Args:
        eta: learning rate, a number or a schedule ``eta(t)``. Default 1e-3.
        beta1, beta2: Adam's. Defaults 0.9, 0.999.
        eps: added to the bias-corrected ``√ṽ``. Default 1e-8.
        weight_decay: λ; None takes the class's default (1/32768 here, 0.1 for accum-adamw,
            Decent-DP's ``optim_fn_accum_adam(w)`` defaults).
        accum_iter: s, the rounds whose mean gradient moves the moments once. Default 4.
        gamma: relaxation of the mixing (Decent-DP's adaptive factor; 1 = plain ``W x``).
    """

    name = "accum-adam"
    decoupled: ClassVar[bool] = False
    """Weight decay on the model (AdamW) instead of an L2 term in the gradient (Adam)."""
    default_weight_decay: ClassVar[float] = 1.0 / 32768
    requires = replace(DPSGD.requires, compressor="identity",
                       compressor_message="{name} mixes exact models, as Decent-DP: use --compressor "
                                          "none (got '{spec}'); for compressed messages use "
                                          "choco-amsgrad")
    takes_optimizer = False  # it is its own optimizer
    state_copies = 9

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float | None = None,
                 accum_iter: int = 4, gamma: float = 1.0):
        super().__init__(eta, gamma)
        check_range("eta", eta, 0.0, float("inf"))
        check_betas(beta1, beta2)
        check_range("eps", eps, 0.0, float("inf"))
        if weight_decay is None:
            weight_decay = self.default_weight_decay
        check_range("weight_decay", weight_decay, 0.0, float("inf"), include_low=True)
        if int(accum_iter) != accum_iter or int(accum_iter) < 1:
            raise ConfigError(f"accum_iter = {accum_iter} must be an integer >= 1 (1: plain Adam)")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.weight_decay, self.accum_iter = float(weight_decay), int(accum_iter)

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta`` sized from the problem, as for the other Adam-like methods
        (:func:`~gossip.algorithms.allreduce.adaptive_hparams`)."""
        return adaptive_hparams(cls, problem)

    def setup(self, block: Block) -> None:
        super().setup(block)
        z = torch.zeros_like(block.x)
        block.state.update(m=z, v=z.clone(), accum=z.clone())  # m, v persistent; accum = b
        block.workspace.update(m_now=torch.empty_like(z), v_now=torch.empty_like(z))

    def step(self, block: Block) -> Round:
        inbox = yield block.workspace["channel"].send(block.x)  # x_i travels, while (--overlap)
        g = block.gradients(block.workspace["grad"])  # ∇f_i is taken at that x_i, still unmixed
        self.mix(block, inbox)  # x ← x + γ (W − I) x
        self.adam_step(block, g)

    def adam_step(self, block: Block, g: torch.Tensor) -> None:
        """The AccumAdam(W) step of the mixed ``x`` with the gradient ``g`` (changed in place
        by the L2 term), as Decent-DP's ``accum_adam(w)_foreach``."""
        st, ws, x = block.state, block.workspace, block.x
        t, s, b1, b2 = block.round, self.accum_iter, self.beta1, self.beta2
        eta, lam = scheduled(self.eta, t), self.weight_decay
        if lam:
            if self.decoupled:
                x.mul_(1.0 - eta * lam)
            else:
                g.add_(x, alpha=lam)
        st["accum"].add_(g, alpha=1.0 / s)
        m_now = torch.mul(st["m"], b1, out=ws["m_now"]).add_(g, alpha=1.0 - b1)
        denom = torch.mul(st["v"], b2, out=ws["v_now"]).addcmul_(g, g, value=1.0 - b2)
        k = (t + s - 1) // s
        denom.sqrt_().div_(math.sqrt(1.0 - b2**k)).add_(self.eps)
        x.addcdiv_(m_now, denom, value=-eta / (1.0 - b1**k))
        if t % s == 0:
            b = st["accum"]
            st["m"].mul_(b1).add_(b, alpha=1.0 - b1)
            st["v"].mul_(b2).addcmul_(b, b, value=1.0 - b2)
            b.zero_()


class AccumAdamW(AccumAdam):
    """AccumAdamW: :class:`AccumAdam` with decoupled weight decay ``y ← (1 − ηλ) y`` on the
    mixed model instead of an L2 term in the gradient. See docs/algorithms/accum-adamw.md.

    Args:
        eta, beta1, beta2, eps, accum_iter, gamma: as :class:`AccumAdam`'s.
        weight_decay: λ of the decoupled decay; None: 0.1 (Decent-DP's
            ``optim_fn_accum_adamw`` default).
    """

    name = "accum-adamw"
    decoupled = True
    default_weight_decay = 0.1
