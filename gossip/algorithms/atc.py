"""Adapt-then-combine (ATC): each node first takes its local step, then averages the results.

Three methods, each the existing one with its two operations in the other order:

* ``atc-dgd``: diffusion (Sayed), ``X ← W (X − η ∇F(X))``; D-PSGD (``dpsgd``) combines first.
* ``atc-diging``: ATC-DIGing / AugDGM, ``X ← W (X − η Y)``, ``Y ← W (Y + ∇F(X_new) − ∇F(X))``:
  both the model and the tracker are combined after adapting (two exchanges per round).
* ``next``: NEXT / SONATA, ``X ← W (X − η Y)``, ``Y ← W Y + ∇F(X_new) − ∇F(X)``: the model is
  adapted then combined, the tracker combined then corrected (one exchange, as DIGing's).

All three keep the core of the method they reorder (:class:`~gossip.algorithms.dpsgd.DPSGD`,
:class:`~gossip.algorithms.tracking.DIGing`): their channels, checks and hyper-parameters.
"""

from __future__ import annotations

from gossip.algorithms.dpsgd import DPSGD
from gossip.algorithms.tracking import DIGing
from gossip.core.algorithm import Round, scheduled
from gossip.core.block import Block


class ATCDGD(DPSGD):
    """Adapt-then-combine DGD (diffusion), ``X ← W (X − η ∇F(X))``; docs/algorithms/atc-dgd.md.

    Each node adapts, ``ψ_i = x_i − η ∇f_i(x_i)`` (its optimizer's step in training), sends
    ``ψ_i`` and combines, ``x_i ← ψ_i + γ (Σ_j w_ij ψ_j − ψ_i)``. One message per neighbor per
    round, as D-PSGD, whose order it reverses: the gradient is taken at the combined model, so
    it cannot overlap the exchange. With a constant step it stops at a point O(η) from x* on
    heterogeneous data (as D-PSGD does; the trackers remove that bias).

    Args:
        eta: step size, a number or a schedule ``eta(t)``. Default 0.1.
        gamma: relaxation of the combination (1 = plain ``W ψ``). Default 1.
    """

    name = "atc-dgd"
    overlaps = None  # x changes (the local step) before the send: nothing to overlap

    def step(self, block: Block) -> Round:
        g = block.gradients(block.workspace["grad"])
        block.local_step(g, scheduled(self.eta, block.round))  # adapt: ψ = x − η ∇f(x)
        inbox = yield block.workspace["channel"].send(block.x)
        self.mix(block, inbox)  # combine: x ← ψ + γ (W ψ − ψ)


class ATCDIGing(DIGing):
    r"""ATC-DIGing / AugDGM (Xu, Zhu, Soh, Xie 2015; Nedić, Olshevsky, Shi, Uribe 2017)::

        x_i ← Σ_j w_ij (x_j − η y_j)
        y_i ← Σ_j w_ij (y_j + ∇f_j(x_j^new) − ∇f_j(x_j^old))

    Setup ``y_i = ∇f_i(x_i⁰)``. The tracker's message needs the gradient at the combined model,
    so an iteration has two exchanges, one full vector each (DIGing sends both in one). A round
    here begins with the gradient at the model it starts from, as every tracker's does (so
    :func:`gossip.wrap` can hand it over): it sends and combines the tracker that gradient
    corrects, then ``x − η y``; round 1 only the latter (``y⁰`` needs no exchange).
    ``Σ_i y_i = Σ_i ∇f_i(x_i)`` at every round (W column stochastic), so the fixed point is the
    exact optimum. See docs/algorithms/atc-diging.md.

    Under message loss (``on_loss = "edge"``) an edge either of whose messages of a phase is
    lost sits that phase out at both ends: each phase's W stays symmetric and doubly
    stochastic, so the tracker keeps the sum of the gradients and the fixed point stays x*.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
    """

    name = "atc-diging"
    on_loss = "edge"  # each phase's W_t symmetric, doubly stochastic: Σ y = Σ ∇f is kept

    def step(self, block: Block) -> Round:
        x, st, ws = block.x, block.state, block.workspace
        sx, sy = ws["channels"]
        y, g, g_new = st["y"], st["g"], ws["g_new"]
        if block.round == 1:  # y⁰ = ∇f(x⁰): round 1 has the model's exchange only
            y.copy_(block.gradients(g))
        else:  # the last round's tracker step, at the model it ended with
            y.add_(block.gradients(g_new)).sub_(g)  # adapt: y + ∇f(x_new) − ∇f(x_old)
            g.copy_(g_new)
            (q,) = yield (sy.send(y),)
            y.add_(sy.gap(q))  # combine: y ← W (y + Δg)
        x.sub_(y, alpha=self.eta)  # adapt: x − η y
        (q,) = yield (sx.send(x),)
        x.add_(sx.gap(q))  # combine: x ← W (x − η y)


class NEXT(DIGing):
    r"""NEXT / SONATA with the linearized surrogate (Di Lorenzo, Scutari 2016; Sun, Scutari,
    Daneshmand 2022)::

        x_i ← Σ_j w_ij (x_j − η y_j)
        y_i ← Σ_j w_ij y_j + ∇f_i(x_i^new) − ∇f_i(x_i^old)

    Setup ``y_i = ∇f_i(x_i⁰)``. DIGing's round (one exchange of ``x`` and ``y``) with the
    tracker mixed before the descent step (:attr:`CGT.tracker_first`): ``W (x − η y) = W x −
    η W y``. See docs/algorithms/next.md. A lost message: as :class:`ATCDIGing` (``edge``).

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
    """

    name = "next"
    tracker_first = True
    on_loss = "edge"
