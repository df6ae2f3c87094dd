"""0/1 Adam (Lu et al., ICLR 2023): adaptive variance freezing, 1-bit sync and local steps."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.algorithms.allreduce import (
    AllReduceAlgorithm,
    adam_moments_,
    check_betas,
    check_codec,
    check_warmup,
    preconditioned,
)
from gossip.core.algorithm import Round, check_range, scheduled
from gossip.core.block import Block
from gossip.errors import ConfigError


class ZeroOneAdam(AllReduceAlgorithm):
    r"""0/1 Adam on the complete graph, with DeepSpeed's policies for ``T_v`` and ``T_u``.

    Phase A, rounds ``t ≤ var_freeze_step``: ``v`` is refreshed only at rounds ``t ∈ T_v``
    (``t`` a multiple of ``var_interval``; the interval doubles after every ``var_update_scaler``
    refreshes), with a full-precision all-reduce of the gradients; the other rounds reduce the
    gradients with the 1-bit all-reduce::

        t ∈ T_v:  g = mean_i g_i;            v ← β2 v + (1−β2) g²;   m ← β1 m + (1−β1) g
        else:     ĝ = 1-bit-AllReduce(g_i);  m ← β1 m + (1−β1) ĝ
        x ← x − η m / (√v + ε)

    Phase B, ``t > var_freeze_step`` (``v`` frozen; both error buffers are zeroed on entry): local
    steps, synchronized at rounds ``t ∈ T_u`` (``t`` a multiple of ``ls_interval``, which doubles
    after every ``local_step_scaler`` rounds up to ``local_step_clipper``)::

        m_i ← β1 m_i + (1−β1) g_i;   Δ = η m_i/(√v+ε);   x_i ← x_i − Δ;   u_i ← u_i − Δ;   Σ_η += η
        t ∈ T_u:  ū = 1-bit-AllReduce(u_i ⊙ (√v+ε))
                  m ← −ū / Σ_η;   x ← x_sync + ū/(√v+ε);   x_sync ← x;   u_i ← 0;   Σ_η ← 0

    ``x_sync`` is the last synchronized model (DeepSpeed recovers it as ``x_i − u_i``, which
    leaves rounding-level differences between the nodes; keeping it makes them bitwise equal).

    Between syncs nothing is sent. No bias correction. Coordinates whose ``v`` is exactly 0
    (never a gradient) get 0 from the 1-bit reductions (``ĝ``, ``ū``), as 1-bit Adam's ``m``.

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``; local steps want a decaying one).
        var_freeze_step: last round of phase A (a value past the run disables local steps).
        var_update_scaler: κ, refreshes of ``v`` per interval before it doubles.
        local_step_scaler: rounds per local-step interval before it doubles.
        local_step_clipper: H, the largest local-step interval.
        beta1, beta2, eps: as Adam's.
        codec: the all-reduce's compressor, from the registry: ``sign_l2`` or ``sign_l1``
            (1 bit per entry), or ``none`` (full precision); see :func:`check_codec`.
    """

    name = "zero-one-adam"
    state_copies = 13

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, var_freeze_step: int = 100000,
                 var_update_scaler: int = 16, local_step_scaler: int = 32678,
                 local_step_clipper: int = 16, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, codec: str = "sign_l2"):
        check_range("eta", eta, 0.0, float("inf"))
        check_betas(beta1, beta2)
        check_codec(codec)
        check_warmup("var_freeze_step", var_freeze_step)
        for key, value in (("var_update_scaler", var_update_scaler),
                           ("local_step_scaler", local_step_scaler),
                           ("local_step_clipper", local_step_clipper)):
            if int(value) < 1:
                raise ConfigError(f"{key} = {value} must be >= 1")
        self.eta, self.var_freeze_step = eta, int(var_freeze_step)
        self.var_update_scaler, self.local_step_scaler = int(var_update_scaler), int(local_step_scaler)
        self.local_step_clipper = int(local_step_clipper)
        self.beta1, self.beta2, self.eps, self.codec = beta1, beta2, eps, codec

    def setup(self, block: Block) -> None:
        self.setup_collectives(block)
        z = torch.zeros_like(block.x)
        block.state.update(m=z, v=z.clone(), u=z.clone(), x_sync=z.clone())
        block.workspace.update(grad=z.clone(), step=z.clone(), denom=z.clone())  # scratch
        # the schedules' counters and Σ_η, one per node: host tensors (checkpointed in place, read
        # without a device sync); eta_sum in float64 sums exactly as a Python float. They are
        # the same on every node, so the block reads row 0's.
        m = block.m
        block.state.update({key: torch.full((m,), value, dtype=torch.int64) for key, value in
                            (("var_interval", 1), ("var_counter", 0), ("ls_interval", 1), ("ls_counter", 0))})
        block.state["eta_sum"] = torch.zeros(m, dtype=torch.float64)

    def step(self, block: Block) -> Round:
        st, t, x = block.state, block.round, block.x
        m, v, u, step = st["m"], st["v"], st["u"], block.workspace["step"]
        eta = scheduled(self.eta, t)
        g = block.gradients(block.workspace["grad"])
        if t <= self.var_freeze_step:
            refresh = t % int(st["var_interval"][0]) == 0
            if refresh:
                yield from block.workspace["fp"].reduce_block(block, g, g)
                adam_moments_(m, v, g, self.beta1, self.beta2)
            else:
                yield from block.workspace["ar"].reduce_block(block, g, g)
                g.masked_fill_(v == 0, 0.0)  # never had a gradient: no 1-bit noise either
                adam_moments_(m, None, g, self.beta1, self.beta2)
            x.sub_(preconditioned(m, v, self.eps, step), alpha=eta)
            if refresh:
                st["var_counter"].add_(1)
                if int(st["var_counter"][0]) == self.var_update_scaler:
                    st["var_counter"].zero_()
                    st["var_interval"].mul_(2)
            return
        if t == self.var_freeze_step + 1:
            block.workspace["ar"].reset_block(block)  # the errors held gradients, now they will hold momenta
            st["x_sync"].copy_(x)
        adam_moments_(m, None, g, self.beta1, self.beta2)
        st["eta_sum"].add_(eta)
        preconditioned(m, v, self.eps, step).mul_(eta)
        x.sub_(step)
        u.sub_(step)
        if t % int(st["ls_interval"][0]) == 0:
            denom = torch.sqrt(v, out=block.workspace["denom"]).add_(self.eps)
            u.mul_(denom)
            yield from block.workspace["ar"].reduce_block(block, u, u)
            u.masked_fill_(v == 0, 0.0)
            # m ← −ū/Σ_η: each row's Σ_η in the working dtype, as a scalar divisor is
            torch.div(u, st["eta_sum"].neg().to(u.device, u.dtype).view(-1, 1), out=m)
            torch.addcdiv(st["x_sync"], u, denom, out=x)
            st["x_sync"].copy_(x)
            u.zero_()
            st["eta_sum"].zero_()
        st["ls_counter"].add_(1)
        if int(st["ls_counter"][0]) == self.local_step_scaler:
            st["ls_counter"].zero_()
            st["ls_interval"].fill_(min(self.local_step_clipper, 2 * int(st["ls_interval"][0])))
