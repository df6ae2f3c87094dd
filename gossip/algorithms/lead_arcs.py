"""LEAD with a public copy per arc, robust to lost messages (docs/algorithms/lead-arcs.md).

LEAD (gossip/algorithms/lead.py) keeps one state ``h_i`` per node that every neighbor rebuilds
from i's messages, and ``hw_i = Σ_j w_ij h_j``. A lost ``q_i`` leaves one receiver's ``hw``
without it while the sender's ``h_i`` has it: from then on ``ŷw_i − ŷ_i`` is no longer the
``((W − I)Ŷ)_i`` of one Ŷ, the dual sum ``Σ_i d_i`` leaves 0 and the fixed point moves (LEAD
ends at distance 1.9 from x* at 1 % loss, docs/network.md). Here every arc (i, j) has its own
state ``h_ij``, held by both ends and moved by both only when the message is delivered
(``δ_ij`` = 1; lost: 0, the engine's ``"ack"``). First (no communication):
``x_i ← x_i⁰ − η ∇f_i(x_i⁰)``. Then each round::

    g = ∇f_i(x_i);   y_i = x_i − η g − η d_i
    q_ij = C(y_i − h_ij) on every out-arc (i, j);  send q_ij to j
    ŷ_ij = h_ij + δ_ij q_ij;   h_ij ← (1 − α) h_ij + α ŷ_ij          (at i and at j)
    d_i ← d_i + γ_dual/(2η) (Σ_j w_ji ŷ_ij − Σ_j w_ij ŷ_ji)          (= + γ_dual/(2η) ((I − W)Ŷ)_i)
    x_i ← x_i − η g − η d_i                                       (same g, new d)

**The dual sum is kept exactly.** Every arc's ``ŷ_ij`` enters ``d_i``'s increment with
``+w_ji`` and ``d_j``'s with ``−w_ji``, and both ends hold the same ``ŷ_ij`` (same copy, same
delivery bit), so ``Σ_i d_i`` stays 0 (its start) whatever was lost. At a fixed point every
copy equals its sender's ``y_i`` (a copy still receiving messages moves), the increment of d
is ``((I − W)Y)_i = 0``, so Y is consensual, ``x_i = y_i``, ``d_i = −∇f_i(x)`` and
``Σ_i ∇f_i(x) = −Σ_i d_i = 0``: x = x*, LEAD's fixed point, whatever was lost.

**Without loss it is LEAD.** Every arc of node i draws node i's numbers (``draws="sender"``),
so its out-copies receive the same ``C(y_i − h_ij)`` of the same difference and stay equal to
LEAD's ``h_i``; the in-copies are the neighbors' ``h_j``, and the sum above is
``Σ_j w_ij ŷ_j − (1 − w_ii) ŷ_i`` with W doubly stochastic: LEAD's iterates up to the order of
the sums (tested to 1e-12, with ``lead:2`` too).

The price: ``2·deg`` model-sized copies per node instead of ``h, hw`` (2), and one message per
arc (a different one to each neighbor once losses make the copies differ) instead of one
broadcast; each message is one compressed vector, so the bits are LEAD's. The state runs as
per-arc copies of a :class:`~gossip.core.channel.Channel` (``route="arcs"``): the mechanism
c-gt-arcs uses too.
"""

from __future__ import annotations

from typing import Any

from gossip.algorithms.lead import LEAD
from gossip.core.block import Block
from gossip.core.channel import Channel, check_stateless
from gossip.core.requirements import Requirements


class LEADArcs(LEAD):
    """LEAD with the state ``h`` kept per arc and updated at both ends only on delivery.

    ``y_i = x_i − η g − η d_i``; send ``q_ij = C(y_i − h_ij)`` on every arc; where delivered,
    ``ŷ_ij = h_ij + q_ij`` at both ends (lost: ``ŷ_ij = h_ij``) and ``h_ij`` moves by α towards
    it; ``d_i += γ_dual/(2η) (Σ_j w_ji ŷ_ij − Σ_j w_ij ŷ_ji)``; ``x_i ← x_i − η g − η d_i``.
    Needs a static undirected graph with a symmetric W (the dual sum is then kept under any
    loss). See docs/algorithms/lead-arcs.md.

    Args:
        eta: step size (constant); ``1/L`` converges. Default 0.1.
        alpha: state momentum α in (0, 1]; default from the compressor's ω (as LEAD).
        gamma_dual: dual step in (0, 1]; default from ω and the graph's β (as LEAD).
    """
    name = "lead-arcs"
    state_copies = 8
    neighbor_copies = 5  # out- and in-arc copies, their reconstructions, the differences
    requires = Requirements(
        gradients=True, compressor="bounded-variance",
        compressor_message="{name} needs an unbiased compressor of bounded variance (or a "
                           "contractive one) and sends a different message on every arc; "
                           "'{spec}' is neither: use lead:2, qsgd, randk, topk or none")
    on_loss = "ack"  # both ends apply a delivered q_ij, neither a lost one

    def validate(self, topology: Any, compressor: Any) -> None:
        check_stateless(self.name, compressor)

    def channel(self, block: Block, alpha: float) -> Channel:
        """``y``'s per-arc copies ``h_ij`` (``block.arc_state`` ``"h_to{j}"``: node i's
        out-arcs, ``"h_from{j}"``: its in-arcs), damped by α, drawing the sender's numbers."""
        return Channel(block, "y", memory=alpha, route="arcs", draws="sender",
                       keys=("h_to{j}", "h_from{j}"))
