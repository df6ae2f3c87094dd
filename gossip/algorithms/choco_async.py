"""Asynchronous CHOCO: compressed pairwise averaging with a public copy per arc
(docs/algorithms/async-choco.md).

CHOCO-Gossip's idea (Koloskova et al. ICML'19) on randomized pairwise gossip's clocks (Boyd et
al. 2006). Every arc i → j has a copy ``x̂_ij`` of x_i that i and j both keep; only compressed
differences travel. When node i's Poisson clock rings it picks a random neighbor j and::

    x_i ← x_i − η ∇f_i(x_i)                          (with gradients: i's local step)
    q_ij = C(x_i − x̂_ij),  q_ji = C(x_j − x̂_ji)       exchanged; each delivered one is added
    x̂_ij ← x̂_ij + q_ij,    x̂_ji ← x̂_ji + q_ji         to the copy at both ends (acknowledged)
    x_i ← x_i + (γ/2)(x̂_ji − x̂_ij),   x_j ← x_j − (γ/2)(x̂_ji − x̂_ij)

The pair's two updates cancel, so Σ_i x_i is kept (gradient steps aside) whatever the
compressor and whatever the network loses: a lost message leaves both ends' copy of that arc as
it was, so they never disagree. With ``--compressor none`` and γ = 1 it is pairwise gossip once
the copies have caught up. A close relative of SwarmSGD's quantized pairwise averaging
(Nadiradze et al. 2021), which averages the pair's quantized models instead of keeping copies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gossip.core.activation import Activation, Message
from gossip.core.algorithm import Asynchronous, check_range, scheduled
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements
from gossip.rng import Stream


class AsyncChoco(Asynchronous):
    """Asynchronous CHOCO: on i's clock, a pair (i, j) exchanges ``q = C(x − x̂)`` against its
    per-arc copies and moves ``x_i, x_j`` by ``±(γ/2)(x̂_ji − x̂_ij)``. See
    docs/algorithms/async-choco.md.

    Args:
        gamma: consensus step in (0, 2); 1 is pairwise averaging with exact messages. Tune it
            for a lossy compressor (as CHOCO's γ). Default 0.5.
        eta: step size or schedule of the activated node's local step. Default 0.
    """

    name = "async-choco"
    clock = "poisson"
    trains = True
    takes_optimizer = True
    step_schedule = True
    step_rule = "dgd"
    state_copies = 4
    neighbor_copies = 2
    tunable = ("gamma",)
    requires = Requirements(graph=Graph(static=True, symmetric=True), compressor="stateless")

    def __init__(self, gamma: float = 0.5, eta: float | Callable[[int], float] = 0.0):
        check_range("gamma", gamma, 0.0, 2.0, "the consensus step of the pair's update.",
                    include_high=False)
        check_range("eta", eta, 0.0, float("inf"), "the step size of the local SGD steps.",
                    include_low=True)
        self.gamma = gamma
        self.eta = eta

    def setup(self, block: Block) -> None:
        route = block.arc_plan()
        d = block.x.shape[1]
        # node i's copies of each arc (i, j) it has: x̂_ij (what j holds of it) and x̂_ji
        block.arc_state["x_hat_out"] = block.x.new_zeros(len(route.arcs), d)
        block.arc_state["x_hat_in"] = block.x.new_zeros(len(route.arcs), d)
        ws = block.workspace
        ws["arc"] = {a: e for e, a in enumerate(route.arcs)}
        ws["rng"] = {}
        comp = block.compressor
        ws["fixed"] = comp.fixed_nbytes(block.x[0]) if block.m else None
        ws["size"] = comp.max_nbytes(block.x[0]) if block.m else 0
        if block.has_oracle:
            ws["grad"] = torch.empty_like(block.x)

    def activate(self, block: Block, event: Activation) -> None:
        if block.has_oracle:
            grad = block.workspace["grad"]
            block.gradients(grad, rows=[event.row])
            block.local_step(grad, scheduled(self.eta, block.round), rows=[event.row])
        if event.peer is None:
            return
        parts, q = self._message(block, event.node, event.peer, event.row, event.seq)
        reply = event.exchange(*parts)  # q_ij to j; j's reply carries q_ji
        if reply is not None:
            self._update(block, event.node, event.peer, event.row, q, reply.acked, reply.parts)

    def rejoin(self, block: Block, node: int, x0: torch.Tensor) -> None:
        """A fresh node starts from x⁰ with zero copies, and its neighbors zero their copies of
        its arcs too (the reconnection's handshake), so both ends agree again."""
        super().rejoin(block, node, x0)
        for (i, j), e in block.workspace["arc"].items():
            if node in (i, j):
                block.arc_state["x_hat_out"][e].zero_()
                block.arc_state["x_hat_in"][e].zero_()

    def message_like(self, block: Block, row: int) -> tuple[torch.Tensor, ...]:
        ws = block.workspace
        size = ws["fixed"] if ws["fixed"] is not None else 8 + ws["size"]
        return (torch.zeros(size, dtype=torch.uint8),)

    def receive(self, block: Block, message: Message) -> None:
        """j's end of i's exchange: reply with ``q_ji`` (from x_j as it is), then update."""
        i, j, r = message.src, message.dst, message.row
        parts, q = self._message(block, j, i, r, message.seq)
        acked = message.reply(*parts)
        self._update(block, j, i, r, q, acked, message.parts)

    def _message(self, block: Block, node: int, peer: int, row: int,
                 seq: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """``C(x_i − x̂_ij)`` for arc node → peer: its bytes as sent (keyed randomness: the
        node's stream at activation ``seq``; a compressor of varying size is padded to its
        maximum behind an 8-byte length) and its decoded value."""
        ws, comp = block.workspace, block.nodes[row].compressor
        rng = ws["rng"].get(node)
        if rng is None:
            rng = ws["rng"][node] = Stream(block.seed, [node], "async.q")
        rng.begin_round(seq)
        e = ws["arc"][(node, peer)]
        payload = comp.encode(block.x[row] - block.arc_state["x_hat_out"][e], rng)
        q = comp.decode(payload)
        if ws["fixed"] is not None:
            return (payload.to_bytes(),), q
        buf = torch.zeros(8 + ws["size"], dtype=torch.uint8)
        buf[:8].view(torch.int64)[0] = payload.nbytes
        buf[8 : 8 + payload.nbytes] = payload.to_bytes()
        return (buf,), q

    def _update(self, block: Block, node: int, peer: int, row: int, mine: torch.Tensor,
                acked: bool, heard: tuple[torch.Tensor, ...] | None) -> None:
        """One end's update: its own ``q`` into the arc's copy when the peer got it
        (``acked``), the peer's (``heard``; None: lost) into the other copy, then
        ``x_i += (γ/2)(x̂_ji − x̂_ij)``."""
        e = block.workspace["arc"][(node, peer)]
        out, inn = block.arc_state["x_hat_out"][e], block.arc_state["x_hat_in"][e]
        if acked:  # acknowledged: both ends add it to the arc's copy
            out.add_(mine)
        if heard is not None:
            buf = heard[0]
            if block.workspace["fixed"] is None:
                buf = buf[8 : 8 + int(buf[:8].view(torch.int64)[0])]
            comp = block.nodes[row].compressor
            inn.add_(comp.decode(comp.from_bytes(buf, block.x[row])))
        block.x[row].add_(torch.sub(inn, out), alpha=self.gamma / 2)
