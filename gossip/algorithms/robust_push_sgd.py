"""Robust Asynchronous Stochastic Gradient-Push (RASGP; Spiridonoff, Olshevsky, Paschalidis,
JMLR 21(58), 2020, arXiv 1811.03982; docs/algorithms/robust-push-sgd.md).

Gradient-push (push-sum SGD) whose push-sum messages are running sums
(:mod:`gossip.core.running`, through :class:`~gossip.algorithms.running_sum.RobustPushSum`):
lost, late and reordered messages keep the mass. What RASGP adds to robust-push-sum is its
treatment of asynchrony and its step:

* **A node that slept catches up its gradient steps.** In the authors' simulation code
  (``functions_v3.py`` of github.com/spiridonoff/Robust-Asynchrnous-Stochastic-Gradient-Push)
  every node takes ``x_i ← x_i − α(k) g_i(z_i)`` at *every* iteration k, awake or not, at its
  model ``z_i`` as it last computed it, and only an awake node broadcasts its running sums and
  processes what arrived. Under ``--network active=`` a sleeping node's round is undone (it
  does not compute), so the node takes those steps when it wakes: woken at round t after its
  last active round τ, ``s_i ← s_i − (Σ_{u=τ+1}^{t} α(u)) ∇f_i(x_i)``, with ``x_i`` unchanged
  since τ. With exact gradients this is the code's sum of steps; with sampled ones it is one
  sample scaled by the summed step, where the code draws one per iteration (our choice: an
  inactive node does not compute). So every node contributes ``Σ_u α(u)`` to the network's
  descent whatever its activity, the property the paper's analysis rests on (the average moves
  as centralized SGD on ``Σ_i f_i``), where robust-push-sum's sleeping nodes skip their steps.
* **The diminishing step of the paper**, ``α(k) = n / (μ_F k)`` for ``F = Σ_i f_i``: in our
  normalization (the problems' ``f`` is the average of the ``f_i``, μ its modulus)
  ``α(t) = 1/(μ t)``, capped at ``eta`` (our choice, in place of the paper's start at a later
  iteration k0: the early steps stay stable). ``mu = 0`` keeps a constant (or scheduled) ``eta``,
  which stops in a neighborhood of x* as push-sum SGD does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.running_sum import RobustPushSum
from gossip.core.algorithm import check_range, scheduled
from gossip.core.requirements import Graph, Requirements


class RobustPushSGD(RobustPushSum):
    r"""RASGP: robust-push-sum's gradient-push over running sums, with the gradient steps a
    sleeping node missed taken when it wakes, and the paper's step ``min(η, 1/(μ t))``.

    Node i keeps ``s_i`` (init ``x_i⁰``), ``w_i`` (init 1), the round ``τ_i`` it last took
    part in (init 0), its running sum ``σ_i`` and per in-arc the newest ``(ρ_ij, κ_ij)``. In a
    round t in which it is active (every round without ``active=``)::

        s_i ← s_i − (Σ_{u=τ_i+1}^{t} α(u)) ∇f_i(x_i);   τ_i ← t
        σ_i ← σ_i + (s_i, w_i);  send (σ_i, t) to every out-neighbor
        (s_i, w_i) ← c_ii (s_i, w_i) + Σ_j c_ij (σ_j − ρ_ij);  ρ_ij ← σ_j  (newest received)
        x_i = s_i / w_i

    with ``α(u) = min(η(u), 1/(μ u))`` (``μ = 0``: ``η(u)``). Awake every round, the sum is
    ``α(t)`` and this is robust-push-sum, and without faults push-sum SGD (SGP).

    Args:
        eta: step, a number or a schedule ``eta(t)`` (default 0.05); with ``mu > 0`` the cap
            of the diminishing step.
        mu: strong convexity modulus of the average objective (``suggest_hparams``: the
            problem's); ``0`` (default) for the constant or scheduled ``eta`` alone.
    """

    name = "robust-push-sgd"
    state_copies = 11
    neighbor_copies = 1
    trains = True
    step_schedule = True
    step_rule = "tracking"
    on_loss = "running-sum"
    counts = ("rps.superseded",)
    requires = Requirements(
        graph=Graph(static=True, symmetric=False), gradients=True, compressor="identity",
        compressor_message="{name} pushes exact running sums (got '{spec}'): use --compressor none")

    def __init__(self, eta: float | Callable[[int], float] = 0.05, mu: float = 0.0):
        super().__init__(eta)
        check_range("mu", mu, 0.0, float("inf"), "The objective's strong convexity modulus "
                    "(suggest_hparams reads it from the problem), or 0 for a constant step.",
                    include_low=True)
        self.mu = float(mu)

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """The tracking rule's ``eta`` (0.2/L) as the cap, and the problem's ``mu``: the
        paper's diminishing step."""
        hp = super().suggest_hparams(problem, estimator, topology)
        return hp | {"mu": float(problem.smoothness().mu)}

    def rate(self, t: int) -> float:
        """``α(t) = min(η(t), 1/(μ t))`` (``η(t)`` when ``μ = 0``)."""
        eta = scheduled(self.eta, t)
        return min(eta, 1.0 / (self.mu * t)) if self.mu > 0 else eta

    def setup(self, block: Any) -> None:
        super().setup(block)
        if "woke" not in block.state:
            block.state["woke"] = torch.zeros(block.m, dtype=torch.float64, device=block.x.device)

    def steps(self, woke: torch.Tensor, t: int) -> torch.Tensor:
        """Each row's summed step ``Σ_{u=τ+1}^{t} α(u)`` ([m, 1] float64; ``woke`` holds τ):
        ``α(t)`` for the rows that took part in the last round."""
        gaps = t - woke
        out = torch.empty_like(woke)
        for gap in torch.unique(gaps).tolist():
            g = int(gap)
            out[gaps == gap] = sum(self.rate(u) for u in range(t - g + 1, t + 1))
        return out.view(-1, 1)

    def descend(self, block: Any) -> None:
        st = block.state
        grad = block.gradients(block.workspace["grad"])  # zero on inactive rows, put back anyway
        # one arithmetic for every row (the bits do not depend on which rows share a block)
        st["s"].sub_(grad * self.steps(st["woke"], block.round).to(grad.dtype))
        st["woke"].fill_(float(block.round))  # the inactive rows get their τ back at round's end
