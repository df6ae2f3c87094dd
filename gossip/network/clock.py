"""The clocks of synchronous rounds: their virtual time, and their pacing in wall-clock time.

**Virtual time** (docs/network.md, "Virtual time of synchronous rounds").
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

**Wall-clock pacing** under mpiexec (``--free-run SCALE``): the ``--network`` timing draws
(``compute=``, ``slow=``) slept as ``draw × SCALE`` wall seconds, so that a run's wall time can
be set against its virtual time (docs/asynchronous.md, "Free-running under mpiexec", and
docs/network.md, "Synchronous rounds in wall-clock time").

One mechanism, two users: :func:`sleep_serving` is how both a free-running asynchronous node
(:mod:`gossip.network.freerun`, which answers its neighbors meanwhile) and a synchronous round
(:class:`WallRounds`, nothing to answer) spend a compute draw.

**Synchronous rounds.** With one node per rank, rank i's round t sleeps ``c_i(t) × SCALE``
(:meth:`Timing.compute_s`, counter t, as :class:`SyncClock` draws it) once
its round's first messages are ready and before it posts them; it then waits for its
in-neighbors' messages as usual. Rank i thus ends round t at
``W_i(t) ≈ max(W_i(t−1) + c_i(t)·S, max_{j→i delivered} W_j(t−1) + c_j(t)·S)``: the SyncClock's
recursion × S plus what the machine adds (the real computation, the transfers). A lost message
is not sent, so nobody waits for it — as in the clock.

**Records without a global barrier in the clock.** A record is collective: every rank waits
for the slowest, which a synchronous run on a sparse graph does not do (a straggler's
neighbors wait for it, the far nodes only later). So the records are taken out of the clock:
each rank measures an *effective* wall time (monotonic time minus the time paused), a record
gathers every rank's end of round ``W_i(t)`` (its ``wall_s`` is the latest, the round's end,
as ``time_virtual_s`` is ``max_i F_i(t)``), and when the record is done each rank sets its
effective clock to ``min_j W_j(t)`` and sleeps until its own ``W_i(t)``: the ranks restart
with the same offsets they had before the record, whatever it cost (up to the microseconds by
which they leave the record's last collective apart).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gossip.core.cache import IdentityCache
from gossip.network.draws import LossDraws, arc_keys
from gossip.network.timing import Timing


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


def sleep_serving(seconds: float, serve: Callable[[], object] | None = None,
                  poll_s: float = 1e-4) -> None:
    """Spend ``seconds`` of wall time; ``serve`` (a free run's answering of its neighbors) is
    called at least once and then every ``poll_s`` until then."""
    end = time.monotonic() + seconds
    if serve is None:
        if seconds > 0:
            time.sleep(seconds)
        return
    while True:
        serve()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(poll_s, left))


class WallRounds:
    """The wall clock of one rank's node in synchronous rounds (module doc). ``scale``: wall
    seconds per virtual second."""

    def __init__(self, timing: Timing, node: int, scale: float) -> None:
        self.timing, self.node, self.scale = timing, node, scale
        self._origin = time.monotonic()
        self._paused = 0.0
        self.finish = 0.0
        """This node's effective wall end of its last round (seconds since the common start)."""

    def now(self) -> float:
        """Effective wall seconds since the common start (records' time taken out)."""
        return time.monotonic() - self._origin - self._paused

    def pace(self, t: int) -> None:
        """Round ``t``'s compute: sleep this node's draw × scale."""
        seconds = self.timing.compute_s(self.node, t) * self.scale
        sleep_serving(seconds)

    def finished(self) -> None:
        """The round ended here (its last phase received)."""
        self.finish = self.now()

    def resume(self, finishes: np.ndarray) -> None:
        """After a collective that gave every node's ``finish``: restart at this node's own
        end of round, with the effective clock at the earliest (module doc). At the start
        (every finish 0) this sets the common origin."""
        earliest = float(np.min(finishes)) if len(finishes) else 0.0
        self._paused = time.monotonic() - self._origin - earliest
        sleep_serving(self.finish - earliest)


__all__ = ["SyncClock", "WallRounds", "sleep_serving"]
