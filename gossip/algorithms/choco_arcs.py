"""CHOCO with a public copy per arc, robust to lost messages (docs/algorithms/choco-arcs.md).

CHOCO-SGD (gossip/algorithms/choco.py) keeps one public copy ``x̂_i`` per node that every
neighbor of i updates with i's increments; a lost increment leaves that neighbor's copy behind
the sender's for good, and the network's average drifts. Here every arc (i, j) has its own copy
``x̂_ij``, held by both i and j, and the increment ``q_ij`` is applied by both ends when it is
delivered and by neither when it is lost (the sender learns which, an acknowledgement in a real
network: here both ends read the same keyed draw, gossip/engine/loss.py's ``"ack"``). The two
ends never disagree, so a lost message only delays. One round::

    x_i ← x_i − η ∇f_i(x_i)                          (CHOCO-SGD only: when the node has an oracle)
    x_i ← x_i + γ Σ_j w_ij (x̂_ji − x̂_ij)             (x̂_ji: j's copy for arc (j, i), held by i)
    q_ij = C(x_i − x̂_ij) on every out-arc;  send q_ij to j
    delivered:  x̂_ij ← x̂_ij + q_ij at both ends;  lost: nothing

With ``W = Wᵀ`` the consensus step sums to zero over the nodes whatever was lost
(``Σ_i Σ_j w_ij (x̂_ji − x̂_ij)`` pairs every term with its negative), so the average of the x_i
moves only by the local steps. The price: every node keeps two copies per neighbor (its out-
and its in-arc's) instead of one, and sends one message per arc (a different one to each
neighbor) instead of one per node; each message is one compressed vector, as CHOCO's.

Runs as a block (gossip/core/block.py): the copies are the per-arc copies of a
:class:`~gossip.core.channel.Channel` with ``route="arcs"`` (the mechanism lead-arcs and
c-gt-arcs use too), ``block.arc_state`` rows per arc (``x_hat_to{j}``: node i's copy of arc
(i, j); ``x_hat_from{j}``: its copy of arc (j, i), the in-arcs' rows), the messages go out in
one per-arc phase, and a randomized compressor draws from the arc's stream
(``block.arc_rng``, keyed by the arc).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.algorithms.choco import Choco
from gossip.core.algorithm import Round, scheduled
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Requirements


class ChocoArcs(Choco):
    """CHOCO-Gossip / CHOCO-SGD with a public copy per arc, shared by its two ends.

    One round: ``x_i ← x_i − η ∇f_i(x_i)`` (with an oracle);
    ``x_i ← x_i + γ Σ_j w_ij (x̂_ji − x̂_ij)``; send ``q_ij = C(x_i − x̂_ij)`` on every arc
    (i, j); where it is delivered both ends add it, ``x̂_ij += q_ij``; where it is lost neither
    does. Needs a static undirected graph with a symmetric W (the average is then kept under
    any loss). See docs/algorithms/choco-arcs.md.

    Args:
        gamma: consensus step, > 0, as CHOCO's (the same checks: above 1 a warning, at or
            past ``2 / (1 − λ_min(W))`` refused; the same default rule from the compressor and
            the graph).
        eta: local step size or schedule (training uses the node's optimizer). Default 0.
    """
    name = "choco-arcs"
    state_copies = 4
    neighbor_copies = 4  # the out- and in-arc copies, the message scratch, the message rows
    overlaps = "next"  # after the send only the copies change
    requires = Requirements(
        compressor="stateless",
        compressor_message="{name} sends a different message on every arc; '{spec}' keeps state "
                           "per stream: use a stateless compressor (topk, randk, qsgd, sign, none)")
    on_loss = "ack"  # both ends apply a delivered q_ij, neither a lost one

    def __init__(self, gamma: float | None = None, eta: float | Callable[[int], float] = 0.0):
        super().__init__(gamma=gamma, eta=eta)

    def setup(self, block: Block) -> None:
        # x̂_ij (out-arcs, "x_hat_to{j}") and x̂_ji (in-arcs, "x_hat_from{j}"): per-arc copies
        # moving by the whole message at both ends of a delivered arc. The channel is named
        # "arc": a randomized compressor draws from the arcs' "arc" streams (block.arc_rng).
        alpha = self.resolve(block)  # γ's default; the copies' step (1/(1 + ω) if unbiased)
        block.workspace["channel"] = Channel(block, "arc", memory="choco" if alpha == 1.0 else alpha,
                                             route="arcs",
                                             keys=("x_hat_to{j}", "x_hat_from{j}"))
        if block.has_oracle:
            block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block: Block) -> Round:
        x, ws = block.x, block.workspace
        ch = ws["channel"]
        if block.has_oracle:
            block.local_step(block.gradients(ws["grad"]), scheduled(self.eta, block.round))
        # Σ_j w_ij x̂_ji − Σ_j w_ji x̂_ij, the copies as they are
        x.add_(ch.gap(), alpha=block.hparams["gamma"])
        q = yield ch.send(x)  # q_ij = C(x_i − x̂_ij) on every out-arc
        ch.update(q)  # delivered: x̂_ij += q_ij at i (acknowledged) and at j; lost: neither
