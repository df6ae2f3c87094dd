"""Compressed momentum tracking: DoCoM and MoTEF.

Both track an average *momentum* (a variance-reduced or averaged gradient estimate) instead of
the average gradient, and send the model and the tracker as two compressed vectors per round.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from gossip.algorithms.beer import BEER
from gossip.algorithms.tracking import compression_defaults, stochastic_kind
from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Graph, Requirements
from gossip.errors import ConfigError


class DoCoM(Algorithm):
    r"""DoCoM: doubly compressed momentum-assisted gradient tracking (Yau, Wai 2023).

    A STORM-type estimator ``v_i`` is tracked by ``y_i``; model and tracker are gossiped
    CHOCO-style through public copies ``x̂, ŷ`` (mixed copies ``Σ_j w_ij x̂_j``). One round,
    one message with two compressed vectors::

        g = ∇f_i(x_i; ξ),  g_old = ∇f_i(x_i^prev; ξ)          (the same sample ξ)
        v_new = g + (1 − β)(v_i − g_old);   y_i += v_new − v_i;   v_i = v_new
        y_i += γ (Σ_j w_ij ŷ_j − ŷ_i)
        x_i^prev = x_i;   x_i −= η y_i;   x_i += γ (Σ_j w_ij x̂_j − x̂_i)
        send C(y_i − ŷ_i), C(x_i − x̂_i);   ŷ, x̂ ← ŷ + C(·), x̂ + C(·) on every copy

    Setup: ``v_i = y_i = ∇f_i(x_i⁰)``, copies zero; the first round moves x only. The mean of
    ``y`` equals the mean of ``v`` at every round. With full gradients ``v = ∇f`` exactly and
    this is CHOCO-compressed gradient tracking. With a sampled oracle (``--estimator sgd``) both
    gradients use one mini-batch; the table-based estimators (``lsvrg``, ``saga``) are refused.
    Model-training oracles draw their own batches and cannot evaluate one twice: there the
    previous gradient stands in for ``g_old`` and ``v`` is the plain stochastic gradient.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
        gamma: consensus step for x and y (default by compressor: 1, 0.5 unbiased, 0.2 biased).
        beta: momentum weight β ∈ (0, 1] (default 0.1; 1 is the plain stochastic gradient).
    """

    name = "docom"
    state_copies = 17
    trains = True
    requires = Requirements(graph=Graph(symmetric=False), gradients=True)
    tunable = ("gamma",)

    def __init__(self, eta: float = 0.05, gamma: float | None = None, beta: float = 0.1):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.1/L to 0.3/L.")
        if gamma is not None:
            check_range("gamma", gamma, 0.0, 1.0, "The consensus step; 0.2-0.5 with compression.")
        check_range("beta", beta, 0.0, 1.0, "1 gives the plain stochastic gradient.")
        self.eta = eta
        self.gamma = gamma
        self.beta = beta

    def validate(self, topology: Any, compressor: Any) -> None:
        _check_doubly_stochastic(self.name, topology)

    def setup(self, block: Any) -> None:
        x, st = block.x, block.state
        if block.hparams["gamma"] is None:
            block.hparams["gamma"] = compression_defaults(block.compressor)
        # the public copies and their gaps sx.h, sx.gap, sy.h, sy.gap (in block.state)
        block.workspace["channels"] = (Channel(block, "sx", memory="choco"),
                                       Channel(block, "sy", memory="choco", own_compressor=True))
        st["v"] = block.gradients(torch.empty_like(x))
        st["y"] = st["v"].clone()
        st["x_prev"] = x.clone()
        st["g_old"] = st["v"].clone()  # full gradients: ∇f at x_prev
        block.workspace["g"] = torch.empty_like(x)

    def step(self, block: Any) -> Round:
        x, st, gamma = block.x, block.state, block.hparams["gamma"]
        sx, sy = block.workspace["channels"]
        v, y, x_prev, g_old = (st[k] for k in ("v", "y", "x_prev", "g_old"))
        g = block.workspace["g"]
        sampled = [self._sampled(nd.oracle) for nd in block.nodes]
        if any(sampled):  # one mini-batch at both points, node by node
            for r, nd in enumerate(block.nodes):
                if sampled[r]:
                    idx = nd.oracle.sample()
                    block.oracle_call(nd.oracle.grad_at, x[r], idx, out=g[r])
                    block.oracle_call(nd.oracle.grad_at, x_prev[r], idx, out=g_old[r])
                else:
                    block.oracle_call(nd.oracle.grad, x[r], out=g[r])
        else:
            block.gradients(g)
        # v_new = g + (1 − β)(v − g_old): y += v_new − v, then v = v_new
        y.sub_(v)
        v.sub_(g_old).mul_(1.0 - self.beta).add_(g)
        y.add_(v)
        if not any(sampled):
            g_old.copy_(g)
        elif not all(sampled):
            for r, flag in enumerate(sampled):
                if not flag:
                    g_old[r].copy_(g[r])
        y.add_(sy.gap(), alpha=gamma)  # y += γ (Σ_j w_ij ŷ_j − ŷ_i)
        x_prev.copy_(x)
        x.sub_(y, alpha=self.eta).add_(sx.gap(), alpha=gamma)
        qx, qy = yield sx.send(x), sy.send(y)
        sx.update(qx)  # x̂ += C(x − x̂) on every copy
        sy.update(qy)

    def validate_block(self, block: Any) -> None:
        for nd in block.nodes:
            self._sampled(nd.oracle)

    @staticmethod
    def _sampled(oracle: Any) -> bool:
        from gossip.problems.oracles import SGD

        if isinstance(oracle, SGD):
            return True
        if hasattr(oracle, "grad_at"):
            raise ConfigError(
                f"docom evaluates one mini-batch at two points, which the "
                f"'{getattr(oracle, 'estimator', type(oracle).__name__)}' estimator cannot do "
                "(it updates its tables on every call); use --estimator sgd or full"
            )
        return False


class MoTEF(BEER):
    r"""MoTEF: BEER with a tracked momentum (Islamov, Gao, Stich 2024).

    Each node's tracker ``v_i`` follows the average of momenta
    ``m_i ← (1 − λ) m_i + λ ∇f_i(x_i; ξ)`` instead of the gradients; the rest is BEER's round
    (model and tracker sent as compressed differences against EF21-style states)::

        m_new = (1 − λ) m_i + λ ∇f_i(x_i);   v_i += γ (sg_i − g_i) + m_new − m_i;   m_i = m_new
        send [qh_i = C(x_i − h_i), qg_i = C(v_i − g_i)];   h, sh, g, sg as in BEER
        x_i += γ (sh_i − h_i) − η v_i

    Setup ``v_i = m_i = ∇f_i(x_i⁰)`` and the first model step ``x¹ = x⁰ − η v`` (the round ends
    with the model's step, as BEER's), so the mean of ``v`` equals the mean of ``m`` at every
    round and full-gradient runs reach the exact optimum. (The authors' code starts ``m`` at 0,
    which shifts the tracker by the mean initial gradient.) λ = 1 is BEER.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
        gamma: consensus step (default 0.4).
        lam: momentum weight λ ∈ (0, 1] (default 0.9).
    """

    name = "motef"
    state_copies = 11
    requires = replace(BEER.requires, graph=Graph(symmetric=False))

    def __init__(self, eta: float = 0.05, gamma: float = 0.4, lam: float = 0.9):
        super().__init__(eta=eta, gamma=gamma)
        check_range("lam", lam, 0.0, 1.0, "1 recovers BEER; the authors use 0.9.")
        self.lam = lam

    def validate(self, topology: Any, compressor: Any) -> None:
        _check_doubly_stochastic(self.name, topology)
        super().validate(topology, compressor)

    def estimate(self, block: Block, grad: torch.Tensor, prev: torch.Tensor) -> None:
        grad.mul_(self.lam).add_(prev, alpha=1.0 - self.lam)  # the new momenta; prev holds m_i


def _check_doubly_stochastic(name: str, topology: Any) -> None:
    kind = stochastic_kind(topology)
    if kind != "double":
        raise ConfigError(
            f"{name} tracks an average and needs a doubly stochastic mixing matrix, but "
            f"'{topology.name}' is {kind}-stochastic; use --weights metropolis"
        )
