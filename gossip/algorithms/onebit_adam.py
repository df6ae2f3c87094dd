"""1-bit Adam (Tang et al., ICML 2021): Adam warm-up, then frozen variance and 1-bit momentum."""

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


class OneBitAdam(AllReduceAlgorithm):
    r"""1-bit Adam on the complete graph (all-reduce data parallelism), as DeepSpeed runs it.

    Warm-up, rounds ``t ≤ freeze_step`` (full-precision all-reduce of the gradients)::

        g = mean_i g_i;   m ← β1 m + (1−β1) g;   v ← β2 v + (1−β2) g²
        x ← x − η m / (√v + ε)

    Compression stage, ``t > freeze_step`` (``v`` frozen, 1-bit all-reduce of the momentum with
    worker and server error feedback, :class:`~gossip.algorithms.allreduce.ChunkedAllReduce`)::

        m ← CompressedAllReduce(β1 m + (1−β1) g_i);   x ← x − η m / (√v + ε)

    No bias correction; every node holds the same ``x``, ``m`` and ``v`` after every round.
    Coordinates whose frozen ``v`` is exactly 0 (they never had a gradient, e.g. pixels that are
    always blank) get ``m = 0``: the 1-bit all-reduce would otherwise hand them ``±scale`` every
    round, divided by ``ε`` (DeepSpeed asks the user for such a mask; we derive it from ``v``).

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``).
        freeze_step: rounds of full-precision Adam before ``v`` is frozen (DeepSpeed's
            tutorial: 15–25 % of the run).
        beta1, beta2: moment decay rates.
        eps: added to ``√v``.
        codec: the compressor of the compression stage, from the registry: ``sign_l2``
            (‖z‖₂/√d, DeepSpeed) or ``sign_l1`` = ``sign`` (‖z‖₁/d); ``none`` sends the
            momentum in full precision (an ablation); ``fp16``/``bf16`` also cut into chunks.
    """

    name = "onebit-adam"
    state_copies = 10

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, freeze_step: int = 100,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 codec: str = "sign_l2"):
        check_range("eta", eta, 0.0, float("inf"))
        check_betas(beta1, beta2)
        check_codec(codec)
        check_warmup("freeze_step", freeze_step)
        check_range("eps", eps, 0.0, float("inf"))
        self.eta, self.freeze_step, self.beta1, self.beta2, self.eps = eta, freeze_step, beta1, beta2, eps
        self.codec = codec

    def setup(self, block: Block) -> None:
        self.setup_collectives(block)
        z = torch.zeros_like(block.x)
        block.state.update(m=z, v=z.clone())
        block.workspace.update(grad=z.clone(), step=z.clone())  # scratch, never checkpointed

    def step(self, block: Block) -> Round:
        st = block.state
        m, v = st["m"], st["v"]
        g = block.gradients(block.workspace["grad"])
        if block.round <= self.freeze_step:
            yield from block.workspace["fp"].reduce_block(block, g, g)
            adam_moments_(m, v, g, self.beta1, self.beta2)
        else:
            adam_moments_(m, None, g, self.beta1, self.beta2)
            yield from block.workspace["ar"].reduce_block(block, m, m)
            m.masked_fill_(v == 0, 0.0)  # coordinates that never had a gradient stay put
        block.x.sub_(preconditioned(m, v, self.eps, block.workspace["step"]), alpha=scheduled(self.eta, block.round))


class APMSqueeze(OneBitAdam):
    """APMSqueeze (Tang, Gan, Rajbhandari, Lian, Liu, Zhang, He, arXiv 2008.11343, 2020):
    1-bit Adam under its first name (docs/algorithms/apmsqueeze.md).

    The rule we could reconstruct (an Adam warm-up on the exact all-reduce, then momentum SGD
    preconditioned by the frozen ``v``, its momentum sent by the error-compensated 1-bit
    all-reduce with worker and server error feedback) is :class:`OneBitAdam`'s, by the same
    group, which 1-bit Adam's paper succeeds; no source we read gives APMSqueeze other
    defaults, so this is that class under the name, with 1-bit Adam's defaults (our choice).

    Args:
        eta, freeze_step, beta1, beta2, eps, codec: as :class:`OneBitAdam`.
    """

    name = "apmsqueeze"
