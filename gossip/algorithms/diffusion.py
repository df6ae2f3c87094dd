"""Exact diffusion (Yuan, Ying, Zhao, Sayed 2019) and LED, local exact diffusion (Alghunaim 2024).

LED (docs/algorithms/led.md), per node, a dual ``y_i`` (``y⁰ = 0``) and ``τ`` local steps
between two exchanges::

    φ_i ← x_i;  τ times:  φ_i ← φ_i − α ∇f_i(φ_i) − β y_i        (local, no communication)
    send φ_i;   x_i ← Σ_j m_ij φ_j;   y_i ← y_i + φ_i − x_i

with ``M = W̄ = (I + W)/2`` (``lazy``, the default) or ``M = W``. ``Σ_i y_i`` stays 0 (M doubly
stochastic), so at a fixed point ``α ∇f_i(x*) = −β y_i`` sums to zero: the exact optimum with a
constant step. With ``τ = 1``, ``β = 1`` and ``M = W̄`` it is exact diffusion's adapt–correct–
combine ``ψ = x − α∇f(x)``, ``φ = ψ + x − ψ_prev``, ``x = W̄ φ`` (``y = ψ − x``), registered as
``exact-diffusion`` (docs/algorithms/exact-diffusion.md): NIDS with ``c = 1/2``, that is
``lead --compressor none`` except LEAD's first step without communication.

The message is ``φ`` itself (memoryless), so a lost one drops its edge at both ends
(``on_loss = "edge"``, as EXTRA): every round's M stays symmetric and doubly stochastic and the
fixed point stays x*.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.compensated import CompensatedSum
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError


def dual_loop_limit(lambda_min: float, lazy: bool) -> float:
    """The largest ``τ β`` for which LED's gradient-free part (``φ = x − τβ y``, ``x = M φ``,
    ``y += φ − x``) is stable on every eigenvalue of ``M``: ``2 (1 + λ)/(1 − λ)`` at
    ``λ = λ_min(M)`` (our derivation, docs/algorithms/led.md); 2 when ``λ_min(M) ≥ 0``."""
    lam = (1.0 + lambda_min) / 2.0 if lazy else lambda_min
    if lam >= 0.0:
        return 2.0
    return 2.0 * (1.0 + lam) / (1.0 - lam)


class LED(Algorithm):
    """LED, local exact diffusion: ``τ`` local steps ``φ ← φ − α∇f(φ) − βy``, one exchange of
    ``φ``, ``x = M φ``, ``y += φ − x`` (``M = (I + W)/2``, or ``W`` with ``lazy=False``).

    See docs/algorithms/led.md. With ``local_steps=1``, ``beta=1`` it is exact diffusion.

    Args:
        eta: the local step α (constant); default 0.1 (``suggest_hparams``: ``1/(τ L)``).
        local_steps: τ ≥ 1, gradient steps between two exchanges (default 5).
        beta: the dual's weight in each local step; default ``1/τ`` (our choice: τβ is the
            dual loop's gain, and τβ = 1 is exact diffusion's).
        lazy: mix with ``(I + W)/2`` (default, exact diffusion's matrix) instead of ``W``.
    """

    name = "led"
    trains = True
    requires = Requirements(
        gradients=True, compressor="identity",
        compressor_message="{name} sends exact models but the compressor is '{spec}'; use "
                           "--compressor none, or lead for compressed exact diffusion (NIDS)")
    step_rule = "exact"
    on_loss = "edge"  # a lost φ drops its edge at both ends: each round's M stays doubly stochastic
    state_copies = 11  # as EXTRA: x, y and its compensation, the gradient, the channel's rows

    def __init__(self, eta: float = 0.1, local_steps: int = 5, beta: float | None = None,
                 lazy: bool = True):
        check_range("eta", eta, 0.0, float("inf"), "Use eta = 1/L (the problem's smoothness).")
        if isinstance(local_steps, bool) or int(local_steps) != local_steps or local_steps < 1:
            raise ConfigError(f"local_steps = {local_steps} must be an integer >= 1 "
                              "(1: exact diffusion)")
        if beta is not None:
            check_range("beta", beta, 0.0, float("inf"),
                        "The dual's weight per local step; 1/local_steps by default.")
        self.eta = eta
        self.local_steps = int(local_steps)
        self.beta = beta
        self.lazy = bool(lazy)

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full", topology: Any = None,
                        local_steps: int | None = None) -> dict[str, Any]:
        """``eta = 1/(τ L)``: the step rule ``exact`` (1/L) shared by the ``τ`` local steps of a
        round (τ = ``local_steps``, the constructor's default when not given), so that a round
        moves by about one ``1/L`` gradient step whatever τ (docs/algorithms/led.md)."""
        hp = super().suggest_hparams(problem, estimator, topology)
        if "eta" in hp:
            hp["eta"] /= cls._default_steps() if local_steps is None else int(local_steps)
        return hp

    @classmethod
    def _default_steps(cls) -> int:
        """τ when the constructor is not given one (1 for a preset without ``local_steps``)."""
        import inspect

        param = inspect.signature(cls.__init__).parameters.get("local_steps")
        return 1 if param is None else int(param.default)

    def _beta(self) -> float:
        return 1.0 / self.local_steps if self.beta is None else float(self.beta)

    def validate(self, topology: Any, compressor: Any) -> None:
        spectrum = getattr(topology, "spectrum", None)
        lam = getattr(spectrum, "lambda_min", None)
        if lam is None or lam != lam:
            return
        gain, limit = self.local_steps * self._beta(), dual_loop_limit(float(lam), self.lazy)
        if gain >= limit:
            raise ConfigError(
                f"{self.name}: local_steps * beta = {gain:g} makes the dual loop unstable on "
                f"'{topology.name}' (λ_min(W) = {float(lam):.3f}; it must stay below "
                f"{limit:.3f}); use lazy=true (mix with (I + W)/2) or a smaller beta")

    def setup(self, block: Block) -> None:
        block.hparams["beta"] = self._beta()  # the run's value, never self's
        x = block.x
        block.state["y"] = torch.zeros_like(x)
        block.workspace["dual"] = CompensatedSum(block, "y")  # Σ_i y_i = 0 kept to the last bit
        block.workspace["channel"] = Channel(block, "phi")  # memoryless: M φ from this round's φ
        block.workspace["grad"] = torch.empty_like(x)

    def step(self, block: Block) -> Round:
        x, ws, eta = block.x, block.workspace, self.eta
        y, beta = block.state["y"], block.hparams["beta"]
        for _ in range(self.local_steps):  # φ ← φ − α∇f(φ) − βy, on x in place
            g = block.gradients(ws["grad"])
            x.sub_(g, alpha=eta).sub_(y, alpha=beta)
        (q,) = yield (ws["channel"].send(x),)
        gap = ws["channel"].gap(q)  # (W − I) φ
        c = 0.5 if self.lazy else 1.0  # M = I + c (W − I)
        x.add_(gap, alpha=c)  # x = M φ
        ws["dual"].add_(gap, alpha=-c)  # y += φ − M φ


class ExactDiffusion(LED):
    """Exact diffusion (adapt, correct, combine with ``W̄ = (I + W)/2``): LED with one local step
    and ``β = 1``::

        ψ_i = x_i − α ∇f_i(x_i);   φ_i = ψ_i + x_i − ψ_i^prev;   x_i = Σ_j w̄_ij φ_j

    (``ψ⁰ = x⁰``), run as ``φ = x − α∇f(x) − y``, ``x = W̄ φ``, ``y += φ − x`` with
    ``y = ψ − x``. It is NIDS with ``c = 1/2``, i.e. ``lead --compressor none`` started one local
    gradient step later (docs/algorithms/exact-diffusion.md).

    Args:
        eta: step size α (constant); default 0.1 (``suggest_hparams``: 1/L).
    """

    name = "exact-diffusion"

    def __init__(self, eta: float = 0.1):
        super().__init__(eta=eta, local_steps=1, beta=1.0, lazy=True)

    def hparams(self) -> dict[str, Any]:
        return {"eta": self.eta}
