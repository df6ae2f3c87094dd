"""Virtual time of synchronous rounds (docs/network.md, "Virtual time of synchronous rounds").

Node i starts round t when it finished round t − 1, computes for ``c_i(t)`` seconds
(:meth:`Timing.compute_s`, counter t), sends, and finishes round t once its own compute is done
and every *delivered* message of round t from its in-neighbors has arrived::

    F_i(0) = 0,   F_i(t) = max(F_i(t−1) + c_i(t),  max_{j→i delivered} F_j(t−1) + c_j(t) + d_ji(t))

with ``d_ji(t)`` the delay of arc j → i's message of round t (:meth:`Timing.delay_s`, counter
t). A round of several phases is taken as one exchange, and a message counts as delivered when
its phase-0 message is (the round's drops of :class:`gossip.network.LossDraws`, the ones the
engine applies): a lost message delays nobody. The round ends at ``max_i F_i(t)``.

Every process computes all n nodes' times (numpy, vectorized over the arcs): it needs only the
topology and the keyed draws, so the values are the same wherever the nodes sit, and a resumed
run replays them from round 0 (nothing checkpointed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gossip.core.cache import IdentityCache
from gossip.network import LossDraws, arc_keys
from gossip.timing import Timing


class _Arcs:
    """A round topology's arcs j → i (receiver-sorted) and their draws."""

    def __init__(self, topo: Any, timing: Timing) -> None:
        import scipy.sparse as sp  # not at import: `import gossip` loads no scipy

        w = sp.csr_array(topo.W)
        w.eliminate_zeros()
        coo = w.tocoo()
        off = coo.row != coo.col
        recv, send = coo.row[off].astype(np.int64), coo.col[off].astype(np.int64)
        order = np.lexsort((send, recv))
        self.recv, self.send = recv[order], send[order]
        self.keys = arc_keys(list(zip(self.send.tolist(), self.recv.tolist())))
        net = timing.network
        self.loss = LossDraws(net.loss, timing.seed, self.keys) if net.lossy else None


class SyncClock:
    """The finishing times F_i(t) of synchronous rounds (module doc) on ``topology``."""

    def __init__(self, timing: Timing, topology: Any) -> None:
        self.timing = timing
        self.topology = topology
        self.round = 0
        self.finish = np.zeros(timing.n)
        """F_i(round) of every node i."""
        self._arcs = IdentityCache()

    def advance(self, t: int) -> np.ndarray:
        """F(t), every node's end of round ``t`` (computed from round 0 for an earlier round)."""
        if t < self.round:
            self.round, self.finish = 0, np.zeros(self.timing.n)
        while self.round < t:
            self.round += 1
            self.finish = self._step(self.round)
        return self.finish

    def time(self, t: int) -> float:
        """Round ``t``'s end in virtual seconds, ``max_i F_i(t)`` (0 at round 0)."""
        return float(self.advance(t).max()) if t > 0 else 0.0

    def _step(self, t: int) -> np.ndarray:
        topo = self.topology.at_round(t)
        arcs = self._arcs.get(topo, lambda: _Arcs(topo, self.timing))
        done = self.finish + self.timing.compute_all(t)
        finish = done.copy()
        if arcs.keys:
            arrive = done[arcs.send] + self.timing.delay_arcs(arcs.keys, t)
            if arcs.loss is not None:
                arrive[arcs.loss.lost(t, 0)] = -np.inf
            np.maximum.at(finish, arcs.recv, arrive)
        return finish


__all__ = ["SyncClock"]
