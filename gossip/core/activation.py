"""What an asynchronous algorithm acts through (docs/asynchronous.md): one ringing of a node's
clock (:class:`Activation`), one end of a pairwise exchange (:class:`Side`) and a posted
message (:class:`Message`), and the vocabularies of an algorithm's asynchronous declarations
(:data:`CLOCKS`, :data:`CONTACTS`, :data:`PEERS`).

The runner behind an activation (the virtual-time event loop, or a free run on wall clocks)
is whatever object the engine hands it; an activation only calls its ``exchange`` and
``post`` and reads its ``algorithm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gossip.errors import ContractError

CLOCKS = ("compute", "poisson")
"""``compute``: a node rings when its local step ends (intervals ``compute_s(i, k)``);
``poisson``: at the ticks of a Poisson clock whose mean interval is ``compute_s(i, k)``
(intervals ``compute_s(i, k) · E``, E ~ Exp(1)): randomized gossip's clocks."""
CONTACTS = ("exchange", "post")
"""How an activation talks to its peer (module doc)."""
PEERS = ("random", "next")
"""``random``: a uniform draw among the present out-neighbors; ``next``: the out-neighbors in
turn (activation k: neighbor k mod degree, SGP's one-peer schedule), none when it is away."""

@dataclass
class Message:
    """A posted message: ``parts`` from ``src`` to ``dst`` (its block row ``row``), as they
    were when sent at virtual time ``sent_s``, arriving at ``time``."""

    src: int
    dst: int
    row: int
    parts: tuple[torch.Tensor, ...]
    sent_s: float
    time: float


class Side:
    """One end of a pairwise exchange: its ``node`` and block ``row``, the ``peer``, whether it
    ``initiated`` the exchange (its clock rang), and after the swap whether it ``heard`` the
    peer's offer and whether the peer ``was_heard`` (got its own; both ends know both: the
    acknowledgement)."""

    __slots__ = ("node", "row", "peer", "initiated", "time", "seq", "heard", "was_heard")

    def __init__(self, node: int, row: int, peer: int, initiated: bool, time: float, seq: int):
        self.node, self.row, self.peer, self.initiated = node, row, peer, initiated
        self.time, self.seq = time, seq
        self.heard = self.was_heard = False


class Activation:
    """One ringing of node ``node``'s clock (block row ``row``) at virtual time ``time``, its
    ``k``-th (k = 1, 2, ...) and the run's ``seq``-th activation, with the ``peer`` the
    engine drew (None: no neighbor is present): what :meth:`Algorithm.activate` reads and
    acts through (``seq`` keys per-event randomness)."""

    __slots__ = ("node", "row", "time", "k", "seq", "peer", "_loop", "_done")

    def __init__(self, loop: Any, node: int, row: int, time: float, k: int, seq: int,
                 peer: int | None):
        self.node, self.row, self.time, self.k, self.seq = node, row, time, k, seq
        self.peer, self._loop, self._done = peer, loop, False

    def meet(self) -> Side | None:
        """The pairwise exchange with :attr:`peer` (``contact = "exchange"``): both ends'
        offers swapped, then both merged. Returns this end's :class:`Side` (None without a
        peer)."""
        if self.peer is None:
            return None
        self._check("exchange")
        return self._loop.exchange(self.node, self.peer, self.time, self.seq)

    def post(self, *parts: torch.Tensor) -> bool:
        """Send ``parts`` (as they are now) to :attr:`peer` (``contact = "post"``); they arrive
        after the arc's delay as a :meth:`Algorithm.receive` call, unless the network loses
        them or the peer is away then. Returns whether they were sent without being lost."""
        if self.peer is None:
            return False
        self._check("post")
        return self._loop.post(self.node, self.peer, self.time, parts)

    def _check(self, contact: str) -> None:
        loop = self._loop
        if loop.algorithm.contact != contact or self._done:
            raise ContractError(f"{loop.algorithm.name} declares contact = "
                                f"{loop.algorithm.contact!r}: an activation may {loop.algorithm.contact} "
                                "once with its peer, and do nothing else with it")
        self._done = True
