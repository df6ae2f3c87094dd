"""Local training with a correction: K-GT and decentralized Scaffnew (ProxSkip).

Both take one local gradient step per round and communicate only in some rounds, yet reach the
exact optimum of a strongly convex sum with a constant step on heterogeneous data: every local
step is corrected by a per-node vector (K-GT's tracking variable ``c_i``, Scaffnew's control
variate ``h_i``) whose sum over the nodes stays zero and which, at the fixed point, cancels the
node's own gradient, ``c_i = −∇f_i(x*)`` / ``h_i = ∇f_i(x*)``.

A round is one local gradient step; ``exchanges`` in the log counts the rounds that
communicated (per node), so rounds are gradient steps and ``exchanges`` communication rounds.
docs/algorithms/k-gt.md and docs/algorithms/scaffnew.md give the recursions and sources.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.channel import Channel
from gossip.core.compensated import CompensatedSum
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError
from gossip.rng import Stream

COIN = "scaffnew.coin"  # the stream of the shared coin: one draw per round, the same on every node


class KGT(Algorithm):
    r"""K-GT: K local steps corrected by a tracking variable, then one exchange (Liu, Koloskova,
    Jaggi, Lin 2023, "Decentralized gradient tracking with local steps").

    Node i keeps its model ``x_i`` (here the local iterate ``z_i``), the start of the current
    period ``s_i`` and the correction ``c_i`` (``c_i⁰ = 0``). Rounds ``t = 1, 2, ...``, one local
    step each; every K-th round also exchanges::

        z_i ← z_i − η_c (∇f_i(z_i) + c_i)                          (every round)
        every K-th round:
          Δ_i = (s_i − z_i) / (K η_c)                               (the period's mean direction)
          c_i ← c_i + Σ_j w_ij Δ_j − Δ_i
          z_i ← s_i ← Σ_j w_ij (s_j − K η_c η_s Δ_j)

    Σ_i c_i stays 0 (W doubly stochastic), so at a fixed point ``∇f_i(x) + c_i = 0`` sums to
    ``∇f(x) = 0``: the exact optimum. With K = 1 it is gradient tracking in the form
    ``x ← W(x − η y)``, ``y ← W y + ∇f(x⁺) − ∇f(x)`` (``y_i = ∇f_i + c_i``, ``η = η_c η_s``,
    ``y⁰ = ∇f(x⁰)``): the adapt-then-combine form of NEXT (Di Lorenzo & Scutari 2016) that
    Koloskova, Lin & Stich (2021) analyze, not DIGing's ``x ← W x − η y``.

    One message per neighbor per exchange with two vectors, ``s_j − K η_c η_s Δ_j`` and ``Δ_j``.
    Under message loss (``on_loss = "edge"``) an edge either of whose messages is lost sits the
    exchange out at both ends, so each exchange's W stays symmetric and doubly stochastic:
    Σ c = 0 and the exact fixed point are kept.

    Args:
        eta: the local step η_c (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
        local_steps: K, the rounds (local steps) per exchange (default 5).
        eta_s: the step η_s applied to the period's move before mixing (default 1).
    """

    name = "k-gt"
    trains = True
    requires = Requirements(
        gradients=True, compressor="identity",
        compressor_message="{name} sends uncompressed vectors but the compressor is '{spec}'; use "
                           "--compressor none, or lead / c-gt for compressed exact methods")
    on_loss = "edge"  # a lost message drops its edge at both ends: Σ c = 0 is kept
    state_copies = 9
    counts = ("kgt.exchanges",)
    step_rule = "tracking"

    def __init__(self, eta: float = 0.05, local_steps: int = 5, eta_s: float = 1.0):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.1/L to 0.2/L.")
        check_range("eta_s", eta_s, 0.0, float("inf"), "1 is the paper's experiments' value.")
        if int(local_steps) != local_steps or int(local_steps) < 1:
            raise ConfigError(f"local_steps = {local_steps} must be an integer >= 1 (K: local steps "
                              "per exchange; 1 is gradient tracking)")
        self.eta, self.local_steps, self.eta_s = eta, int(local_steps), eta_s

    def setup(self, block: Any) -> None:
        x, st, ws = block.x, block.state, block.workspace
        ws["cu"] = Channel(block, "kgt.u")  # memoryless: W u from this exchange's u
        ws["cd"] = Channel(block, "kgt.delta", own_compressor=True)
        st["kgt.start"] = x.clone()  # s_i: where the period began
        st["kgt.c"] = torch.zeros_like(x)
        st["kgt.exchanges"] = torch.zeros(block.m, dtype=torch.float64, device=x.device)
        ws["c"] = CompensatedSum(block, "kgt.c")  # Σ_i c_i = 0 must not drift
        ws["g"], ws["u"], ws["delta"] = (torch.empty_like(x) for _ in range(3))

    def step(self, block: Any) -> Round:
        x, st, ws = block.x, block.state, block.workspace
        K, eta = self.local_steps, self.eta
        g = block.gradients(ws["g"])
        x.sub_(g.add_(st["kgt.c"]), alpha=eta)  # z ← z − η_c (∇f(z) + c)
        if block.round % K:
            return
        start, delta, u = st["kgt.start"], ws["delta"], ws["u"]
        torch.sub(start, x, out=delta).div_(K * eta)  # Δ = (s − z)/(K η_c)
        torch.add(start, delta, alpha=-K * eta * self.eta_s, out=u)  # s − K η_c η_s Δ
        qu, qd = yield ws["cu"].send(u), ws["cd"].send(delta)
        gap_u, gap_d = ws["cu"].gap(qu), ws["cd"].gap(qd)  # (W − I) u, (W − I) Δ
        x.copy_(u).add_(gap_u)  # z = W u
        start.copy_(x)
        ws["c"].add_(gap_d)  # c += (W − I) Δ
        st["kgt.exchanges"].add_(1.0)


class Scaffnew(Algorithm):
    r"""Decentralized Scaffnew: ProxSkip's local training with control variates on a graph
    (Mishchenko, Malinovsky, Stich, Richtárik 2022).

    Node i keeps ``x_i`` and its control variate ``h_i`` (``h_i⁰ = 0``, so Σ h = 0). Each
    round, one local step; then with probability p, by one coin shared by all nodes (drawn from
    the run's keyed stream ``scaffnew.coin`` at the round, so in process and under MPI alike)::

        x̂_i = x_i − γ (∇f_i(x_i) − h_i)
        coin heads (prob. p):  x_i = x̂_i − τ Σ_j (δ_ij − w_ij) x̂_j;   h_i ← h_i + (p/γ)(x_i − x̂_i)
        tails:                 x_i = x̂_i

    ProxSkip's ``x = prox_{γ/p ψ}(x̂ − (γ/p) h)``, ``h ← h + (p/γ)(x − x̂)`` with the consensus
    prox (federated Scaffnew: the average) replaced by one gossip step with the matrix
    ``I − τ(I − W)``. Σ h stays 0 and a fixed point has ``L x̂ = 0`` and ``h_i = ∇f_i(x)``: the
    exact optimum. With p = 1 and τ = ½ the iterates are exact diffusion's (Yuan et al. 2019;
    NIDS), ``x^{k+1} = W̄ (2x^k − x^{k−1} − γ(∇f(x^k) − ∇f(x^{k−1})))``, ``W̄ = (I + W)/2``.

    One full vector per neighbor in a round that communicates, none otherwise. Under loss
    (``on_loss = "edge"``) an edge either of whose messages is lost sits the step out at both
    ends: each step's W stays symmetric and doubly stochastic, Σ h = 0 and x* are kept.

    Args:
        eta: the step γ (default 0.05; ``suggest_hparams``: 1/L, step rule "exact").
        p: the probability of communicating in a round (default 0.2).
        tau: the gossip step τ ∈ (0, 1] (default 0.5, exact diffusion's ``(I + W)/2`` at p = 1).
    """

    name = "scaffnew"
    trains = True
    requires = Requirements(
        gradients=True, compressor="identity",
        compressor_message="{name} sends uncompressed vectors but the compressor is '{spec}'; use "
                           "--compressor none, or lead / c-gt for compressed exact methods")
    on_loss = "edge"  # a lost message drops its edge at both ends: Σ h = 0 is kept
    state_copies = 8
    counts = ("scaffnew.exchanges",)
    step_rule = "exact"

    def __init__(self, eta: float = 0.05, p: float = 0.2, tau: float = 0.5):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.5/L to 1/L.")
        check_range("p", p, 0.0, 1.0, "The probability of communicating in a round; e.g. 0.1-0.5.")
        check_range("tau", tau, 0.0, 1.0, "The gossip step; 0.5 is (I + W)/2.")
        self.eta, self.p, self.tau = eta, p, tau

    def setup(self, block: Any) -> None:
        x, st, ws = block.x, block.state, block.workspace
        ws["ch"] = Channel(block, "scaffnew.x")  # memoryless: W x̂ from this round's x̂
        st["scaffnew.h"] = torch.zeros_like(x)
        st["scaffnew.exchanges"] = torch.zeros(block.m, dtype=torch.float64, device=x.device)
        ws["h"] = CompensatedSum(block, "scaffnew.h")  # Σ_i h_i = 0 must not drift
        ws["g"] = torch.empty_like(x)
        ws["coin"] = Stream(block.seed, [0], COIN)  # node 0's key: one coin for every node

    def communicates(self, block: Any) -> bool:
        """The round's shared coin: heads with probability p (a pure function of seed and round)."""
        coin = block.workspace["coin"]
        coin.begin_round(block.round)
        return float(coin.uniform(1, dtype=torch.float64)[0, 0]) < self.p

    def step(self, block: Any) -> Round:
        x, st, ws = block.x, block.state, block.workspace
        g = block.gradients(ws["g"])
        x.sub_(g.sub_(st["scaffnew.h"]), alpha=self.eta)  # x̂ = x − γ(∇f(x) − h)
        if not self.communicates(block):
            return
        (q,) = yield (ws["ch"].send(x),)
        gap = ws["ch"].gap(q)  # (W − I) x̂
        x.add_(gap, alpha=self.tau)  # x = x̂ − τ (I − W) x̂
        ws["h"].add_(gap, alpha=self.tau * self.p / self.eta)  # h += (p/γ)(x − x̂)
        st["scaffnew.exchanges"].add_(1.0)
