"""Directed graphs: push-sum / SGP (exact or quantized) and CPP (compressed push-pull).

On a directed graph whose degrees differ, no nonnegative matrix on its arcs is doubly stochastic
in general. Push-sum keeps a column-stochastic C (build the topology with ``--weights push``:
node j splits its value equally over itself and its out-neighbors) and corrects the bias with a
scalar weight; push-pull pulls the model with a row-stochastic R and pushes the gradient tracker
with C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.tracking import CGT, stochastic_kind
from gossip.core.algorithm import Algorithm, Round, check_range, scheduled
from gossip.core.channel import Channel, Weights, check_stateless
from gossip.core.nodes import Node
from gossip.core.requirements import Graph, Requirements
from gossip.errors import ConfigError


def pull_weights(node: Node) -> Weights:
    """Row-stochastic weights ``1/(1 + |N_in(i)|)`` on node i's in-neighbors and itself."""
    def m(j: int) -> float:
        return 1.0 / (1.0 + len(node.view.in_neighbors))
    return m


def check_column_stochastic(name: str, topology: Any) -> None:
    """Raise unless every round's mixing matrix has columns summing to one."""
    kind = stochastic_kind(topology)
    if kind not in ("column", "double"):
        raise ConfigError(
            f"{name} pushes mass with column-stochastic weights, but '{topology.name}' has a "
            f"{kind}-stochastic matrix; build it with --weights push"
        )


class PushSum(Algorithm):
    r"""Push-sum / stochastic gradient push, exact or quantized (Kempe et al. 2003; Assran et
    al. 2019; Taheri et al. 2020 for the quantized form).

    Node i keeps a numerator ``s_i`` (init ``x_i⁰``), a scalar weight ``w_i`` (init 1) and the
    de-biased model ``x_i = s_i / w_i``. With a column-stochastic C (``c_ij``: the share of j's
    mass that goes to i), one round::

        s_i ← s_i − η ∇f_i(x_i)                                  (optimization only)
        q_i = Q(s_i − ŝ_i);  send q_i and w_i to out-neighbors;  ŝ ← ŝ + q for every copy
        s_i ← s_i + γ (Σ_{j ∈ N_in(i) ∪ {i}} c_ij ŝ_j − ŝ_i)
        w_i ← Σ_{j ∈ N_in(i) ∪ {i}} c_ij w_j;   x_i = s_i / w_i

    ``Σ_i s_i`` changes only by the gradient steps and ``Σ_i w_i = n`` at all times, so in
    consensus every ``x_i`` tends to the average of ``x⁰``. With ``--compressor none`` the copies
    are not needed (``ŝ = s``) and this is exact push-sum / SGP. With a compressor on a static
    graph, each node's public copy ``ŝ_i`` is kept by its out-neighbors; on a time-varying graph
    (one-peer exponential) each node keeps one copy per arc instead (a channel with
    ``route="arcs"``: ``Σ_j c_ij ŝ_j − ŝ_i`` becomes
    ``Σ_in c_ij c_ji − Σ_out c_ji o_ij``, whose sum over nodes is zero, so mass is conserved).
    A constant η reaches a neighborhood of the optimum (a decaying one: the optimum).

    Args:
        eta: gradient step, a number or a schedule ``eta(t)`` of the round t = 1, 2, … (e.g.
            ``lambda t: a / t ** 0.5`` to reach the optimum); default 0.05, unused in consensus.
        gamma: consensus step γ ∈ (0, 1] (default 1; lower it for coarse quantizers).
    """

    name = "push-sum"
    state_copies = 9
    trains = True
    requires = Requirements(graph=Graph(static=False, symmetric=False))
    tunable = ("gamma",)
    step_schedule = True
    step_rule = "tracking"
    """A fifth of ``1/L``: with a constant step push-sum stops in a neighborhood of the optimum
    whose radius grows with η (no tracking), so the cautious step ends closer."""

    def __init__(self, eta: float | Callable[[int], float] = 0.05, gamma: float = 1.0):
        check_range("eta", eta, 0.0, float("inf"), "Try 1/L with a decaying schedule.")
        check_range("gamma", gamma, 0.0, 1.0, "1 for exact push-sum; 0.2-0.5 for 1-2 bit quantizers.")
        self.eta = eta
        self.gamma = gamma

    @staticmethod
    def _per_arc(topology: Any, compressor: Any) -> bool:
        """Copies kept per arc: a graph that changes every round, and compressed messages."""
        return bool(getattr(topology, "time_varying", False)) and not compressor.is_identity

    on_loss = "keep-mass"  # the exact form keeps a lost share at its sender (c_ii += c_ji)
    loss_requires = Requirements(  # the compressed form mixes its copies ŝ with fixed weights
        compressor="identity",
        compressor_message="--network: {name} with compressor '{spec}' mixes public copies with "
                           "fixed weights, which a lost message breaks; run it with --compressor "
                           "none under loss")

    def validate(self, topology: Any, compressor: Any) -> None:
        check_column_stochastic(self.name, topology)
        if self._per_arc(topology, compressor):
            check_stateless(self.name, compressor)

    def setup(self, block: Any) -> None:
        st, ws, x = block.state, block.workspace, block.x
        st["s"] = x.clone()
        # the numerator's channel: per-arc copies on a time-varying graph when compressed
        ws["per_arc"] = self._per_arc(block.topology, block.compressor)
        if ws["per_arc"]:
            ws["channel"] = Channel(block, "ss", memory="ef21", route="arcs")
        else:
            ws["channel"] = Channel(block, "ss", memory=None if block.compressor.is_identity
                                    else "ef21")
        st["w"] = torch.ones(block.m, 1, dtype=torch.float64, device=x.device)
        if block.has_oracle:
            ws["grad"] = torch.empty_like(x)

    def step(self, block: Any) -> Round:
        st, ws, x = block.state, block.workspace, block.x
        s, w, ss = st["s"], st["w"], ws["channel"]
        if block.has_oracle:
            s.sub_(block.gradients(ws["grad"]), alpha=scheduled(self.eta, block.round))
        qs, qw = yield ss.send(s), ss.rows_of(w.view(torch.uint8))  # ŝ's message, then w
        plan = block.plan  # the weights of what was delivered
        s.add_(ss.gap(qs), alpha=self.gamma)  # s ← s + γ (Σ_j c_ij ŝ_j − ŝ_i)
        if ws["per_arc"]:
            # every in-arc's sender weight, sorted by (receiver, sender)
            w_all = block.received_arcs(qw).contiguous().view(torch.float64)[:, 0]
            rnd = ss.arcs.round_of(qs.route)
            slots = [(arcs, rows, rnd.in_weight.index_select(0, arcs))
                     for arcs, rows in rnd.in_sums.slots]
        else:
            w_all = qw.both().contiguous().view(torch.float64)[:, 0]  # every sender's w
            slots = plan.slots
        # w_i ← c_ii w_i + Σ_j c_ij w_j, neighbors in sorted order (one degree slot at a time)
        w_new = plan.self_weight * w[:, 0]
        for src, dst, c in slots:
            term = c * w_all.index_select(0, src)
            if dst is None:
                w_new.add_(term)
            else:
                w_new.index_add_(0, dst, term)
        w[:, 0] = w_new
        torch.div(s, w.to(x.dtype), out=x)


class CPP(CGT):
    r"""CPP: compressed push-pull gradient tracking over directed graphs (Song, Shi, Pu, Yan 2022).

    The model is pulled with row-stochastic weights ``r_ij = 1/(1 + |N_in(i)|)`` and the gradient
    tracker pushed with the topology's column-stochastic ``c_ij`` (``--weights push``); both
    travel through compressed channels (:mod:`gossip.core.channel`)::

        x̂, x̂_R = COMM_R(x);   ŷ, ŷ_C = COMM_C(y)
        x_i ← x_i − γ (x̂_i − x̂_R,i) − η y_i
        y_i ← y_i − γ (ŷ_i − ŷ_C,i) + ∇f_i(x_i^new) − ∇f_i(x_i^old)

    ``Σ_i y_i = Σ_i ∇f_i(x_i)`` at every round. Linear convergence to the exact optimum with
    unbiased compressors (quantizers); biased ones (top-k) fall outside its theory and can
    diverge. Same messages as C-GT: two compressed vectors per out-neighbor per round.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
        gamma: consensus step (default 1 uncompressed, 0.5 unbiased, 0.2 biased).
        alpha: public copies' step (default as gamma).
        error_feedback: as in C-GT.
    """

    name = "cpp"
    state_copies = 15
    needs = ("column", "double")
    arc_copies = False

    def validate(self, topology: Any, compressor: Any) -> None:
        check_column_stochastic(self.name, topology)
        super().validate(topology, compressor)

    def weights_x(self, node: Node) -> Weights | None:
        return pull_weights(node)
