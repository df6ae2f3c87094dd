"""What an asynchronous algorithm acts through (docs/asynchronous.md): one ringing of a node's
clock (:class:`Activation`), a message that arrives (:class:`Message`), and the vocabularies of
an algorithm's asynchronous declarations (:data:`CLOCKS`, :data:`CONTACTS`, :data:`PEERS`).

An activation talks to its peer once, in one of two ways: :meth:`Activation.post` (a one-way
message, taken in by the receiver's :meth:`Algorithm.receive <gossip.core.algorithm.Algorithm.receive>`
after the arc's delay) or :meth:`Activation.exchange` (the same message, answered at once: the
peer's ``receive`` replies with :meth:`Message.reply`, and the exchange returns the reply).
Either way the receiving end is ``receive``, so a method is written with ``activate`` and
``receive`` alone.

The runner behind an activation (the virtual-time event loop, or a free run on wall clocks)
is whatever object the engine hands it; an activation only calls its ``exchange`` and
``post`` and reads its ``algorithm``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gossip.errors import ContractError

CLOCKS = ("compute", "poisson")
"""``compute``: a node rings when its local step ends (intervals ``compute_s(i, k)``);
``poisson``: at the ticks of a Poisson clock whose mean interval is ``compute_s(i, k)``
(intervals ``compute_s(i, k) · E``, E ~ Exp(1)): randomized gossip's clocks."""
CONTACTS = ("exchange", "post")
"""How an activation talks to its peer (module doc), declared so that every process knows
what a remote activation asks of the nodes it hosts."""
PEERS = ("random", "next")
"""``random``: a uniform draw among the present out-neighbors; ``next``: the out-neighbors in
turn (activation k: neighbor k mod degree, SGP's one-peer schedule), none when it is away."""


@dataclass
class Message:
    """A message from ``src`` to ``dst`` (its block row ``row``): ``parts`` as they were when
    sent at virtual time ``sent_s``, arriving at ``time``, by activation ``seq`` of the run
    (what keys an answer's randomness).

    ``parts`` is None for an exchange's message the network lost: the end still acts (the
    other end may have heard it), with nothing heard. ``acked``, on the reply an exchange
    returns, says whether the peer got this end's message (the acknowledgement; both ends
    know both fates)."""

    src: int
    dst: int
    row: int
    parts: tuple[torch.Tensor, ...] | None
    sent_s: float
    time: float
    seq: int = 0
    acked: bool = True
    answer: Callable[[tuple[torch.Tensor, ...]], bool] | None = None
    """The runner's way back to the sender (an exchange's request only)."""

    def reply(self, *parts: torch.Tensor) -> bool:
        """Answer an exchange's request with ``parts`` (as they are now; sized like the
        request's, :meth:`Algorithm.message_like <gossip.core.algorithm.Algorithm.message_like>`),
        once, in :meth:`Algorithm.receive <gossip.core.algorithm.Algorithm.receive>`. Returns
        whether the sender hears it (the network may lose it)."""
        if self.answer is None:
            raise ContractError(f"node {self.dst} replied to a message from node {self.src} that "
                                "is not an exchange's request (a post, or a reply already made)")
        answer, self.answer = self.answer, None
        return answer(parts)


class Activation:
    """One ringing of node ``node``'s clock (block row ``row``) at virtual time ``time``, its
    ``k``-th (k = 1, 2, ...) and the run's ``seq``-th activation, with the ``peer`` the
    engine drew (None: no neighbor is present): what :meth:`Algorithm.activate` reads and
    acts through (``seq`` keys per-event randomness)."""

    __slots__ = ("node", "row", "time", "k", "seq", "peer", "heard_from", "_loop", "_done")

    def __init__(self, loop: Any, node: int, row: int, time: float, k: int, seq: int,
                 peer: int | None):
        self.node, self.row, self.time, self.k, self.seq = node, row, time, k, seq
        self.peer, self._loop, self._done = peer, loop, False
        self.heard_from: tuple[str, int] | None = None
        """Set by the runner when an exchange's reply came from another process: how an error
        names the message and its sender (a reply the method's decoder refuses)."""

    def post(self, *parts: torch.Tensor) -> bool:
        """Send ``parts`` (as they are now) to :attr:`peer` (``contact = "post"``); they arrive
        after the arc's delay as a :meth:`Algorithm.receive` call, unless the network loses
        them or the peer is away then. Returns whether they were sent without being lost."""
        if self.peer is None:
            return False
        self._check("post")
        return self._loop.post(self.node, self.peer, self.time, parts)

    def exchange(self, *parts: torch.Tensor) -> Message | None:
        """Send ``parts`` (as they are now) to :attr:`peer` (``contact = "exchange"``), whose
        :meth:`Algorithm.receive` replies at once (:meth:`Message.reply`); atomic in virtual
        time. Returns the reply, a :class:`Message` whose ``parts`` are None when the network
        lost it and whose ``acked`` says whether the peer got ``parts``; None without a peer,
        or when the peer stopped answering (a free run routes it around)."""
        if self.peer is None:
            return None
        self._check("exchange")
        return self._loop.exchange(self, parts)

    def _check(self, contact: str) -> None:
        loop = self._loop
        if loop.algorithm.contact != contact or self._done:
            raise ContractError(f"{loop.algorithm.name} declares contact = "
                                f"{loop.algorithm.contact!r}: an activation may {loop.algorithm.contact} "
                                "once with its peer, and do nothing else with it")
        self._done = True


def answer_request(algorithm: Any, block: Any, request: Message) -> None:
    """Hand an exchange's ``request`` to ``algorithm.receive``, which must reply to it (the
    runners' check: the sender waits for the reply)."""
    algorithm.receive(block, request)
    if request.answer is not None:
        raise ContractError(f"{algorithm.name}.receive did not reply to node {request.src}'s "
                            f"exchange (node {request.dst}): it answers an exchange's request "
                            "once, with message.reply(...)")
