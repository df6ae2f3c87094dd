"""SQuARM-SGD (Singh, Data, George, Diggavi, IEEE JSAIT 2021; docs/algorithms/squarm-sgd.md).

CHOCO-SGD (:class:`~gossip.algorithms.choco.Choco`) with three additions, each switchable:

* local Nesterov momentum: ``v_i ← β v_i + g_i``,  ``x_i ← x_i − η (β v_i + g_i)``;
* H local steps between synchronisations: only rounds t with ``t mod H = 0`` communicate;
* an event trigger: at a synchronisation node i sends only when its model moved far enough
  from its public copy, ``‖x_i − x̂_i‖² > c_t η_t²``; otherwise it sends nothing and every
  holder of ``x̂_i`` keeps the old one (the channel's :meth:`~gossip.core.channel.Channel.send_if`:
  one flag byte per arc, then the messages of the nodes that send).

The sparsify-then-quantize operator is the run's compressor, written ``topk:R+qsgd:B:biased``
(:mod:`gossip.compress.compose`): any compressor works, as for CHOCO. A synchronisation round
is CHOCO's round in our order (:mod:`gossip.algorithms.choco`)::

    v_i ← β v_i + g_i;   x_i ← x_i − η_t (β v_i + g_i)           (every round)
    if t mod H = 0:
        x_i ← x_i + γ (s_i − x̂_i)                                  (the copies as they are)
        if ‖x_i − x̂_i‖² > c_t η_t²:  send q_i = C(x_i − x̂_i);  x̂_i += q_i at i and its neighbors
        s_i += Σ_j w_ij q_j  over the neighbors that sent

With β = 0, H = 1 and no trigger (``threshold = 0``, ``threshold_step = 0``) the round is
CHOCO-SGD's, bit for bit. ``c_t = threshold + threshold_step·⌊(t − 1)/threshold_every⌋``
(SPARQ-SGD's code: 2, plus 1 every 10 epochs). Skipped sends are counted per node
(``squarm.sends``, ``squarm.sends_skipped``) and the log reports ``skip_rate``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.choco import Choco
from gossip.core.algorithm import Round, check_range, scheduled
from gossip.core.block import Block
from gossip.errors import ConfigError


class SQuARM(Choco):
    """SQuARM-SGD: CHOCO-SGD with local Nesterov steps, H local steps between
    synchronisations and an event-triggered send (module docstring).

    Args:
        gamma: CHOCO's consensus step (None: CHOCO's default rule from the compressor's δ).
        eta: local step size or schedule η_t.
        beta: Nesterov momentum β in [0, 1) (0: plain SGD steps).
        local_steps: H >= 1, rounds per synchronisation (1: every round communicates).
        threshold: c_0 >= 0 of the trigger ``‖x_i − x̂_i‖² > c_t η_t²``.
        threshold_step: added to c every ``threshold_every`` rounds (>= 0).
        threshold_every: rounds between increases of c (0: c stays ``threshold``).
            ``threshold = threshold_step = 0`` turns the trigger off: every node sends at
            every synchronisation, as CHOCO does, with no flag bytes.
    """

    name = "squarm-sgd"
    state_copies = 7  # CHOCO's 6 and the momentum v
    takes_optimizer = False  # its own Nesterov step with η_t, which the trigger also reads
    overlaps = None
    on_loss = None  # refused: a lost flag would leave a receiver waiting for, or missing, an increment
    counts = ("squarm.sends", "squarm.sends_skipped")

    def __init__(self, gamma: float | None = None, eta: float | Callable[[int], float] = 0.0,
                 beta: float = 0.9, local_steps: int = 5, threshold: float = 2.0,
                 threshold_step: float = 0.0, threshold_every: int = 0):
        super().__init__(gamma=gamma, eta=eta)
        check_range("beta", beta, 0.0, 1.0, "Nesterov momentum", include_low=True,
                    include_high=False)
        for key, value, low in (("local_steps", local_steps, 1), ("threshold_every", threshold_every, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{key} = {value!r}: a whole number >= {low}")
        check_range("threshold", threshold, 0.0, math.inf, "the trigger's c_0", include_low=True)
        check_range("threshold_step", threshold_step, 0.0, math.inf, "c's increase",
                    include_low=True)
        self.beta, self.local_steps = beta, local_steps
        self.threshold, self.threshold_step, self.threshold_every = threshold, threshold_step, threshold_every

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """CHOCO's suggestion with its step times ``1 − β`` (β the constructor's default):
        momentum makes the step ``η/(1 − β)`` in the long run."""
        hp = dict(super().suggest_hparams(problem, estimator, topology))
        if "eta" in hp:
            hp["eta"] = hp["eta"] * (1.0 - inspect.signature(cls.__init__).parameters["beta"].default)
        return hp

    @property
    def triggered(self) -> bool:
        """Whether the event trigger is on (a threshold or its increase above 0)."""
        return self.threshold > 0.0 or self.threshold_step > 0.0

    def threshold_at(self, t: int) -> float:
        """``c_t = threshold + threshold_step·⌊(t − 1)/threshold_every⌋``."""
        if self.threshold_every == 0:
            return self.threshold
        return self.threshold + self.threshold_step * ((t - 1) // self.threshold_every)

    def log_fields(self, totals: dict[str, float]) -> dict[str, Any]:
        """The sends and skipped sends so far, summed over the nodes, and ``skip_rate``: the
        share of the nodes' synchronisations without a message."""
        done = totals["sends"] + totals["sends_skipped"]
        return {**totals, "skip_rate": totals["sends_skipped"] / done if done else 0.0}

    def setup(self, block: Block) -> None:
        super().setup(block)
        st = block.state
        if self.beta > 0.0:
            st["squarm.v"] = torch.zeros_like(block.x)
        counter = dict(dtype=torch.float64, device=block.x.device)
        st["squarm.sends"] = torch.zeros(block.m, **counter)
        st["squarm.sends_skipped"] = torch.zeros(block.m, **counter)

    def step(self, block: Block) -> Round:
        x, ws, st = block.x, block.workspace, block.state
        ch = ws["channel"]
        eta = scheduled(self.eta, block.round)
        if block.has_oracle:
            g = block.gradients(ws["grad"])
            if self.beta > 0.0:  # v ← β v + g; the step is β v + g (Nesterov)
                v = st["squarm.v"]
                v.mul_(self.beta).add_(g)
                g.add_(v, alpha=self.beta)
            block.local_step(g, eta)
        if block.round % self.local_steps:
            return  # a local step only: nothing is sent
        x.add_(ch.gap(), alpha=block.hparams["gamma"])  # x ← x + γ (s − x̂), the last copies
        if not self.triggered:
            st["squarm.sends"] += 1.0
            inbox = yield ch.send(x)  # q = C(x − x̂), every node
        else:
            bound = self.threshold_at(block.round) * eta * eta
            lag = (x - ch.copy.to(x.dtype)).square().sum(1)  # ‖x_i − x̂_i‖² per row
            sending = (lag > bound).tolist()
            for r, s in enumerate(sending):
                st["squarm.sends" if s else "squarm.sends_skipped"][r] += 1.0
            inbox = yield from ch.send_if(x, sending)  # flags, then the nodes that send
        ch.update(inbox)  # x̂ += q;  s += Σ_j w_ij q_j (kept as s − x̂)
