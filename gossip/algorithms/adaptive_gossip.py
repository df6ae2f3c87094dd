"""Adaptive optimizers under gossip on any static graph: DADAM, tracked AMSGrad, DES-LOC.

Every node keeps its own Adam moments; the models (and, for tracked AMSGrad, a tracker of the
second moment; for DES-LOC, the moments at their own periods) are mixed with the weights of
``W`` by exact (uncompressed) gossip. ``gossip_steps = K`` runs K mixing exchanges per gradient
step (the vectors are multiplied by ``W^K``): more consensus per gradient, K times the bytes.

Why the tracker (Chen et al., ACML 2023): with local preconditioners ``1/√v̂_i`` a DADAM node
follows ``m_i/√v̂_i``, and when the nodes' gradient scales differ the fixed point of
``x_i = Σ_j w_ij x_j − η m_i/√v̂_i`` is not a stationary point of ``f = (1/n) Σ f_i``. Tracking
``u_i ≈ mean_j v̂_j`` by gossip makes the preconditioners agree and removes that bias.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from gossip.algorithms.allreduce import adam_moments_, adaptive_hparams, check_betas, preconditioned
from gossip.core.algorithm import Algorithm, Round, check_range, scheduled
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Requirements
from gossip.errors import CompressionError, ConfigError


class ExactRows:
    """The messages of exact gossip: a row's values as they are (its dtype, no header),
    ``d·itemsize`` bytes. A received row with a NaN/Inf value is refused (:meth:`check_rows`),
    as the ``none`` compressor refuses it. Decoding adds ``w·v`` with one rounding, as
    ``add_(v, alpha=w)`` does (``w_ii v_i`` on a zero row is the product itself). Enough of the
    compressor interface for a :class:`~gossip.core.channel.Channel` of its own
    (:meth:`gossip.core.block.Block.encode` and ``mix_into``)."""

    stateful = False
    randomized = False
    sends_values_in_place = False
    ordered_rows = False  # mix_into decodes one degree slot (distinct targets) at a time

    def nbytes_rows(self, like: torch.Tensor) -> int:
        return like.numel() * like.element_size()

    def encode_rows(self, X: torch.Tensor, rng: Any = None, *, out: torch.Tensor) -> torch.Tensor:
        out.view(X.dtype).copy_(X)
        return out

    def check_rows(self, block: torch.Tensor, like: torch.Tensor) -> None:
        """Refuse the first row with a NaN/Inf value (:class:`CompressionError`, ``row`` set);
        the transport checked the length. One summing pass over the rows (no temporary), looking
        closer only when a row's sum is not finite: a finite sum means finite values, and an
        overflow of finite values is let through. One host sync on CUDA."""
        vals = block.view(like.dtype)
        if bool(torch.isfinite(vals.sum(1)).all()):
            return
        bad = (~torch.isfinite(vals)).any(1).nonzero()
        if bad.numel():
            err = CompressionError("exact gossip: the message's values contain NaN/Inf, which no "
                                   "healthy sender produces (the sender diverged, or the message "
                                   "is corrupt)")
            err.row = int(bad[0, 0])
            raise err

    def decode_add_rows_(self, out: torch.Tensor, block: torch.Tensor,
                         weight: torch.Tensor | float = 1.0, *, rows: torch.Tensor | None = None,
                         check: bool = True) -> torch.Tensor:
        vals = block.view(out.dtype)
        w = (weight.reshape(-1, 1) if isinstance(weight, torch.Tensor)
             else torch.full((vals.shape[0], 1), float(weight), dtype=torch.float64, device=out.device))
        w = w.to(out.dtype)  # as add_ casts alpha to out's dtype
        if rows is None:
            return out.addcmul_(vals, w)
        out.index_copy_(0, rows, out.index_select(0, rows).addcmul_(vals, w))
        return out


EXACT = ExactRows()


class AdaptiveGossip(Algorithm):
    """Shared parts: hyper-parameter checks, node-local Adam moments, exact multi-step mixing."""

    trains = True
    requires = Requirements(gradients=True, compressor="identity",
                            compressor_message="{name} mixes exact models: use --compressor none "
                                               "(got '{spec}')")
    takes_optimizer = False
    step_schedule = True

    def __init__(self, eta: float | Callable[[int], float], beta1: float, beta2: float,
                 eps: float, gossip_steps: int):
        check_range("eta", eta, 0.0, float("inf"))
        check_betas(beta1, beta2)
        check_range("eps", eps, 0.0, float("inf"))
        if int(gossip_steps) < 1:
            raise ConfigError(f"gossip_steps = {gossip_steps} must be >= 1")
        self.eta, self.beta1, self.beta2, self.eps = eta, beta1, beta2, eps
        self.gossip_steps = int(gossip_steps)

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta`` sized from the problem (:func:`~gossip.algorithms.allreduce.adaptive_hparams`)."""
        return adaptive_hparams(cls, problem)

    def setup(self, block: Block) -> None:
        z = torch.zeros_like(block.x)
        block.state.update(m=z, v=z.clone())
        block.workspace.update(grad=torch.zeros_like(z), step=torch.zeros_like(z))  # per round

    def scratch(self, block: Block, name: str, width: int) -> torch.Tensor:
        """An [m, width] work tensor of the block's dtype (kept between rounds, one per name and
        width, as DES-LOC's messages change width; in ``block.workspace``)."""
        work = block.workspace.setdefault("scratch", {})
        t = work.get((name, width))
        x = block.x
        if t is None:
            t = work[(name, width)] = x.new_empty((x.shape[0], width))
        return t

    def mix(self, block: Block, vectors: Sequence[torch.Tensor], steps: int) -> Round:
        """``V ← W V`` for each of ``vectors`` ([m, d] rows, in place), ``steps`` times: one
        message a step carries all of them as they are (:class:`ExactRows`); each node sums
        ``w_ii v_i + Σ_j w_ij v_j`` in sorted-neighbor order, one rounding per term."""
        width = sum(v.shape[1] for v in vectors)
        send = vectors[0] if len(vectors) == 1 else self.scratch(block, "send", width)
        acc = self.scratch(block, "acc", width)
        ch = block.workspace.get("exact")
        if ch is None:
            ch = block.workspace["exact"] = Channel(block, "exact", compressor=EXACT)
        for _ in range(steps):
            if len(vectors) > 1:
                torch.cat(vectors, dim=1, out=send)
            inbox = yield ch.send(send)
            ch.mix(inbox, into=(None, acc.zero_()))
            pos = 0
            for v in vectors:
                v.copy_(acc[:, pos : pos + v.shape[1]])
                pos += v.shape[1]


class DADAM(AdaptiveGossip):
    r"""DADAM (Nazari et al. 2019): local AMSGrad moments, gossip of the models.

    ::

        m_i ← β1 m_i + (1−β1) g_i;   v_i ← β2 v_i + (1−β2) g_i²;   v̂_i ← max(v̂_i, v_i)
        x_i ← Σ_j w_ij x_j − η m_i / (√v̂_i + ε)            (W^K with gossip_steps = K)

    ``g_i`` is taken at the pre-gossip ``x_i``. A baseline: with heterogeneous data the nodes'
    preconditioners differ and the fixed point is biased (use ``tracked-amsgrad``).

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``).
        beta1, beta2, eps: Adam's.
        amsgrad: keep the running maximum v̂ (True, DADAM's form) or use v itself.
        gossip_steps: mixing exchanges per round.
    """

    name = "dadam"
    on_loss = "renormalize"  # models averaged in (as D-PSGD): a lost one counts as the own model
    state_copies = 9

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, amsgrad: bool = True,
                 gossip_steps: int = 1):
        super().__init__(eta, beta1, beta2, eps, gossip_steps)
        self.amsgrad = bool(amsgrad)

    def setup(self, block: Block) -> None:
        super().setup(block)
        if self.amsgrad:
            block.state["v_max"] = torch.zeros_like(block.x)

    def step(self, block: Block) -> Round:
        st = block.state
        adam_moments_(st["m"], st["v"], block.gradients(block.workspace["grad"]), self.beta1, self.beta2)
        v = st["v"]
        if self.amsgrad:
            v = torch.maximum(st["v_max"], v, out=st["v_max"])
        yield from self.mix(block, [block.x], self.gossip_steps)
        block.x.sub_(preconditioned(st["m"], v, self.eps, block.workspace["step"]),
                     alpha=scheduled(self.eta, block.round))


class TrackedAMSGrad(AdaptiveGossip):
    r"""Decentralized AMSGrad with a gossip-tracked second moment (Chen, Karimi, Zhao, Li).

    ::

        m_i ← β1 m_i + (1−β1) g_i;   v_i ← β2 v_i + (1−β2) g_i²;   v̂_i' = max(v̂_i, v_i)
        u_i ← Σ_j w_ij u_j − v̂_i + v̂_i'                    (tracks mean_j v̂_j)
        x_i ← Σ_j w_ij x_j − η m_i / √max(u_i, ε);   v̂_i ← v̂_i'

    ``u_i`` is updated first and then used. ``u_i = v̂_i = ε`` at the start, so
    ``mean_i u_i = mean_i v̂_i`` in every round (W doubly stochastic). One message of
    ``[x_i, u_i]`` (2d values) per gossip step.

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``).
        beta1, beta2: Adam's.
        eps: the floor of ``u`` and the start of ``u`` and ``v̂``.
        gossip_steps: mixing exchanges per round.
    """

    name = "tracked-amsgrad"
    on_loss = "edge"  # u tracks mean v̂ only with doubly stochastic W_t: drop lost edges at both ends
    state_copies = 15

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, gossip_steps: int = 1):
        super().__init__(eta, beta1, beta2, eps, gossip_steps)

    def setup(self, block: Block) -> None:
        super().setup(block)
        x = block.x
        block.state.update(v_max=torch.full_like(x, self.eps), u=torch.full_like(x, self.eps))
        block.workspace["v_new"] = torch.zeros_like(x)

    def step(self, block: Block) -> Round:
        st = block.state
        adam_moments_(st["m"], st["v"], block.gradients(block.workspace["grad"]), self.beta1, self.beta2)
        u, v_max, v_new = st["u"], st["v_max"], block.workspace["v_new"]
        torch.maximum(v_max, st["v"], out=v_new)
        yield from self.mix(block, [block.x, u], self.gossip_steps)
        u.sub_(v_max).add_(v_new)
        v_max.copy_(v_new)
        denom = torch.clamp(u, min=self.eps, out=block.workspace["step"]).sqrt_()
        block.x.addcdiv_(st["m"], denom, value=-scheduled(self.eta, block.round))


class ChocoAMSGrad(TrackedAMSGrad):
    r"""Tracked AMSGrad with compressed gossip: CHOCO-style public copies of ``x`` and ``u``.

    Each node keeps public copies ``x̂_i``, ``û_i`` that its neighbors agree on and the sums
    ``s^x_i = Σ_j w_ij x̂_j``, ``s^u_i = Σ_j w_ij û_j`` (self included); only compressed
    differences travel. One round::

        m_i ← β1 m_i + (1−β1) g_i;   v_i ← β2 v_i + (1−β2) g_i²;   v̂_i' = max(v̂_i, v_i)
        u_i ← u_i − v̂_i + v̂_i';   v̂_i ← v̂_i'                     (tracking increment)
        x_i ← x_i − η m_i / √max(u_i, ε)
        x_i ← x_i + γ (s^x_i − x̂_i);   u_i ← u_i + γ (s^u_i − û_i)   (consensus, old copies)
        q^x_i = C(x_i − x̂_i),  q^u_i = C(u_i − û_i);  send both (one message)
        x̂_i += q^x_i;  û_i += q^u_i;  s_i += Σ_j w_ij q_j

    The consensus step keeps ``Σ_i u_i`` (W doubly stochastic), so ``mean_i u_i = mean_i v̂_i``
    holds under any compressor. With ``--compressor none`` and ``gamma = 1`` the copies are the
    last models and this is ``x ← W x − η m/√max(u + Δv̂, ε)``, ``u ← W u + Δv̂``: tracked AMSGrad
    except that the step uses the tracker before its mixing. Works with the node's compressor
    (per tensor of the layout in training); ``gamma`` must be tuned like CHOCO's. One exchange
    per round (``gossip_steps`` is 1). Prefer top-k or QSGD to ``sign``: ``u`` spans orders of
    magnitude, one sign scale can push small coordinates of ``u_i`` below 0, and the ε floor
    then makes ``1/√ε``-sized steps.

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``).
        gamma: consensus step in (0, 1].
        beta1, beta2, eps: as ``tracked-amsgrad``.
    """

    name = "choco-amsgrad"
    on_loss = None  # not tracked-amsgrad's "edge": a lost increment to x̂, û is missed (docs/network.md)
    state_copies = 15
    overlaps = "next"  # the mixes change only the copies
    requires = replace(AdaptiveGossip.requires, compressor="any", compressor_message="")
    """Any compressor: the copies make biased ones safe (as in CHOCO-SGD)."""
    tunable = ("gamma",)

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, gamma: float = 0.2,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        super().__init__(eta, beta1, beta2, eps, gossip_steps=1)
        check_range("gamma", gamma, 0.0, 1.0, "the consensus step of CHOCO; tune it on a grid.")
        self.gamma = gamma

    def setup(self, block: Block) -> None:
        super().setup(block)
        # public copies x̂, û and their gaps s_x − x̂, s_u − û (block.state); both channels encode with
        # the main compressor and stream, x's draws first
        block.workspace["channels"] = (Channel(block, "x", memory="choco", keys=("x_hat", "gap_x")),
                                       Channel(block, "u", memory="choco", keys=("u_hat", "gap_u")))

    def step(self, block: Block) -> Round:
        st, x = block.state, block.x
        adam_moments_(st["m"], st["v"], block.gradients(block.workspace["grad"]), self.beta1, self.beta2)
        u, v_max, v_new = st["u"], st["v_max"], block.workspace["v_new"]
        torch.maximum(v_max, st["v"], out=v_new)
        u.sub_(v_max).add_(v_new)
        v_max.copy_(v_new)
        denom = torch.clamp(u, min=self.eps, out=block.workspace["step"]).sqrt_()
        x.addcdiv_(st["m"], denom, value=-scheduled(self.eta, block.round))
        cx, cu = block.workspace["channels"]
        x.add_(cx.gap(), alpha=self.gamma)  # x += γ (s_x − x̂), the old copies
        u.add_(cu.gap(), alpha=self.gamma)  # u += γ (s_u − û)
        qx, qu = yield cx.send(x), cu.send(u)  # one message: C(x − x̂), C(u − û)
        cx.update(qx)  # x̂ += q;  s_x += Σ_j w_ij q_j (kept as s_x − x̂)
        cu.update(qu)


class DESLOC(AdaptiveGossip):
    r"""Local Adam with independent gossip periods for x, m and v (DES-LOC style, Iacob et al.).

    Every node takes a local Adam step every round; the model is mixed every ``period_x``
    rounds, the first moment every ``period_m`` rounds and the second every ``period_v``
    rounds (each by ``gossip_steps`` exchanges with ``W``; on the complete graph with uniform
    weights that is the exact average of DES-LOC / Local Adam)::

        m_i ← β1 m_i + (1−β1) g_i;   v_i ← β2 v_i + (1−β2) g_i²
        x_i ← x_i − η clip(m_i/(√v_i + ε), −ρ, ρ)
        t mod K_x = 0: x ← W x;   t mod K_m = 0: m ← W m;   t mod K_v = 0: v ← W v

    Rounds with nothing due send nothing. No bias correction. The clip (each coordinate of the
    Adam direction to ``[−ρ, ρ]``, ρ = ``clip``) matters: after ``m`` is mixed but ``v`` is not,
    a coordinate where this node's ``v_i`` is tiny but its neighbors' ``m_j`` is not would take
    a huge step (without it the digits MLP diverges at K_m ≠ K_v).

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``).
        period_x, period_m, period_v: K_x, K_m, K_v (0 never mixes that vector).
        beta1, beta2, eps: Adam's.
        clip: ρ, the bound of each coordinate of the Adam direction (0: no clipping).
        gossip_steps: mixing exchanges per due round.
    """

    name = "desloc"
    state_copies = 6

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, period_x: int = 4,
                 period_m: int = 12, period_v: int = 24, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, clip: float = 1.0, gossip_steps: int = 1):
        super().__init__(eta, beta1, beta2, eps, gossip_steps)
        if clip < 0:
            raise ConfigError(f"clip = {clip} must be >= 0 (0: no clipping)")
        self.clip = float(clip)
        for key, value in (("period_x", period_x), ("period_m", period_m), ("period_v", period_v)):
            if int(value) < 0:
                raise ConfigError(f"{key} = {value} must be >= 0 (0: never mixed)")
        if int(period_x) == 0:
            raise ConfigError("period_x = 0 never mixes the models: the nodes would train alone")
        self.period_x, self.period_m, self.period_v = int(period_x), int(period_m), int(period_v)

    def step(self, block: Block) -> Round:
        st, t, x = block.state, block.round, block.x
        adam_moments_(st["m"], st["v"], block.gradients(block.workspace["grad"]), self.beta1, self.beta2)
        direction = preconditioned(st["m"], st["v"], self.eps, block.workspace["step"])
        if self.clip:
            direction.clamp_(-self.clip, self.clip)
        x.sub_(direction, alpha=scheduled(self.eta, t))
        due = [vec for vec, k in ((x, self.period_x), (st["m"], self.period_m), (st["v"], self.period_v))
               if k and t % k == 0]
        if due:
            yield from self.mix(block, due, self.gossip_steps)
