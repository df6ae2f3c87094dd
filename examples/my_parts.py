"""A user's own compressor and algorithm, added without editing the gossip package.

Run them through any script by ``module:Class`` (this folder's parent on PYTHONPATH)::

    python experiments/consensus.py --algorithm examples.my_parts:LocalGossip \
        --compressor examples.my_parts:StochasticInt8 --gamma 0.5 --nodes 8
    mpiexec -n 4 python experiments/train.py --algorithm examples.my_parts:LocalGossip \
        --compressor examples.my_parts:StochasticInt8 --epochs 1

Importing this module also registers them as ``int8`` and ``local-gossip``.
docs/extending.md walks through every line.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gossip.algorithms import Algorithm, Round, register_algorithm
from gossip.compress import Codec, register_compressor
from gossip.compress.wire import Sections, numel_of
from gossip.core.algorithm import check_range, scheduled
from gossip.core.channel import Channel
from gossip.errors import CompressionError


class StochasticInt8(Codec):
    """Stochastic rounding to 255 levels: ``C(x) = s · q`` with ``s = max|x| / 127`` and
    ``q_l = ⌊x_l/s⌋ + Bernoulli(frac(x_l/s))`` in −127..127, so ``E C(x) = x``.

    Unbiased, ω ≤ d / (4·127²). Wire: the scale in the input dtype, then one byte per entry
    (``q + 127``): ``8 + itemsize + d`` bytes. Written in the batch form: every method works on
    the rows of a block of nodes at once (a single tensor is a block of one row).
    """

    unbiased: ClassVar[bool] = True
    randomized: ClassVar[bool] = True  # draws from the nodes' random streams

    def omega_for(self, numel: int) -> float:
        return numel / (4 * 127**2)

    def _sections(self, shape: tuple[int, ...], dtype: torch.dtype) -> Sections:
        return Sections.build(("scale", dtype, 1), ("codes", torch.uint8, numel_of(shape)))

    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        top = X.abs().amax(1, keepdim=True)  # [m, 1]
        scale = torch.where(top > 0, top / 127, torch.ones_like(top))
        Y = X / scale
        low = torch.floor(Y)
        up = rng.uniform(X.shape[1], dtype=X.dtype, device=X.device) < Y - low
        v["codes"].copy_((low + up).clamp_(-127, 127) + 127)
        v["scale"].copy_(scale)

    def _check_batch(self, v: dict[str, torch.Tensor], d: int) -> None:
        if not bool((v["scale"] > 0).all()):
            raise CompressionError(f"{self.spec}: a scale is not a positive number")
        if bool((v["codes"] == 255).any()):
            raise CompressionError(f"{self.spec}: code 255 is outside 0..254")

    def _decode_batch(self, v: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        torch.mul(v["codes"].to(out.dtype) - 127, v["scale"], out=out)


class LocalGossip(Algorithm):
    """Local SGD with compressed gossip every ``period`` rounds.

    Every round, with a gradient oracle: ``x_i ← x_i − η ∇f_i(x_i)`` (or the node's optimizer
    step). Every ``period``-th round, CHOCO-style public copies ``x̂_i`` and
    ``s_i = Σ_{j∈N_i⁺} w_ij x̂_j``::

        x_i ← x_i + γ (s_i − x̂_i);   q_i = C(x_i − x̂_i);   send q_i
        x̂_i ← x̂_i + q_i;   s_i ← s_i + Σ_{j∈N_i⁺} w_ij q_j

    Args:
        gamma: consensus step in (0, 1] (tune it: ``--gamma auto``).
        eta: local step size, a number or a schedule ``eta(t)``.
        period: rounds between two exchanges (1 = every round).
    """

    name = "local-gossip"
    trains = True  # uses gradients when the node has an oracle
    takes_optimizer = True  # its local step goes through local_step()
    step_schedule = True  # eta may be a schedule eta(t)
    step_rule = "dgd"  # suggest_hparams: a step DGD-type mixing tolerates
    tunable = ("gamma",)

    def __init__(self, gamma: float = 0.5, eta: Any = 0.0, period: int = 2):
        check_range("gamma", gamma, 0.0, 1.0, "the consensus step; try --gamma auto")
        check_range("period", period, 0, 10**6, "rounds between exchanges, at least 1")
        self.gamma, self.eta, self.period = gamma, eta, int(period)

    def setup(self, block) -> None:
        # x̂ and s live in block.state (checkpointed); one decode of the messages updates both
        block.workspace["channel"] = Channel(block, "x", memory="choco", keys=("x_hat", "gap"))
        block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block) -> Round:
        x, ws = block.x, block.workspace
        ch = ws["channel"]
        if block.has_oracle:
            block.local_step(block.gradients(ws["grad"]), scheduled(self.eta, block.round))
        if block.round % self.period:
            return  # no exchange this round (the same on every node)
        x.add_(ch.gap(), alpha=self.gamma)  # x ← x + γ (s − x̂)
        inbox = yield ch.send(x)  # q = C(x − x̂)
        ch.update(inbox)  # x̂ += q;  s += Σ_j w_ij q_j (kept as s − x̂)


register_compressor("int8", StochasticInt8)
register_algorithm(LocalGossip)
