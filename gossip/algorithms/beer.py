"""BEER (Zhao et al. NeurIPS'22; docs/algorithms/beer.md): gradient tracking with EF21-style states.

Both the model and the gradient tracker travel as compressed differences against states
``h`` (for x) and ``g`` (for v) that neighbors rebuild; ``sh = Σ_j w_ij h_j`` and
``sg = Σ_j w_ij g_j``. One round (one message carrying both differences)::

    gn = ∇f_i(x_i);  v_i += γ (sg_i − g_i) + gn − grad_prev_i;  grad_prev_i = gn
    send [qh_i = C(x_i − h_i), qg_i = C(v_i − g_i)];  h_i += qh_i;  sh_i += Σ_{j∈N_i⁺} w_ij qh_j;
        same for g, sg
    x_i += γ (sh_i − h_i) − η v_i

Setup: h = g = 0, v = grad_prev = ∇f_i(x⁰), then the model's first step x¹ = x⁰ − η v. The
paper's iteration starts with the model's step; a round here ends with it, so that it starts
with the gradient at the model it holds (what :func:`gossip.wrap` hands over): the same
iterates, the model after round t being the paper's x^{t+1}. Contractive compressors; the mean
of v tracks the mean of the last gradients exactly (needs a doubly stochastic W).

Robust per arc (``arcs``, registered as ``beer-arcs``, docs/algorithms/beer-arcs.md): both states
are kept per arc, ``h_ij`` and ``g_ij`` at both ends, moved by both only when the arc's message
was delivered; ``sh − h`` becomes ``Σ_j w_ij h_ji − Σ_j w_ji h_ij``, whose sum over the nodes is
zero whatever was lost (W symmetric), so ``Σ_i v_i = Σ_i ∇f_i(x_i)`` and the fixed point stays
x*. Every arc draws its sender's numbers, so without loss the run is BEER's to rounding.
"""

from __future__ import annotations

import torch

from gossip.core.algorithm import Algorithm, ArcsForm, Round, check_range
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Requirements


class BEER(Algorithm):
    """BEER: gradient tracking with compressed, EF21-style states for the model and tracker.

    ``v_i += γ (sg_i − g_i) + ∇f_i(x_i) − ∇f_i(x_i^prev)``; one message carries
    ``C(x_i − h_i)`` and ``C(v_i − g_i)``; then ``x_i += γ (sh_i − h_i) − η v_i``. See
    docs/algorithms/beer.md. With its ``arcs`` option (``beer-arcs``) both states are kept
    per arc and moved at both ends only on delivery, which keeps the tracker's sum under any
    loss (docs/algorithms/beer-arcs.md).

    Args:
        eta: step size (constant); ``0.2/L`` converges. Default 0.05.
        gamma: mixing step in (0, 1]. Default 0.4.
    """
    name = "beer"
    state_copies = 11
    trains = True
    requires = Requirements(gradients=True)
    step_rule = "tracking"
    on_loss = "drop"  # both messages increment copies (h, g): a lost one is missed
    arcs_form = ArcsForm(  # per channel: out- and in-arc copies, the differences, the messages
        state_copies=9, neighbor_copies=10,
        requires=Requirements(
            gradients=True, compressor="stateless",
            compressor_message="{name} sends a different message on every arc; '{spec}' keeps "
                               "state per stream: use a stateless compressor (topk, randk, qsgd, "
                               "lead, none)"))

    def __init__(self, eta: float = 0.05, gamma: float = 0.4):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.2/L to 0.5/L.")
        check_range("gamma", gamma, 0.0, 1.0, "BEER's mixing step; 0.2-0.8 in the references.")
        self.eta = eta
        self.gamma = gamma

    def setup(self, block: Block) -> None:
        x = block.x
        block.workspace["channels"] = self.channels(block)
        block.state.update(v=torch.empty_like(x), grad_prev=torch.empty_like(x))
        block.workspace["grad"] = torch.empty_like(x)
        block.gradients(block.state["v"])
        block.state["grad_prev"].copy_(block.state["v"])
        self.move(block)  # x¹ = x⁰ − η v (the states are still zero)

    def channels(self, block: Block) -> tuple[Channel, Channel]:
        """The model's and the tracker's EF21 states: ``h`` and the gap ``sh − h`` (``sh = Σ_j
        w_ij h_j``) for x (the main compressor) and ``g``, ``sg − g`` for v (its own instance
        ``"tracker"``: stateful compressors keep one state per stream); per arc (``arcs``)
        ``block.arc_state`` ``"h_to{j}"``, ``"h_from{j}"``, ``"g_to{j}"``, ``"g_from{j}"``
        (node i's out- and in-arcs), every arc drawing its sender's numbers (the tracker's
        from its own stream)."""
        return (Channel(block, "x", memory="ef21", keys=("h", "h_gap"),
                        route=self.route(keys=("h_to{j}", "h_from{j}"), draws="sender")),
                Channel(block, "tracker", memory="ef21", keys=("g", "g_gap"), own_compressor=True,
                        route=self.route(keys=("g_to{j}", "g_from{j}"), draws="sender")))

    def move(self, block: Block) -> None:
        """The model's step ``x += γ (sh − h) − η v``, with the states the last messages built."""
        cx, _ = block.workspace["channels"]
        block.x.add_(cx.gap(), alpha=self.gamma).sub_(block.state["v"], alpha=self.eta)

    def estimate(self, block: Block, grad: torch.Tensor, prev: torch.Tensor) -> None:
        """Turn the fresh gradients (rows) into the tracked quantity, in place (BEER: the gradients)."""

    def step(self, block: Block) -> Round:
        x, st, gamma = block.x, block.state, self.gamma
        v, gn, gp = st["v"], block.workspace["grad"], st["grad_prev"]
        cx, cv = block.workspace["channels"]
        self.estimate(block, block.gradients(gn), gp)
        v.add_(cv.gap(), alpha=gamma).add_(gn).sub_(gp)  # v += γ (sg − g) + gn − grad_prev
        gp.copy_(gn)
        # one message carries both: qh = C(x − h) (main stream), qg = C(v − g) (the tracker's)
        qh, qg = yield cx.send(x), cv.send(v)
        cx.update(qh)  # h += qh;  sh += Σ_j w_ij qh_j
        cv.update(qg)
        self.move(block)
