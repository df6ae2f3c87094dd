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

from gossip.algorithms.base import Asynchronous, check_range, scheduled
from gossip.algorithms.requirements import Graph, Requirements
from gossip.engine.block import Block
from gossip.engine.events import Activation
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
        block.arc_state["x_hat"] = torch.zeros(len(route.arcs), block.x.shape[1],
                                               dtype=block.x.dtype, device=block.x.device)
        ws = block.workspace
        ws["arc"] = {a: e for e, a in enumerate(route.arcs)}
        ws["q"] = block.x.new_empty(2, block.x.shape[1])
        ws["rng"] = {}
        if block.has_oracle:
            ws["grad"] = torch.empty_like(block.x)

    def _compress(self, block: Block, row: int, seq: int, x_hat: torch.Tensor,
                  out: torch.Tensor) -> int:
        """``out = C(x_row − x̂)`` with the node's compressor and its stream keyed by the
        activation ``seq``; the message's bytes."""
        node = block.nodes[row]
        rng = block.workspace["rng"].get(node.id)
        if rng is None:
            rng = block.workspace["rng"][node.id] = Stream(block.seed, [node.id], "async.q")
        rng.begin_round(seq)
        payload = node.compressor.encode(torch.sub(block.x[row], x_hat), rng)
        node.compressor.decode(payload, out=out)
        return payload.nbytes

    def activate(self, block: Block, event: Activation) -> None:
        j = event.partner()
        ws, i = block.workspace, event.row
        if block.has_oracle:
            grad = ws["grad"]
            block.gradients(grad, rows=[i])
            block.local_step(grad, scheduled(self.eta, block.round), rows=[i])
        if j is None:
            return
        rj, x_hat, q = event.row_of(j), block.arc_state["x_hat"], ws["q"]
        a, b = ws["arc"][(event.node, j)], ws["arc"][(j, event.node)]
        sent = self._compress(block, i, event.seq, x_hat[a], q[0])
        reply = self._compress(block, rj, event.seq, x_hat[b], q[1])
        j_heard, i_heard = event.exchange(j, sent, reply)
        if j_heard:
            x_hat[a].add_(q[0])
        if i_heard:
            x_hat[b].add_(q[1])
        diff = torch.sub(x_hat[b], x_hat[a], out=q[0])
        block.x[i].add_(diff, alpha=self.gamma / 2)
        block.x[rj].sub_(diff, alpha=self.gamma / 2)
