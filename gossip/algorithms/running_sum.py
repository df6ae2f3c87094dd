"""Methods whose messages are running sums: exact under lost *and* late messages together.

Push-sum's share and a tracker's share are increments: each must arrive exactly once. Sent as
running sums instead (:mod:`gossip.core.running`: every message carries everything its sender
ever pushed, and a counter), a lost message is carried by the next delivered one and a late one
is either the newest (applied) or superseded (ignored), so the mass these methods conserve
(push-sum's ``Σ s`` and ``Σ w``, the tracker's ``Σ y = Σ ∇f``) is conserved counting what is in
flight, whatever the network loses, delays or reorders (docs/network.md, "Running sums").

* :class:`RobustPushSum`: push-sum / SGP over running sums (the robust ratio consensus of
  Hadjicostis, Domínguez-García and Vaidya; with gradient steps, the synchronous form of the
  robust gradient-push of Spiridonoff, Olshevsky and Paschalidis).
* :class:`RobustPushTracking`: Push-DIGing / ADD-OPT gradient tracking (Nedić, Olshevsky, Shi
  2017; Xi, Mai, Xin, Abed, Khan 2018) with all three pushed vectors (the numerator, the weight,
  the tracker) sent as running sums: the tracker buffered in running sums as R-FAST's is.
  Exact optimum with a constant step under loss and lags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.directed import check_column_stochastic
from gossip.core.algorithm import Algorithm, Round, check_range, scheduled
from gossip.core.requirements import Graph, Requirements
from gossip.core.running import RunningSums


class RobustPushSum(Algorithm):
    r"""Robust push-sum / gradient-push: push-sum whose shares travel as running sums.

    Node i keeps a numerator ``s_i`` (init ``x_i⁰``), a weight ``w_i`` (init 1), the running
    sum ``σ_i`` of everything it pushed and, per in-arc (j, i), the newest running sum ``ρ_ij``
    it received (:mod:`gossip.core.running`). With a column-stochastic C (``--weights push``)::

        s_i ← s_i − η ∇f_i(x_i)                                   (optimization only)
        σ_i ← σ_i + (s_i, w_i);  send (σ_i, t) to every out-neighbor
        (s_i, w_i) ← c_ii (s_i, w_i) + Σ_j c_ij (σ_j − ρ_ij);  ρ_ij ← σ_j   (newest received)
        x_i = s_i / w_i

    Without loss or lags ``σ_j − ρ_ij`` is j's last ``(s_j, w_j)`` and this is push-sum. A lost
    message adds nothing and the next delivered one carries it; a late one older than ``ρ_ij``'s
    counter is ignored. ``Σ_i s_i`` plus what is in flight, ``Σ_arcs c_ij (σ_j − ρ_ij)``,
    changes only by the gradient steps, and ``Σ_i w_i`` plus in flight is n, so the consensus
    is the exact average under any loss and lags after which messages keep arriving.

    Args:
        eta: gradient step, a number or a schedule ``eta(t)`` (default 0.05; unused in
            consensus). A constant one stops in a neighborhood of the optimum (no tracking).
    """

    name = "robust-push-sum"
    state_copies = 11
    neighbor_copies = 1
    trains = True
    step_schedule = True
    step_rule = "tracking"
    on_loss = "running-sum"
    counts = ("rps.superseded",)
    requires = Requirements(
        graph=Graph(static=True, symmetric=False), compressor="identity",
        compressor_message="{name} pushes exact running sums (got '{spec}'): use --compressor none")

    def __init__(self, eta: float | Callable[[int], float] = 0.05):
        check_range("eta", eta, 0.0, float("inf"), "Try 1/L with a decaying schedule.",
                    include_low=True)
        self.eta = eta

    def validate(self, topology: Any, compressor: Any) -> None:
        check_column_stochastic(self.name, topology)

    def setup(self, block: Any) -> None:
        st, ws, x = block.state, block.workspace, block.x
        d = x.shape[1]
        st["s"] = x.clone()
        st["w"] = torch.ones(block.m, 1, dtype=torch.float64, device=x.device)
        ws["sums"] = RunningSums(block, "rps", d + 1)
        ws["z"] = torch.empty(block.m, d + 1, dtype=torch.float64, device=x.device)
        if block.has_oracle:
            ws["grad"] = torch.empty_like(x)

    def descend(self, block: Any) -> None:
        """The local step on the numerator before it is pushed (gradient-push's; none for
        plain averaging)."""
        if block.has_oracle:
            block.state["s"].sub_(block.gradients(block.workspace["grad"]),
                                  alpha=scheduled(self.eta, block.round))

    def step(self, block: Any) -> Round:
        st, ws, x = block.state, block.workspace, block.x
        s, w, sums, z = st["s"], st["w"], ws["sums"], ws["z"]
        d = x.shape[1]
        self.descend(block)
        z[:, :d].copy_(s)
        z[:, d:].copy_(w)
        inbox = yield sums.send(z)
        got = sums.receive(inbox)
        # (s, w) ← c_ii (s, w) + Σ_j c_ij (σ_j − ρ_ij), in float64
        z.mul_(sums.self_weight.view(-1, 1)).add_(got)
        s.copy_(z[:, :d])
        w.copy_(z[:, d:])
        torch.div(s, w.to(x.dtype), out=x)


class RobustPushTracking(Algorithm):
    r"""Push-DIGing / ADD-OPT gradient tracking over running sums: the exact optimum with a
    constant step on a directed graph under lost and late messages together.

    Node i keeps the numerator ``u_i`` (init ``x_i⁰``), the weight ``v_i`` (init 1), the tracker
    ``y_i`` and its last gradient ``g_i`` (init 0 both), and running sums of the three vectors
    it pushes (:mod:`gossip.core.running`). With a column-stochastic C, one round::

        y_i ← y_i + ∇f_i(x_i) − g_i;   g_i ← ∇f_i(x_i)        (round 1: y_i = ∇f_i(x_i⁰))
        p_i = (u_i − η y_i,  y_i,  v_i);   σ_i ← σ_i + p_i;   send (σ_i, t)
        (u_i, y_i, v_i) ← c_ii p_i + Σ_j c_ij (σ_j − ρ_ij);   ρ_ij ← σ_j   (newest received)
        x_i = u_i / v_i

    (each gradient at the model a round starts from, as :func:`gossip.wrap` hands them over).

    Without loss or lags this is Push-DIGing (Nedić, Olshevsky, Shi 2017), ``u ← C(u − η y)``,
    ``v ← C v``, ``y ← C y + ∇f(x^new) − ∇f(x^old)``. Every vector is pushed with column
    sums one and travels as a running sum, so at every round ``Σ_i y_i`` plus the tracker in
    flight equals ``Σ_i g_i`` and ``Σ_i v_i`` plus in flight equals n, whatever is lost, late or
    reordered: at a fixed point every node sits at x* (the exact optimum), the tracker in
    flight vanishing with the gradients' sum. One message per node and round of ``2d + 2``
    float64 values (``u − ηy``, ``y``, ``v`` and the counter).

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: the tracking rule, 0.2/L). Lags
            call for a smaller one.
    """

    name = "robust-push-tracking"
    state_copies = 20
    neighbor_copies = 2
    trains = True
    step_rule = "tracking"
    on_loss = "running-sum"
    counts = ("rpt.superseded",)
    requires = Requirements(
        graph=Graph(static=True, symmetric=False), gradients=True, compressor="identity",
        compressor_message="{name} pushes exact running sums (got '{spec}'): use --compressor none")

    def __init__(self, eta: float = 0.05):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.2/L; smaller under long lags.")
        self.eta = eta

    def validate(self, topology: Any, compressor: Any) -> None:
        check_column_stochastic(self.name, topology)

    def setup(self, block: Any) -> None:
        st, ws, x = block.state, block.workspace, block.x
        d = x.shape[1]
        st["u"] = x.clone()
        st["v"] = torch.ones(block.m, 1, dtype=torch.float64, device=x.device)
        st["g"] = torch.zeros_like(x)  # the last gradient; round 1 makes y = g = ∇f(x⁰)
        st["y"] = torch.zeros_like(x)
        ws["sums"] = RunningSums(block, "rpt", 2 * d + 1)
        ws["p"] = torch.empty(block.m, 2 * d + 1, dtype=torch.float64, device=x.device)
        ws["grad"] = torch.empty_like(x)

    def step(self, block: Any) -> Round:
        st, ws, x = block.state, block.workspace, block.x
        u, v, y, g, sums, p = st["u"], st["v"], st["y"], st["g"], ws["sums"], ws["p"]
        d = x.shape[1]
        grad = block.gradients(ws["grad"])  # at the model the round starts from
        y.add_(grad).sub_(g)  # the last round's tracker update: y += ∇f(x) − g
        g.copy_(grad)
        p[:, :d].copy_(u).sub_(y.to(torch.float64), alpha=self.eta)  # u − η y
        p[:, d : 2 * d].copy_(y)
        p[:, 2 * d :].copy_(v)
        inbox = yield sums.send(p)
        got = sums.receive(inbox)
        p.mul_(sums.self_weight.view(-1, 1)).add_(got)  # c_ii p_i + Σ_j c_ij (σ_j − ρ_ij)
        u.copy_(p[:, :d])
        y.copy_(p[:, d : 2 * d])
        v.copy_(p[:, 2 * d :])
        torch.div(u, v.to(x.dtype), out=x)
