"""Gradient tracking: DIGing, C-GT (compressed, optionally with error feedback) and EXTRA.

All three reach the exact optimum of a strongly convex sum with a constant step, on
heterogeneous data, because each node follows a tracker ``y_i`` of the average gradient (or,
for EXTRA, a correction built from the last two iterates) instead of its own gradient.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from gossip.core.algorithm import Algorithm, ArcsForm, Round, check_range
from gossip.core.channel import Channel, Weights, check_stateless
from gossip.core.compensated import CompensatedSum
from gossip.core.nodes import Node
from gossip.core.requirements import Graph, Requirements
from gossip.errors import ConfigError


def compression_defaults(compressor: Any) -> float:
    """The consensus step and state momentum (γ = α) that converge for a compressor class.

    identity: 1 (the uncompressed method); unbiased quantizers: 0.5; biased ones (top-k,
    sign, low-rank): 0.2 (the values measured on heterogeneous least squares).
    """
    if compressor.is_identity:
        return 1.0
    return 0.5 if compressor.unbiased else 0.2


def stochastic_kind(topology: Any) -> str:
    """'double', 'column' or 'row': what the topology's matrices sum to one along."""
    return getattr(topology, "stochastic", "double")


class CGT(Algorithm):
    r"""C-GT: gradient tracking with compressed model and tracker (Liao, Li, Huang, Pu 2022).

    Each node keeps its model ``x_i``, a tracker ``y_i`` of the average gradient and the last
    gradient ``g_i``; both ``x`` and ``y`` travel through compressed channels (public copies
    ``h`` with mixed copies ``Σ_j w_ij h_j``, see :mod:`gossip.core.channel`). One round,
    one message carrying two compressed vectors::

        x̂, x̂_w = COMM_W(x);   ŷ, ŷ_w = COMM_W(y)
        x_i ← x_i − γ (x̂_i − x̂_w,i) − η y_i
        g_new = ∇f_i(x_i);   y_i ← y_i − γ (ŷ_i − ŷ_w,i) + g_new − g_i;   g_i ← g_new

    Start: ``y_i = g_i = ∇f_i(x_i⁰)``, copies zero. The mean of ``y`` equals the mean of ``g``
    at every round (W doubly stochastic), which is why the fixed point is the exact optimum.
    With the identity compressor and γ = 1 this is DIGing, ``x ← W x − η y``,
    ``y ← W y + Δg``.

    A round here begins with the gradient at the model it starts from: it ends the last
    round's tracker update with ``g_new − g_i`` (round 1: ``y = g = ∇f(x⁰)``), then sends and
    moves ``x`` and ``y`` by their gaps. The iterates are the ones above, each gradient taken
    at the model a round starts from, as :func:`gossip.wrap` hands them over.

    On a time-varying graph (one-peer exponential, matchings) the copies cannot be mixed with a
    fixed W; each node then keeps one copy per arc (a channel with ``route="arcs"``)
    and ``x̂_w − x̂`` becomes ``Σ_in w_ij c_ji − Σ_out w_ji o_ij``, whose sum over nodes is zero
    for any compressor, so ``Σ y = Σ g`` still holds. One message per current out-neighbor.

    With its ``arcs`` option (``c-gt-arcs``, docs/algorithms/c-gt-arcs.md) both channels keep a
    copy per arc on a static undirected graph too, moved by α at both ends only when the arc's
    message was delivered, every arc drawing its sender's numbers: ``Σ_i y_i = Σ_i ∇f_i(x_i)``
    holds under any loss, and without loss the run is C-GT's to rounding.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
        gamma: consensus step γ ∈ (0, 1] (default by compressor: 1 uncompressed, 0.5 unbiased,
            0.2 biased).
        alpha: how far the public copies follow the reconstructed values, α ∈ [0, 1] (default
            as gamma). 0 sends each vector compressed with no memory.
        error_feedback: the error-feedback form for biased compressors such as top-k: the
            copies move by the whole message (α = 1, EF21-style), so what the compressor drops
            stays in ``x − h`` and is sent later. Cannot be combined with another alpha.
    """

    name = "c-gt"
    state_copies = 15
    trains = True
    requires = Requirements(graph=Graph(static=False, symmetric=False), gradients=True)
    tunable = ("gamma",)
    arc_copies = True
    needs: tuple[str, ...] = ("double",)
    step_rule = "tracking"
    on_loss = "drop"  # both messages increment copies (x̂, ŷ): a lost one is missed
    tracker_first = False
    """Mix the tracker before the descent step, ``x ← W x − η W y = W (x − η y)`` (the
    adapt-then-combine order of NEXT/SONATA, :class:`gossip.algorithms.atc.NEXT`); False: the
    descent uses the unmixed tracker, ``x ← W x − η y`` (DIGing, C-GT)."""
    arcs_form = ArcsForm(  # per channel: out- and in-arc copies, reconstructions, differences
        state_copies=10, neighbor_copies=10,
        requires=replace(
            requires, graph=Graph(), compressor="stateless",
            compressor_message="{name} sends a different message on every arc; '{spec}' keeps "
                               "state per stream: use a stateless compressor (topk, randk, qsgd, "
                               "lead, none)"))

    def __init__(self, eta: float = 0.05, gamma: float | None = None, alpha: float | None = None,
                 error_feedback: bool = False):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.1/L to 0.5/L.")
        if gamma is not None:
            check_range("gamma", gamma, 0.0, 1.0, "The consensus step; 0.2-0.5 with compression.")
        if alpha is not None and not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha = {alpha} is outside [0, 1]; 0.5 for quantizers, 0.2 for top-k.")
        if error_feedback and alpha not in (None, 1.0):
            raise ConfigError(f"error_feedback moves the copies by the whole message (alpha = 1); "
                              f"got alpha = {alpha}: drop one of the two")
        self.eta = eta
        self.gamma = gamma
        self.alpha = 1.0 if error_feedback else alpha
        self.error_feedback = bool(error_feedback)

    def validate(self, topology: Any, compressor: Any) -> None:
        kind = stochastic_kind(topology)
        if kind not in self.needs:
            raise ConfigError(
                f"{self.name} needs a {' or '.join(self.needs)}-stochastic mixing matrix, but "
                f"'{topology.name}' has a {kind}-stochastic one; "
                + ("use --weights metropolis (or an undirected graph), or cpp for directed graphs "
                   "with unequal degrees" if "double" in self.needs and len(self.needs) == 1
                   else "use --weights push (column-stochastic)")
            )
        arcs = self._per_arc(topology, self._resolved(compressor)["alpha"])
        if arcs and not self.arc_copies:
            raise ConfigError(
                f"{self.name} keeps copies mixed with a fixed matrix, but '{topology.name}' "
                "changes every round; use a static graph, or c-gt (per-arc copies)"
            )
        if arcs:
            check_stateless(self.name, compressor)

    def _resolved(self, compressor: Any) -> dict[str, float]:
        """γ and α, the unset ones defaulted from the compressor."""
        default = compression_defaults(compressor)
        return {"gamma": default if self.gamma is None else self.gamma,
                "alpha": default if self.alpha is None else self.alpha}

    @staticmethod
    def _per_arc(topology: Any, alpha: float) -> bool:
        """Copies kept per arc: a graph that changes every round, and copies that move."""
        return bool(getattr(topology, "time_varying", False)) and alpha > 0

    def weights_x(self, node: Node) -> Weights | None:
        """Mixing weights of the model stream (None: the topology's w_ij)."""
        return None

    def weights_y(self, node: Node) -> Weights | None:
        """Mixing weights of the tracker stream (None: the topology's w_ij)."""
        return None

    def _channels(self, block: Any, alpha: float) -> tuple[Channel, Channel]:
        """The model's channel ``sx`` (main compressor) and the tracker's ``sy`` (its own): per-arc
        copies on a time-varying graph (α > 0; they move by the whole message), else public
        copies moving by α, per arc in the ``arcs`` form (``block.arc_state`` ``"sx.out"``,
        ``"sx.in"``, ``"sy.out"``, ``"sy.in"``; every arc drawing its sender's numbers)."""
        if block.workspace["per_arc"]:
            return (Channel(block, "sx", memory="ef21", route="arcs"),
                    Channel(block, "sy", memory="ef21", route="arcs", own_compressor=True))
        route = self.route(draws="sender")
        return (Channel(block, "sx", memory=alpha, weights=self.weights_x, route=route),
                Channel(block, "sy", memory=alpha, weights=self.weights_y, own_compressor=True,
                        route=route))

    def setup(self, block: Any) -> None:
        x, st, hp = block.x, block.state, block.hparams
        hp.update(self._resolved(block.compressor))
        block.workspace["per_arc"] = self._per_arc(block.topology, hp["alpha"])
        # the copies go to block.state (or block.arc_state)
        block.workspace["channels"] = self._channels(block, hp["alpha"])
        st["g"] = torch.zeros_like(x)
        st["y"] = torch.zeros_like(x)  # round 1 sets both to ∇f(x⁰)
        block.workspace["g_new"] = torch.empty_like(x)

    def local_gradients(self, block: Any, out: torch.Tensor) -> torch.Tensor:
        """What the tracker follows, at the models a round starts from, into ``out``'s rows:
        every node's gradient here; a variance-reduced estimate in ``gt-saga`` and
        ``gt-sarah`` (:mod:`gossip.algorithms.gt_vr`)."""
        return block.gradients(out)

    def step(self, block: Any) -> Round:
        x, st, ws, gamma = block.x, block.state, block.workspace, block.hparams["gamma"]
        sx, sy = ws["channels"]
        y, g, g_new = st["y"], st["g"], ws["g_new"]
        if block.round == 1:
            y.copy_(self.local_gradients(block, g))
        else:  # y ← y + γ (ŷ_w − ŷ) + g_new − g, the first term added last round
            y.add_(self.local_gradients(block, g_new)).sub_(g)
            g.copy_(g_new)
        qx, qy = yield sx.send(x), sy.send(y)
        dx, dy = sx.gap(qx), sy.gap(qy)  # x̂_w − x̂, ŷ_w − ŷ: the compressed (W − I)x, (W − I)y
        if self.tracker_first:  # NEXT/SONATA (gossip.algorithms.atc): x ← W x − η W y
            y.add_(dy, alpha=gamma)
            x.add_(dx, alpha=gamma).sub_(y, alpha=self.eta)
        else:
            x.add_(dx, alpha=gamma).sub_(y, alpha=self.eta)
            y.add_(dy, alpha=gamma)


class DIGing(CGT):
    r"""DIGing / gradient tracking, uncompressed (Nedić, Olshevsky, Shi 2017)::

        x_i ← Σ_j w_ij x_j − η y_i
        y_i ← Σ_j w_ij y_j + ∇f_i(x_i^new) − ∇f_i(x_i^old)

    Setup ``y_i = ∇f_i(x_i⁰)``. Two full vectors per neighbor per round (one message). It keeps
    no per-neighbor state, so it runs on time-varying graphs (one-peer exponential) as well as
    on directed graphs with a doubly stochastic W.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
    """

    name = "diging"
    state_copies = 15
    requires = replace(
        CGT.requires, compressor="identity",
        compressor_message="diging sends uncompressed vectors but the compressor is '{spec}'; use "
                           "--compressor none, or c-gt for compressed gradient tracking")
    tunable = ()

    def __init__(self, eta: float = 0.05):
        super().__init__(eta=eta, gamma=1.0, alpha=0.0)

    def hparams(self) -> dict[str, Any]:
        return {"eta": self.eta}


class EXTRA(Algorithm):
    r"""EXTRA (Shi, Ling, Wu, Yin 2015), uncompressed; ``W̃ = (I + W)/2``::

        x¹ = W x⁰ − η ∇f(x⁰)
        x^{k+1} = x^k + W x^k − W̃ x^{k−1} − η (∇f(x^k) − ∇f(x^{k−1}))

    run in its equivalent dual form (the same iterates in exact arithmetic)::

        x^{k+1} = x^k + (W − I) x^k − η ∇f(x^k) + d^k;    d^{k+1} = d^k + (W − I) x^k / 2

    with ``d⁰ = 0``: the recursion as written cancels terms of the size of ``x`` every round and
    carries their roundings forward forever (in float32 the distance to x* crept back up as t²
    after converging), while ``d`` grows only by the gap, which vanishes at the optimum, summed
    in a wider dtype and accumulated with compensation (docs/algorithms/extra.md). Per node:
    ``x`` and ``d``; one full vector per neighbor per round. Needs a symmetric, doubly
    stochastic, static W.

    Under message loss (``on_loss = "edge"``, docs/network.md) an edge either of whose messages
    is lost drops out of the round's W at both ends (its weight goes to both own terms): each
    ``W_t`` is symmetric and doubly stochastic, so ``Σ_i x_i`` still moves by ``−η Σ_i ∇f_i``
    alone (the sums of ``W x`` and ``W̃ x`` telescope), and a consensual point is fixed by every
    ``W_t``: the fixed point stays the exact optimum. Renormalizing at the receiver alone would
    break the column sums and move it.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.9 (1 + λ_min)/L, step rule "dgd").
    """

    name = "extra"
    on_loss = "edge"  # a lost message drops its edge at both ends: W_t stays doubly stochastic
    state_copies = 11
    requires = Requirements(
        gradients=True, compressor="identity",
        compressor_message="extra sends uncompressed vectors but the compressor is '{spec}'; use "
                           "--compressor none, or lead / c-gt for compressed exact methods")
    trains = True
    step_rule = "dgd"

    def __init__(self, eta: float = 0.05):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.5/L (EXTRA diverges near 1/L on some graphs).")
        self.eta = eta

    def setup(self, block: Any) -> None:
        block.workspace["channel"] = Channel(block, "sx")  # memoryless: W x from this round's x
        block.state["d"] = torch.zeros_like(block.x)
        block.workspace.update(dual=CompensatedSum(block, "d"), g=torch.empty_like(block.x))

    def step(self, block: Any) -> Round:
        x, ws = block.x, block.workspace
        g = block.gradients(ws["g"])
        (q,) = yield (ws["channel"].send(x),)  # one part, framed as a packed message
        gap = ws["channel"].gap(q)  # (W − I) x
        x.add_(gap).sub_(g, alpha=self.eta).add_(block.state["d"])  # x + (W − I)x − ηg + d
        ws["dual"].add_(gap, alpha=0.5)  # d += (W − W̃) x = (W − I) x / 2

