"""Synchronous partial activation (``--network active=...``, docs/network.md): each round only
the active nodes take part.

Which nodes are active in round t is drawn from (seed, node, round)
(:class:`gossip.network.ActivityDraws`: Bernoulli, a two-state Markov chain per node, a
Poisson clock in rounds, or a fixed cycle), the same on every process. An **inactive** node in
round t

* does not compute: its oracle is not called (:meth:`~gossip.core.block.Block.gradients`
  skips its row, and any other call of its oracle in the round is refused with
  :class:`NodeAsleep`), and its model ``x``, its ``block.state`` rows and its ``arc_state``
  rows are at the end of the round what they were at its start (the round runs over the block
  as usual; the engine puts the inactive rows back);
* sends nothing and receives nothing: every arc into or out of it is *silent* that round,
  which the rounds' loss machinery (:mod:`gossip.network.loss`) treats as a lost message,
  known at both ends from the same draws. So each algorithm does with a silent neighbor what
  its :attr:`~gossip.core.Algorithm.on_loss` says it does with a lost message: ``renormalize``
  (its weight goes to the receiver's own term), ``drop`` (no increment arrives), ``keep-mass``
  (push-sum: the sender keeps the share; an inactive node keeps all of its mass), ``ack``
  (both ends of the arc skip it; and since the sleeping end's round is undone, the per-arc
  sums of :class:`~gossip.core.channel._ArcCopies` leave the arc out at its active end too,
  through :attr:`~gossip.core.block.Block.active_nodes`), ``edge`` (its edges sit the round
  out at both ends);
  algorithms without loss semantics are refused. A silent arc moves no bytes (no bits) and
  is not counted in ``messages_lost``.

Refused in one line: asynchronous algorithms (they have their own clocks), stateful
compressors (their per-node state would move in a round the node sleeps), ``--overlap`` (it
computes every node's next gradient ahead), ``stale=`` and timing models (not combined yet).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gossip.errors import ConfigError, ContractError
from gossip.network.draws import ActivityDraws
from gossip.network.spec import Network


class NodeAsleep(ContractError, AttributeError):
    """An inactive node's oracle was asked for something (its node does not compute this round)."""


class _Asleep:
    """What an inactive node's ``oracle`` is while its round runs: every attribute refused
    (an ``AttributeError`` too, so ``getattr(oracle, name, default)`` reads the default)."""

    __slots__ = ("_node", "_round")

    def __init__(self, node: int, t: int):
        self._node, self._round = node, t

    def __getattr__(self, name: str) -> Any:
        raise NodeAsleep(f"round {self._round}: node {self._node} is inactive (--network "
                         f"active=...) and does not compute, but its oracle's {name!r} was "
                         "asked for: compute gradients through block.gradients(), which skips "
                         "inactive nodes")


class Activity:
    """The rounds' partial activation (module doc): :meth:`begin` before the round runs,
    :meth:`end` after its last phase; :meth:`silent` marks the arcs of inactive nodes."""

    def __init__(self, network: Network, seed: int, n: int):
        self.network = network
        self.draws = ActivityDraws(network.active, seed, n)
        self.mask: np.ndarray = np.ones(n, dtype=bool)
        """Which nodes are active in the current round (every node's, on every process)."""
        self.count = n
        """How many are (this round)."""
        self.total = 0
        """Node-rounds active since round 1 (recounted from the draws after a resume)."""
        self._saved: list[tuple[torch.Tensor, Any, torch.Tensor]] = []
        self._oracles: list[tuple[Any, Any]] = []
        self._at = 0

    def check(self, host: Any, name: str) -> None:
        """Refuse what partial activation cannot run with (module doc)."""
        if host.block.compressor.stateful:
            raise ConfigError(f"--network {self.network.spec()}: the compressor "
                              f"'{host.block.compressor.spec}' keeps state per node, which would "
                              "move in rounds its node sleeps; use a stateless compressor with "
                              "active=")

    def begin(self, t: int, block: Any) -> None:
        """Round ``t`` begins: draw who is active, and keep what the block's inactive rows hold
        (to put back at :meth:`end`); their oracles sleep."""
        if t != self._at + 1:  # a resumed run: recount the active node-rounds from the draws
            self.total = int(sum(self.draws.active(s).sum() for s in range(1, t)))
        self._at = t
        self.mask = self.draws.active(t)
        self.count = int(self.mask.sum())
        self.total += self.count
        local = self.mask[block.ids]
        block.active_nodes = None if self.count == len(self.mask) else self.mask
        if local.all():
            block.active_rows = None
            return
        sleeping = [r for r in range(block.m) if not local[r]]
        block.active_rows = [r for r in range(block.m) if local[r]]
        self._save(block, sleeping)
        for r in sleeping:
            nd = block.nodes[r]
            self._oracles.append((nd, nd.oracle))
            if nd.oracle is not None:
                nd.oracle = _Asleep(nd.id, t)

    def _save(self, block: Any, rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.int64, device=block.x.device)
        self._saved = [(block.x, idx, block.x.index_select(0, idx))]
        for value in block.state.values():
            if isinstance(value, torch.Tensor):
                self._saved.append((value, idx.to(value.device), value.index_select(0, idx.to(value.device))))
            else:  # one tensor per row
                for r in rows:
                    self._saved.append((value[r], None, value[r].clone()))
        if not block.arc_state:
            return
        default = block.arc_plan() if set(block.arc_state) - set(block.arc_routes) else None
        for key, value in block.arc_state.items():
            route, incoming = block.arc_routes.get(key, (default, False))
            spans = [route.in_rows(block.ids[r]) if incoming else route.out_rows(block.ids[r])
                     for r in rows]
            arc_rows = [a for span in spans for a in range(span.start, span.stop)]
            if not arc_rows:
                continue
            for part in value if isinstance(value, list) else [value]:
                aidx = torch.tensor(arc_rows, dtype=torch.int64, device=part.device)
                self._saved.append((part, aidx, part.index_select(0, aidx)))

    def end(self, block: Any) -> None:
        """The round's last phase is done: the inactive rows get back what they held, the
        oracles wake."""
        for tensor, idx, saved in self._saved:
            if idx is None:
                tensor.copy_(saved)
            else:
                tensor.index_copy_(0, idx, saved)
        self._saved = []
        for nd, oracle in self._oracles:
            nd.oracle = oracle
        self._oracles = []
        block.active_rows = None
        block.active_nodes = None

    def silent(self, keys: np.ndarray) -> np.ndarray:
        """True where an arc (stream key ``i << 32 | j``) touches a node inactive this round."""
        src = (keys >> 32).astype(np.int64)
        dst = (keys & 0xFFFFFFFF).astype(np.int64)
        return ~(self.mask[src] & self.mask[dst])


__all__ = ["Activity", "NodeAsleep"]
