"""BEER with a public copy per arc, robust to lost messages (docs/algorithms/beer-arcs.md).

BEER (gossip/algorithms/beer.py) keeps two EF21 states per node that every neighbor rebuilds,
``h_i`` (of the model) and ``g_i`` (of the tracker), and their mixes ``sh_i = Σ_j w_ij h_j``,
``sg_i = Σ_j w_ij g_j``. A lost message leaves one receiver's ``sg`` without the sender's
increment while the sender's ``g_i`` has it: from then on ``sg − g`` is no longer
``(W − I)G`` of one G, ``Σ_i (sg_i − g_i) ≠ 0``, and the tracker's sum leaves
``Σ_i ∇f_i(x_i)``: the fixed point moves. Here every arc (i, j) has its own pair of states
``h_ij``, ``g_ij``, held by both ends and moved by both only when the message is delivered
(``δ_ij`` = 1; lost: 0, the engine's ``"ack"``). Setup: ``v_i = ∇f_i(x_i⁰)``, the copies 0,
``x_i ← x_i⁰ − η v_i``. Then each round::

    gn = ∇f_i(x_i);   v_i += γ D^g_i + gn − grad_prev_i;   grad_prev_i = gn
    send (C(x_i − h_ij), C(v_i − g_ij)) on every out-arc (i, j), one message
    h_ij += δ_ij C(x_i − h_ij);   g_ij += δ_ij C(v_i − g_ij)          (at i and at j)
    x_i += γ D^h_i − η v_i

with ``D^h_i = Σ_j w_ij h_ji − Σ_j w_ji h_ij`` (in-arcs' copies minus out-arcs' copies, the
copies as they are: ``D^g`` before this round's message, ``D^h`` after it, BEER's order).

**The tracker's sum is kept exactly: Σ_i v_i = Σ_i ∇f_i(x_i) (the last gradients) under any
loss.** Every arc's copy ``g_ij`` enters ``D^g_j`` with ``+w_ji`` and ``D^g_i`` with
``−w_ji``, and both ends hold the same copy (same message, same delivery bit), so
``Σ_i D^g_i = 0`` whatever was lost; the setup makes ``Σ v = Σ ∇f(x⁰)`` and each round adds
``Σ (gn − grad_prev)``. Likewise ``Σ_i D^h_i = 0``: the model's average moves by ``−η v̄``
only. At a fixed point the copies stop moving, so (a contractive compressor: ``C(z) = 0`` only
for ``z = 0``, and every arc delivered now and then) ``h_ij = x_i`` and ``g_ij = v_i``;
``D^g = (W − I)V = 0`` makes V consensual, equal to its mean ``(1/n) Σ_i ∇f_i(x_i)``; summing
the model's step, ``0 = −η Σ_i v_i`` gives ``v = 0``, then ``(W − I)X = 0`` makes X consensual,
``x``, with ``Σ_i ∇f_i(x) = 0``: ``x = x*``, BEER's fixed point, whatever was lost.

**Without loss it is BEER.** Every arc of node i draws node i's numbers (``draws="sender"``),
so its out-copies receive the same compressed difference and stay equal to BEER's ``h_i``,
``g_i``; the in-copies are the neighbors' states, and ``D_i`` is
``Σ_j w_ij h_j − (1 − w_ii) h_i = sh_i − h_i`` with W doubly stochastic: BEER's iterates up to
the order of the sums.

The price: ``4·deg`` model-sized copies per node instead of ``h, sh, g, sg`` (4), and one
message per arc (a different one to each neighbor once losses make the copies differ) instead
of one broadcast; each message is two compressed vectors, so the bits are BEER's. Both states
run as per-arc copies of a :class:`~gossip.core.channel.Channel` (``route="arcs"``): the
mechanism of choco-arcs, lead-arcs and c-gt-arcs.
"""

from __future__ import annotations

from gossip.algorithms.beer import BEER
from gossip.core.block import Block
from gossip.core.channel import Channel
from gossip.core.requirements import Requirements


class BEERArcs(BEER):
    """BEER with the EF21 states ``h`` (model) and ``g`` (tracker) kept per arc and updated at
    both ends only on delivery.

    ``v_i += γ D^g_i + ∇f_i(x_i) − ∇f_i(x_i^prev)``; send ``(C(x_i − h_ij), C(v_i − g_ij))``
    on every arc; where delivered both ends add it to ``h_ij``, ``g_ij`` (lost: neither);
    ``x_i += γ D^h_i − η v_i``, ``D_i`` the in-arcs' copies minus the out-arcs' weighted by W.
    Needs a static undirected graph with a symmetric W (the tracker's sum is then kept under
    any loss) and a stateless compressor. See docs/algorithms/beer-arcs.md.

    Args:
        eta: step size (constant); ``0.2/L`` converges. Default 0.05.
        gamma: mixing step in (0, 1]. Default 0.4.
    """
    name = "beer-arcs"
    state_copies = 9
    neighbor_copies = 10  # per channel: out- and in-arc copies, the differences, the messages
    requires = Requirements(
        gradients=True, compressor="stateless",
        compressor_message="{name} sends a different message on every arc; '{spec}' keeps state "
                           "per stream: use a stateless compressor (topk, randk, qsgd, lead, none)")
    on_loss = "ack"  # both ends apply a delivered message, neither a lost one

    def channels(self, block: Block) -> tuple[Channel, Channel]:
        """The model's and the tracker's per-arc copies (``block.arc_state`` ``"h_to{j}"``,
        ``"h_from{j}"``, ``"g_to{j}"``, ``"g_from{j}"``: node i's out- and in-arcs), moving by
        the whole message (EF21), drawing the sender's numbers (the tracker's from its own
        stream, as BEER's)."""
        return (Channel(block, "x", memory="ef21", route="arcs", draws="sender",
                        keys=("h_to{j}", "h_from{j}")),
                Channel(block, "tracker", memory="ef21", route="arcs", draws="sender",
                        keys=("g_to{j}", "g_from{j}"), own_compressor=True))
