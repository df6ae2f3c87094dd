"""LoDAdaC: local adaptive steps and, every K steps, a CHOCO-style compressed exchange
(Liu, Panda, Pandey, Cook, Slota, Wang, Chen, Xu, TMLR 2026, arXiv 2604.09970, Algorithm 1;
docs/algorithms/lodadac.md).

Every node takes one adaptive step per round with the second moment of the PREVIOUS round
(``u⁻¹ = 0``, so the first step is ``α m/δ``); every K-th round it sends the compressed
difference between its half-step model and its public copy ``x̂_i``, and moves toward the
mixed copies with the new ones::

    g = ∇f_i(x_i);   m ← β1 m + (1−β1) g
    x_i ← x_i − α m / (√u + δ)                 (x^{t+½}, with u = u^{t−1})
    u ← r_t(g⁰ … g)                            (the second-moment rule, below)
    every K-th round:
        q_i = Q(x_i − x̂_i);  send q_i, receive q_j
        x̂_i ← x̂_i + q_i;   y_i ← y_i + Σ_j w_ij q_j        (y_i = Σ_j w_ij x̂_j, self included)
        x_i ← x_i + γ (y_i − x̂_i)

The copies and ``y − x̂`` are a :class:`~gossip.core.channel.Channel` with CHOCO's memory
(``send`` then ``gap(inbox)``: the paper's order, consensus with the copies just moved). The
second-moment rules (the paper's Table 2, no bias correction): ``none`` (u ≡ 0: SGD with
β1 = 0, heavy ball with β1 > 0), ``adam`` (``u ← β2 u + (1−β2) g²``), ``amsgrad``
(``v ← β2 v + (1−β2) g²``, ``u ← max(u, v)``), ``adagrad`` (``u`` the running mean of ``g²``)
and ``adam-mini`` (``adam`` with one value per tensor of the layout: the mean of ``g²`` over it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.allreduce import adam_moments_, adaptive_hparams, check_betas
from gossip.core.algorithm import Algorithm, Round, check_range, scheduled
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError

RULES = ("none", "adam", "amsgrad", "adagrad", "adam-mini")
"""The second-moment rules ``r_t`` of the paper's Table 2."""

STARTS = ("common", "zero")
"""Where the public copies start: at the nodes' common start ``x⁰`` (the paper's), or at 0."""


class LoDAdaC(Algorithm):
    r"""LoDAdaC: K local adaptive steps, then one compressed exchange of public copies.

    ::

        m ← β1 m + (1−β1) g;   x_i ← x_i − α m/(√u + δ);   u ← r_t(g⁰ … g)
        round ≡ 0 (mod K):  q_i = Q(x_i − x̂_i);  x̂_i += q_i;  y_i += Σ_j w_ij q_j;
                            x_i ← x_i + γ (y_i − x̂_i)

    Rounds that do not communicate send nothing. With ``local_steps = 1``, ``rule = "none"``,
    ``beta1 = 0`` and ``delta = 1`` it is CHOCO-SGD in the order of Koloskova et al.'s ICML'19
    box (send, then the consensus step with the new copies; the ``choco`` class runs the
    ICLR'20 order, with last round's copies). With ``local_steps = 1``, ``--compressor none``
    and ``gamma = 1`` the exchange is ``x ← W x^{t+½}``. See docs/algorithms/lodadac.md.

    Args:
        eta: α, the step size (a number or a schedule ``eta(t)``). Default 1e-3.
        gamma: γ in (0, 1], the consensus step. Default 0.5 (the authors' release code).
        local_steps: K, the rounds per exchange (the exchange closes rounds K, 2K, ...).
            Default 20 (the paper's main comparisons).
        rule: the second moment: ``"none"``, ``"adam"``, ``"amsgrad"``, ``"adagrad"`` or
            ``"adam-mini"``. Default ``"amsgrad"``.
        beta1, beta2: the moments' factors (β2 unused by ``none`` and ``adagrad``).
            Defaults 0.9, 0.999.
        delta: δ > 0 added to ``√u``. Default 1e-3, our choice: the first step is ``α m/δ``
            (``u⁻¹ = 0``), which Adam's 1e-8 turns into a jump of 10⁴–10⁷ times α (the paper's
            theory takes an O(1) δ; δ = 1 with ``rule = "none"`` makes the step α m).
        start: where the public copies start: ``"common"`` (default, the paper's ``x̂⁰ = x⁰``,
            ``y⁰ = x⁰``: every node must start from the same model, as training does) or
            ``"zero"`` (``x̂⁰ = 0``, CHOCO's convention here: any starting models).
    """

    name = "lodadac"
    trains = True
    takes_optimizer = False  # its own adaptive step
    step_schedule = True
    tunable = ("gamma",)
    requires = Requirements(gradients=True, compressor="any")
    on_loss = "drop"  # q_j increments the receiver's copy x̂_j: a lost one is missed, as CHOCO's
    state_copies = 10

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, gamma: float = 0.5,
                 local_steps: int = 20, rule: str = "amsgrad", beta1: float = 0.9,
                 beta2: float = 0.999, delta: float = 1e-3, start: str = "common"):
        check_range("eta", eta, 0.0, float("inf"), include_low=True)  # 0: compressed consensus
        check_range("gamma", gamma, 0.0, 1.0, "LoDAdaC's consensus step (Algorithm 1: 0 ≤ γ ≤ 1; "
                                              "the authors' code runs 0.5).")
        check_betas(beta1, beta2)
        check_range("delta", delta, 0.0, float("inf"), "δ is added to √u; the paper's theory takes "
                                                       "an O(1) δ.")
        if int(local_steps) != local_steps or int(local_steps) < 1:
            raise ConfigError(f"local_steps = {local_steps} must be an integer >= 1 (K: rounds per "
                              "exchange; 1 exchanges every round)")
        if rule not in RULES:
            raise ConfigError(f"rule = {rule!r} is not one of {', '.join(RULES)} (the second-moment "
                              "rule: none for SGD / heavy ball)")
        if start not in STARTS:
            raise ConfigError(f"start = {start!r} is not 'common' (copies at the common start, the "
                              "paper's) or 'zero' (copies at 0, for nodes that start apart)")
        self.eta, self.gamma, self.local_steps, self.rule = eta, float(gamma), int(local_steps), rule
        self.beta1, self.beta2, self.delta, self.start = float(beta1), float(beta2), float(delta), start

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta`` sized from the problem, as for the other Adam-like methods
        (:func:`~gossip.algorithms.allreduce.adaptive_hparams`: ``η = r/(20 L)``, r the RMS of
        the start's gradient), and ``delta = η L = r/20``: where ``√u`` is below δ (the first
        step above all, with ``u⁻¹ = 0``) the step is at most a gradient step of ``1/L``."""
        hp = adaptive_hparams(cls, problem)
        if "eta" in hp:
            hp["delta"] = hp["eta"] * float(problem.smoothness().L)
        return hp

    def validate_block(self, block: Block) -> None:
        """With ``start = "common"`` the copies start at the node's own model and ``y − x̂`` at 0,
        which is the paper's start only when every node starts from the same model: refuse this
        process's nodes when they differ (nodes in other processes cannot be seen here; the
        training scripts check that every process starts from the same model)."""
        x = block.x
        if self.start == "common" and x is not None and x.shape[0] > 1 and not bool((x == x[:1]).all()):
            raise ConfigError(f"{self.name} starts its public copies at the common start x⁰ "
                              "(Algorithm 1: x_i⁰ = x̂_i⁰ = x⁰), but the nodes start from different "
                              "models: start them equal, or pass start='zero' (copies at 0)")

    def setup(self, block: Block) -> None:
        x = block.x
        z = torch.zeros_like(x)
        block.state.update(m=z, u=z.clone())
        if self.rule == "amsgrad":
            block.state["v"] = z.clone()  # AMSGrad's running v (u is its running maximum)
        block.workspace.update(grad=torch.empty_like(x), step=torch.empty_like(x))
        ch = Channel(block, "x", memory="choco", keys=("x_hat", "gap"))
        if self.start == "common":
            ch.copy.copy_(x)  # x̂⁰ = x⁰; y⁰ − x̂⁰ = 0 holds as every node starts at x⁰
        block.workspace["channel"] = ch
        if self.rule == "adam-mini":
            layout = block.nodes[0].layout
            block.workspace["parts"] = [slice(o, o + s) for o, s in zip(layout.offsets, layout.sizes)]

    def step(self, block: Block) -> Round:
        st, ws, x = block.state, block.workspace, block.x
        g = block.gradients(ws["grad"])
        adam_moments_(st["m"], None, g, self.beta1, self.beta2)
        u = st["u"]
        denom = torch.sqrt(u, out=ws["step"]).add_(self.delta)  # √u^{t−1} + δ
        x.addcdiv_(st["m"], denom, value=-scheduled(self.eta, block.round))  # x^{t+½}
        self.second_moment(block, g)
        if block.round % self.local_steps == 0:
            ch = ws["channel"]
            inbox = yield ch.send(x)  # q = Q(x^{t+½} − x̂)
            x.add_(ch.gap(inbox), alpha=self.gamma)  # x̂ += q;  y += Σ_j w_ij q_j;  x += γ (y − x̂)

    def second_moment(self, block: Block, g: torch.Tensor) -> None:
        """``u ← r_t(g⁰ … g)`` in place (the paper's Table 2; round t = 1, 2, ...)."""
        st, b2 = block.state, self.beta2
        u = st["u"]
        if self.rule == "adam":
            u.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        elif self.rule == "amsgrad":
            v = st["v"]
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            torch.maximum(u, v, out=u)
        elif self.rule == "adagrad":  # the mean of g² over rounds 1..t
            sq = torch.mul(g, g, out=block.workspace["step"])
            u.add_(sq.sub_(u), alpha=1.0 / block.round)
        elif self.rule == "adam-mini":  # one mean of g² per tensor, held in each of its entries
            v = block.workspace["step"]
            for part in block.workspace["parts"]:
                gp = g[:, part]
                v[:, part] = (gp * gp).mean(1, keepdim=True)
            u.mul_(b2).add_(v, alpha=1.0 - b2)
