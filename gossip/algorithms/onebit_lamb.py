"""1-bit LAMB (Li, Awan, Tang, Rajbhandari, He, 2021): LAMB warm-up, then frozen trust ratios
rescaled from a reconstructed gradient, with 1-bit momentum."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.allreduce import (
    AllReduceAlgorithm,
    adam_moments_,
    adaptive_hparams,
    check_betas,
    check_codec,
    check_warmup,
    norm_rows,
    preconditioned,
)
from gossip.core.algorithm import Round, check_range, scheduled
from gossip.core.block import Block
from gossip.errors import ConfigError


class OneBitLamb(AllReduceAlgorithm):
    r"""1-bit LAMB on the complete graph, as DeepSpeed runs it; per tensor ``p`` of the layout.

    Warm-up, rounds ``t ≤ freeze_step`` (full-precision all-reduce of the gradients)::

        m ← β1 m + (1−β1) g;   v ← β2 v + (1−β2) g²;   (t = freeze_step: v_fresh ← v)
        u_p = m_p/(√v_p+ε) + λ x_p;   c = clip(‖x_p‖/‖u_p‖, min_coeff, max_coeff)  (1 if a norm is 0)
        c ≠ 1:  c̄_p ← coeff_beta c̄_p + (1−coeff_beta) c          (the frozen trust ratio, from 0)
        x_p ← x_p − η c u_p

    Compression stage (``v`` frozen). At its first round every tensor gets a scaling
    ``k_p = mean_q rms(m_q) / rms(m_p)`` (``rms = ‖·‖/√numel``; 1 for a zero momentum) so that one
    1-bit all-reduce over the fused momenta treats the tensors alike::

        m_old = m;   m_p ← k_p (β1 m_p + (1−β1) g_p,i);   m ← 1-bit-AllReduce(m);   m_p ← m_p / k_p
        g̃ = (m − β1 m_old)/(1−β1);   v_fresh ← β2 v_fresh + (1−β2) g̃²
        u_p = m_p/(√v_p+ε) + λ x_p;   f = max_coord (√v_p+ε)/(√v_fresh,p+ε)
        λ > 0:  r = min(1, ‖m_p/(√v_p+ε)‖/‖u_p‖);   f ← f r + (1 − r)
        f ← clip(f, factor_min, factor_max), then within f_last (1 ± factor_threshold);  f_last ← f
        x_p ← x_p − η c̄_p f u_p

    ``f_last`` starts at 1. Coordinates whose ``v`` is 0 get ``m = 0`` after the all-reduce (as in
    1-bit Adam). No bias correction.

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``).
        freeze_step: rounds of full-precision LAMB (should be ≥ ``1/(1−coeff_beta)``).
        beta1, beta2, eps: Adam's.
        weight_decay: λ (decoupled, inside the trust ratio as in LAMB).
        max_coeff, min_coeff: bounds of the warm-up trust ratio.
        coeff_beta: EMA rate of the frozen trust ratio.
        factor_max, factor_min, factor_threshold: bounds of the compression-stage factor.
        codec: the all-reduce's compressor, from the registry: ``sign_l2`` or ``sign_l1``
            (1 bit per entry), or ``none`` (full precision); see :func:`check_codec`.
    """

    name = "onebit-lamb"
    state_copies = 13

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, freeze_step: int = 100,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0, max_coeff: float = 10.0, min_coeff: float = 0.01,
                 coeff_beta: float = 0.9, factor_max: float = 4.0, factor_min: float = 0.5,
                 factor_threshold: float = 0.1, codec: str = "sign_l2"):
        check_range("eta", eta, 0.0, float("inf"))
        check_betas(beta1, beta2)
        check_codec(codec)
        check_warmup("freeze_step", freeze_step)
        if not 0 < min_coeff <= max_coeff or not 0 < factor_min <= factor_max:
            raise ConfigError(
                f"need 0 < min_coeff <= max_coeff ({min_coeff}, {max_coeff}) and "
                f"0 < factor_min <= factor_max ({factor_min}, {factor_max})"
            )
        self.eta, self.freeze_step, self.beta1, self.beta2, self.eps = eta, int(freeze_step), beta1, beta2, eps
        self.weight_decay, self.max_coeff, self.min_coeff = weight_decay, max_coeff, min_coeff
        self.coeff_beta, self.factor_max, self.factor_min = coeff_beta, factor_max, factor_min
        self.factor_threshold, self.codec = factor_threshold, codec

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta = 0.05`` and the problem's ``eps`` (:func:`~gossip.algorithms.allreduce.adaptive_hparams`).

        LAMB's step is relative: the trust ratio makes ``‖Δx_p‖ ≈ η ‖x_p‖`` per tensor, so its
        ``η`` does not depend on the problem's scale; ``eps`` does (it bounds the steps of
        coordinates whose frozen ``v`` is tiny).
        """
        return {**adaptive_hparams(cls, problem, with_eps=True), "eta": 0.05}

    def setup(self, block: Block) -> None:
        self.setup_collectives(block)
        z, k, n = torch.zeros_like(block.x), len(block.nodes[0].layout), block.m
        block.workspace.update(grad=z.clone(), upd=z.clone(), tmp=z.clone())  # scratch
        # trust, scaling, last_factor: per node and tensor of the layout, float64 on the host
        block.state.update(m=z, v=z.clone(), v_fresh=z.clone(), m_old=z.clone(),
                           trust=torch.zeros(n, k, dtype=torch.float64),
                           scaling=torch.ones(n, k, dtype=torch.float64),
                           last_factor=torch.ones(n, k, dtype=torch.float64))

    def step(self, block: Block) -> Round:
        st, t, x = block.state, block.round, block.x
        m, v, upd = st["m"], st["v"], block.workspace["upd"]
        eta = scheduled(self.eta, t)
        g = block.gradients(block.workspace["grad"])
        layout = block.nodes[0].layout
        parts = [slice(o, o + s) for o, s in zip(layout.offsets, layout.sizes)]
        # the per-tensor scalars of every node as [m] float64 host tensors: the float64 ops
        # below are those of the per-node Python floats, one rounding each
        if t <= self.freeze_step:
            yield from block.workspace["fp"].reduce_block(block, g, g)
            adam_moments_(m, v, g, self.beta1, self.beta2)
            if t == self.freeze_step:
                st["v_fresh"].copy_(v)
            preconditioned(m, v, self.eps, upd).add_(x, alpha=self.weight_decay)
            for k, p in enumerate(parts):
                wn, un = _host(norm_rows(x[:, p])), _host(norm_rows(upd[:, p]))
                c = torch.where((wn > 0) & (un > 0),
                                (wn / un).clamp_(self.min_coeff, self.max_coeff), 1.0)
                trust = st["trust"][:, k]
                trust.copy_(torch.where(c != 1.0, trust * self.coeff_beta + c * (1 - self.coeff_beta),
                                        trust))
                x[:, p].addcmul_(upd[:, p], _col(c * -eta, x))  # x_p += (−η c) u_p
            return
        scaling = st["scaling"]
        if t == self.freeze_step + 1:
            rms = [_host(norm_rows(m[:, p])) / p_len ** 0.5 for p, p_len in zip(parts, layout.sizes)]
            mean = torch.zeros_like(rms[0])
            for r in rms:
                mean += r
            mean /= len(rms)
            for k, r in enumerate(rms):
                scaling[:, k] = torch.where(r > 0, mean / r, 1.0)
        st["m_old"].copy_(m)
        adam_moments_(m, None, g, self.beta1, self.beta2)
        for k, p in enumerate(parts):
            m[:, p].mul_(_col(scaling[:, k], m))
        yield from block.workspace["ar"].reduce_block(block, m, m)
        for k, p in enumerate(parts):
            m[:, p].div_(_col(scaling[:, k], m))
        m.masked_fill_(v == 0, 0.0)
        g_rec = torch.sub(m, st["m_old"], alpha=self.beta1, out=block.workspace["tmp"]).div_(1 - self.beta1)
        st["v_fresh"].mul_(self.beta2).addcmul_(g_rec, g_rec, value=1 - self.beta2)
        preconditioned(m, v, self.eps, upd)
        for k, p in enumerate(parts):
            plain = _host(norm_rows(upd[:, p]))
            if self.weight_decay:
                upd[:, p].add_(x[:, p], alpha=self.weight_decay)
            ratio = torch.sqrt(v[:, p]).add_(self.eps).div_(torch.sqrt(st["v_fresh"][:, p]).add_(self.eps))
            f = _host(ratio.amax(1))
            if self.weight_decay:
                full = _host(norm_rows(upd[:, p]))
                r = torch.where(full > 0, (plain / full).clamp_(max=1.0), 1.0)
                f = f * r + (1 - r)
            f = f.clamp_(self.factor_min, self.factor_max)
            last = st["last_factor"][:, k]
            f = torch.minimum(torch.maximum(f, last * (1 - self.factor_threshold)),
                              last * (1 + self.factor_threshold))
            last.copy_(f)
            x[:, p].addcmul_(upd[:, p], _col(st["trust"][:, k] * -eta * f, x))


def _host(values: torch.Tensor) -> torch.Tensor:
    """[m] values as float64 on the host (what ``float()`` of each would give)."""
    return values.to("cpu", torch.float64)


def _col(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[m] float64 scalars as an [m, 1] column of ``like``'s dtype and device (a Python float
    passed to a tensor op is cast to the tensor's dtype the same way)."""
    return values.to(like.device, like.dtype).view(-1, 1)
