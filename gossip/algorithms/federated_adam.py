"""Federated methods whose clients run Adam: FedAdamW and FedAdam-SSM (docs/algorithms/fedadamw.md,
docs/algorithms/fedadam-ssm.md).

Both are :class:`~gossip.algorithms.federated.FedAvg` rounds on the star (node 0 the server)
whose clients take K local Adam(W) steps instead of plain ones, started from moments the
server keeps, with the Adam step counter the *global* one (client i in round r counts on from
``(r − 1)·K_i``, as if it had stepped in every round)::

    FedAdamW (Liu et al., AAAI'26; the authors' code):
      server → i ∈ S:  x, v̄, Δ̄
      client i:        y ← x;  m ← 0;  v ← v̄;  K times
                         g ← clip(∇f_i(y), c);  y ← AdamW(y, g; m, v, t);  y ← y + (γ η / K) Δ̄
      i → server:      Δ_i = y − x,  v_i = v
      server:          x ← x + η_s mean Δ_i;  v̄ ← mean v_i;  Δ̄ ← mean Δ_i / η

    FedAdam-SSM (Deng et al., IEEE TSP 2025; structure only):
      server → i ∈ S:  x, m, v
      client i:        (y, m_i, v_i) ← (x, m, v);  K local Adam steps
      i → server:      M = top-k of |y − x| (one index set) and the values on M of
                         (y − x, m_i − m, v_i − v)
      server:          (x, m, v) ← (x, m, v) + mean_i of the sparse updates

The phases, memories and bit counts are FedAvg's :class:`~gossip.core.star.StarLink`; what is
here is the local Adam step and what each method sends.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gossip.algorithms.allreduce import adaptive_hparams
from gossip.algorithms.federated import FedAvg
from gossip.compress import make as make_compressor
from gossip.compress.sparse import StackedTopK
from gossip.core.algorithm import check_range
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements
from gossip.errors import ConfigError


class _LocalAdam(FedAvg):
    """FedAvg whose clients step with Adam(W) from moments that come down with the model.

    Subclasses say what comes down and goes up; this class keeps the client's moments
    (``{prefix}.m``, ``{prefix}.v`` in ``block.state``: on the server's row the global ones
    where the method keeps them) and takes the step, torch's ``AdamW`` with the global step
    counter::

        y ← y − η λ y
        m ← β1 m + (1 − β1) g;   v ← β2 v + (1 − β2) g²
        y ← y − η/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε),   t = (r − 1)·K_i + s + 1
    """

    takes_optimizer = False  # its own Adam step, not a node's torch.optim optimizer
    step_rule = "exact"
    prefix = "adam"

    def _adam_init(self, beta1: float, beta2: float, eps: float, weight_decay: float,
                   clip: float | None, step_count: str) -> None:
        check_range("beta1", beta1, 0.0, 1.0, include_low=True, include_high=False)
        check_range("beta2", beta2, 0.0, 1.0, include_low=True, include_high=False)
        check_range("eps", eps, 0.0, math.inf, "Adam's ε (e.g. 1e-8)")
        check_range("weight_decay", weight_decay, 0.0, math.inf, include_low=True)
        clip = None if clip == "none" else clip  # --hparam clip=none
        if clip is not None:
            check_range("clip", clip, 0.0, math.inf, "the clients' gradient-norm clip (or None)")
        if step_count not in ("global", "local"):
            raise ConfigError(f"step_count {step_count!r} is not 'global' (the bias correction "
                              "counts every round's steps) or 'local' (a fresh count each round)")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.weight_decay, self.clip, self.step_count = float(weight_decay), clip, step_count

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta`` sized from the problem, as for the other Adam-like methods
        (:func:`~gossip.algorithms.allreduce.adaptive_hparams`)."""
        return adaptive_hparams(cls, problem)

    def setup(self, block: Block) -> None:
        block.state[f"{self.prefix}.m"] = torch.zeros_like(block.x)
        block.state[f"{self.prefix}.v"] = torch.zeros_like(block.x)
        block.workspace["adam.denom"] = torch.empty_like(block.x[0])
        super().setup(block)

    def _start_moments(self, block: Block, rows: list[int], m: torch.Tensor | None,
                       v: torch.Tensor | None) -> None:
        """Client rows' moments at the start of a round: ``m`` and ``v`` (rows of what came
        down; None: zeros). A received ``v`` is clipped at 0 (a compressed downlink may
        round an entry below)."""
        st = block.state
        for r in rows:
            if m is None:
                st[f"{self.prefix}.m"][r].zero_()
            else:
                st[f"{self.prefix}.m"][r].copy_(m[r])
            if v is None:
                st[f"{self.prefix}.v"][r].zero_()
            else:
                torch.clamp(v[r], min=0.0, out=st[f"{self.prefix}.v"][r])

    def local_update(self, block: Block, rows: list[int], grad: torch.Tensor, s: int) -> None:
        """Local step ``s`` (0-based) of every row: clip, then AdamW (class docstring)."""
        st, denom = block.state, block.workspace["adam.denom"]
        b1, b2, eta = self.beta1, self.beta2, self.eta
        for r in rows:
            x, g = block.x[r], grad[r]
            m, v = st[f"{self.prefix}.m"][r], st[f"{self.prefix}.v"][r]
            if self.clip is not None:  # torch.nn.utils.clip_grad_norm_'s rule
                coef = self.clip / (float(torch.linalg.vector_norm(g)) + 1e-6)
                if coef < 1.0:
                    g.mul_(coef)
            t = s + 1
            if self.step_count == "global":
                t += (block.round - 1) * self.steps_of(block.ids[r])
            if self.weight_decay:
                x.mul_(1.0 - eta * self.weight_decay)
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            torch.sqrt(v, out=denom).div_(math.sqrt(1.0 - b2**t)).add_(self.eps)
            x.addcdiv_(m, denom, value=-eta / (1.0 - b1**t))


class FedAdamW(_LocalAdam):
    """FedAdamW (Liu et al., AAAI'26; exact from the authors' code): clients run AdamW from the
    server-averaged second moment with the global step count, and after every local step move
    toward the last global update; the server averages the model changes and the clients'
    second moments (module docstring, docs/algorithms/fedadamw.md).

    Args:
        clients_per_round, local_steps, eta, sampling, availability, uplink_memory,
            client_weights, downlink_compressor, aggregation, selection, candidates: as
            :class:`FedAvg` (``eta``
            is the clients' AdamW step).
        beta1, beta2, eps: the clients' Adam decay rates and ε (torch's defaults).
        weight_decay: decoupled weight decay λ of the clients' AdamW (the authors' 0.01).
        gamma: the local correction's weight γ (0: none): ``y ← y + (γ η/K) Δ̄`` after every
            local step, Δ̄ the last round's mean model change over η.
        clip: the clients' gradient-norm clip (the authors' 10; None: none).
        v_start: ``"server"`` (a client's v starts at the server's averaged v̄, the method)
            or ``"zero"`` (a fresh v every round: FedAvg with local AdamW).
        step_count: ``"global"`` (bias correction by the global step count, the method) or
            ``"local"`` (a fresh count every round).
        server_lr: the server's step η_s on the mean model change (the authors' 1).
    """

    name = "fedadamw"
    prefix = "fedadamw"
    state_copies = 23  # FedAvg's with 3d down and 2d up, the moments, Δ̄ (22.8 measured)
    requires = Requirements(
        graph=Graph(star=True), gradients=True, compressor="stateless",
        compressor_message="{name} compresses each sampled client's uplink on its own arc, which "
                           "a compressor that keeps state per node ('{spec}') cannot do: use a "
                           "stateless one (topk, randk, qsgd, sign, lead:BITS, none)")

    def __init__(self, clients_per_round: int | None = None, local_steps: int | list[int] = 50,
                 eta: float = 3e-4, sampling: str = "uniform", availability: float = 1.0,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.01, gamma: float = 0.5, clip: float | None = 10.0,
                 v_start: str = "server", step_count: str = "global", server_lr: float = 1.0,
                 uplink_memory: str | None = "auto", client_weights: list[float] | None = None,
                 downlink_compressor: str | None = None, aggregation: str = "mean",
                 selection: str = "sampled", candidates: int | None = None):
        super().__init__(clients_per_round, local_steps, eta, sampling, availability, "sgd",
                         server_lr, uplink_memory=uplink_memory, client_weights=client_weights,
                         downlink_compressor=downlink_compressor, aggregation=aggregation,
                         selection=selection, candidates=candidates)
        self._adam_init(beta1, beta2, eps, weight_decay, clip, step_count)
        check_range("gamma", gamma, 0.0, math.inf, "the local correction's weight (0: none)",
                    include_low=True)
        if v_start not in ("server", "zero"):
            raise ConfigError(f"v_start {v_start!r} is not 'server' (v starts at the server's "
                              "mean) or 'zero'")
        self.gamma, self.v_start = float(gamma), v_start

    def setup(self, block: Block) -> None:
        block.state["fedadamw.delta"] = torch.zeros_like(block.x)  # the server's Δ̄
        super().setup(block)

    def up_dim(self, d: int) -> int:
        return 2 * d  # Δ_i and v_i

    def down_dim(self, d: int) -> int:
        return 3 * d  # x, v̄ and Δ̄

    def down_vector(self, block: Block, r: int) -> torch.Tensor:
        st = block.state
        return torch.cat((block.x[r], st["fedadamw.v"][r], st["fedadamw.delta"][r]))

    def start_local(self, block: Block, rows: list[int], down: torch.Tensor) -> None:
        super().start_local(block, rows, down)
        d = block.x.shape[1]
        self._start_moments(block, rows, None, down[:, d:2 * d] if self.v_start == "server"
                            else None)

    def local_update(self, block: Block, rows: list[int], grad: torch.Tensor, s: int) -> None:
        super().local_update(block, rows, grad, s)
        if self.gamma:
            d, down = block.x.shape[1], block.workspace["down"]
            for r in rows:  # y ← y + (γ η / K) Δ̄
                block.x[r].add_(down[r, 2 * d:], alpha=self.gamma * self.eta
                                / self.steps_of(block.ids[r]))

    def finish_local(self, block: Block, rows: list[int], down: torch.Tensor,
                     up: torch.Tensor) -> None:
        super().finish_local(block, rows, down, up)
        d = block.x.shape[1]
        for r in rows:
            up[r, d:].copy_(block.state["fedadamw.v"][r])

    def server_update(self, block: Block, r: int, avg: torch.Tensor) -> None:
        """``x ← x + η_s Δ``, ``v̄ ← mean v_i``, ``Δ̄ ← Δ/η`` (Δ the mean model change)."""
        d = block.x.shape[1]
        super().server_update(block, r, avg)
        block.state["fedadamw.v"][r].copy_(avg[d:])
        torch.div(avg[:d], self.eta, out=block.state["fedadamw.delta"][r])


MASKS = ("shared", "separate")
"""FedAdam-SSM's one index set for the three updates, or one top-k set per update."""


class FedAdamSSM(_LocalAdam):
    """FedAdam-SSM (Deng et al., IEEE TSP 2025; the structure of its abstract, the mask score
    ours): clients run local Adam from the server's (x, m, v) and send the updates of all three
    sparsified with one shared top-k mask (the index set sent once); the server adds their
    mean (module docstring, docs/algorithms/fedadam-ssm.md).

    Args:
        density: the kept fraction k/d of each update (1: all, the dense form).
        mask: ``"shared"`` (one index set, chosen by ``|Δx|``: the method) or ``"separate"``
            (each update its own top-k: FedAdam with three sparsifiers, the baseline).
        clients_per_round, local_steps, eta, sampling, availability, client_weights,
            downlink_compressor, aggregation, selection, candidates: as :class:`FedAvg`
            (``eta`` is the clients' Adam step).
        beta1, beta2, eps, weight_decay, clip, step_count: the clients' Adam, as
            :class:`FedAdamW`'s (no decay and no clip by default).
        server_lr: the server's step η_s on the mean model update (1: the plain mean).
        uplink_memory: ``"auto"`` (the default) or ``"ef21"``: an EF21 memory per client
            (what a mask drops goes up in a later round); ``None``: plain sparsification.
    """

    name = "fedadam-ssm"
    prefix = "ssm"
    state_copies = 27  # FedAvg's with 3d messages both ways and memories, the moments (26.6 measured)
    requires = Requirements(
        graph=Graph(star=True), gradients=True, compressor="identity",
        compressor_message="{name} sparsifies its uplink itself (density=, mask=): run it with "
                           "--compressor none, not '{spec}'")

    def __init__(self, density: float = 0.1, mask: str = "shared",
                 clients_per_round: int | None = None, local_steps: int | list[int] = 5,
                 eta: float = 1e-3, sampling: str = "uniform", availability: float = 1.0,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0, clip: float | None = None,
                 step_count: str = "global", server_lr: float = 1.0,
                 uplink_memory: str | None = "auto", client_weights: list[float] | None = None,
                 downlink_compressor: str | None = None, aggregation: str = "mean",
                 selection: str = "sampled", candidates: int | None = None):
        super().__init__(clients_per_round, local_steps, eta, sampling, availability, "sgd",
                         server_lr, uplink_memory=uplink_memory, client_weights=client_weights,
                         downlink_compressor=downlink_compressor, aggregation=aggregation,
                         selection=selection, candidates=candidates)
        self._adam_init(beta1, beta2, eps, weight_decay, clip, step_count)
        check_range("density", density, 0.0, 1.0, "the kept fraction k/d of each update")
        if mask not in MASKS:
            raise ConfigError(f"mask {mask!r} is not one of {', '.join(MASKS)}")
        self.density, self.mask = float(density), mask

    def uplink_compressor(self) -> Any:
        """Top-k of ``(Δx, Δm, Δv)`` with one index set (``shared``) or three."""
        spec = f"stacked-topk:{self.density}:3:{self.mask}"
        return make_compressor(StackedTopK(spec, self.density, 3, self.mask == "shared"))

    def up_dim(self, d: int) -> int:
        return 3 * d  # Δx, Δm, Δv

    def down_dim(self, d: int) -> int:
        return 3 * d  # x, m, v

    def down_vector(self, block: Block, r: int) -> torch.Tensor:
        st = block.state
        return torch.cat((block.x[r], st["ssm.m"][r], st["ssm.v"][r]))

    def start_local(self, block: Block, rows: list[int], down: torch.Tensor) -> None:
        super().start_local(block, rows, down)
        d = block.x.shape[1]
        self._start_moments(block, rows, down[:, d:2 * d], down[:, 2 * d:])

    def finish_local(self, block: Block, rows: list[int], down: torch.Tensor,
                     up: torch.Tensor) -> None:
        d, st = block.x.shape[1], block.state
        for r in rows:  # (y − x, m_i − m, v_i − v)
            torch.sub(block.x[r], down[r, :d], out=up[r, :d])
            torch.sub(st["ssm.m"][r], down[r, d:2 * d], out=up[r, d:2 * d])
            torch.sub(st["ssm.v"][r], down[r, 2 * d:], out=up[r, 2 * d:])

    def server_update(self, block: Block, r: int, avg: torch.Tensor) -> None:
        """``x ← x + η_s Δx``, ``m ← m + Δm``, ``v ← v + Δv`` (the mean sparse updates)."""
        d, st = block.x.shape[1], block.state
        super().server_update(block, r, avg)
        st["ssm.m"][r].add_(avg[d:2 * d])
        st["ssm.v"][r].add_(avg[2 * d:])
