"""signSGD / Signum with majority vote (Bernstein et al., ICML 2018 and ICLR 2019)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from gossip.algorithms.allreduce import AllReduceAlgorithm, ChunkedAllReduce, adam_moments_, node_count
from gossip.core.algorithm import Round, check_range, scheduled
from gossip.core.block import Block
from gossip.errors import ConfigError


class SignumVote(AllReduceAlgorithm):
    r"""Signum with majority vote on the complete graph (1 bit per coordinate each way).

    Every node keeps its own momentum and sends only its sign; the vote of each coordinate is
    taken by the node serving that chunk (:class:`~gossip.algorithms.allreduce.ChunkedAllReduce`
    with ``codec="vote"``)::

        m_i ← β m_i + (1−β) g_i                 (β = 0: signSGD)
        s = sgn( Σ_i sgn(m_i) )                 (a tie, possible for even n, gives 0)
        x ← x − η (s + λ x)                     (weight decay after the vote, unsigned)

    Args:
        eta: learning rate (a number or a schedule ``eta(t)``; a decaying one such as
            ``eta0/√t`` helps when many workers are adversarial).
        beta: momentum (0 gives signSGD).
        weight_decay: λ, added after the vote.
        byzantine: ids of nodes that send the inverted sign (an adversary for robustness tests;
            empty by default).
    """

    name = "signum"
    state_copies = 6

    def __init__(self, eta: float | Callable[[int], float] = 1e-3, beta: float = 0.9,
                 weight_decay: float = 0.0, byzantine: int | Iterable[int] = ()):
        check_range("eta", eta, 0.0, float("inf"))
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"beta = {beta} must be in [0, 1)")
        if weight_decay < 0:
            raise ConfigError(f"weight_decay = {weight_decay} must be >= 0")
        self.eta, self.beta, self.weight_decay = eta, beta, weight_decay
        ids = [byzantine] if isinstance(byzantine, int) else byzantine
        self.byzantine = sorted(int(i) for i in ids)

    def setup(self, block: Block) -> None:
        ws = block.workspace
        ws["vote"] = ChunkedAllReduce(node_count(block), block.x.shape[1], "vote", key="vote")
        ws["vote"].setup(block)
        z = torch.zeros_like(block.x)
        block.state["m"] = z
        block.workspace.update(grad=z.clone(), s=z.clone())  # scratch, never checkpointed
        rows = [r for r, i in enumerate(block.ids) if i in self.byzantine]
        ws["byzantine"] = torch.tensor(rows, dtype=torch.int64, device=z.device) if rows else None

    def step(self, block: Block) -> Round:
        st = block.state
        m, s = st["m"], block.workspace["s"]
        adam_moments_(m, None, block.gradients(block.workspace["grad"]), self.beta, 0.0)
        s.copy_(m)
        bad = block.workspace["byzantine"]
        if bad is not None:  # they send −m
            s.index_copy_(0, bad, m.index_select(0, bad).neg_())
        yield from block.workspace["vote"].reduce_block(block, s, s)
        if self.weight_decay:
            s.add_(block.x, alpha=self.weight_decay)
        block.x.sub_(s, alpha=scheduled(self.eta, block.round))
