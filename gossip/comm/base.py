"""Transports move byte buffers between node ids; they know no math.

The engine calls :meth:`Transport.exchange` once per message phase with every message its
local nodes send. Messages between two nodes hosted by the same process are handed over by
copying the sender's buffer once per phase (receivers may then read it while the sender
already writes its next message); the rest is the subclass's job.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from gossip.errors import CommConfigError, CommError

Edge = tuple[int, int]  # (sender node, receiver node)


def check_timeout(value: float) -> float:
    """``value`` as seconds of a deadline: a positive finite number, else CommConfigError."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise CommConfigError(
            f"timeout must be a positive number of seconds, got {value!r}: it is how long a rank "
            "waits for a neighbor before stopping the run (e.g. --timeout 120)"
        )
    return seconds


class Transport(ABC):
    """Delivers one phase of messages.

    ``placement[i]`` is the rank hosting node ``i``; ``rank`` is this process's rank.
    """

    def __init__(self, placement: list[int], rank: int = 0, world_size: int = 1):
        self.placement = placement
        self.rank = rank
        self.world_size = world_size
        self.bytes_sent: dict[int, int] = {}  # per sending node, counted at hand-over
        self._copies: dict[int, torch.Tensor] = {}

    def is_local(self, node: int) -> bool:
        return self.placement[node] == self.rank

    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        expected: Mapping[Edge, int],
        seq: int,
        round_: int,
    ) -> dict[Edge, torch.Tensor]:
        """Send ``outgoing[(i, j)]`` from node i to node j; return the buffers for ``expected``.

        ``expected[(j, i)]`` is the capacity of the message local node i awaits from node j.
        ``seq`` numbers the phase (same on every process); ``round_`` is for error messages.
        """
        for (src, _), buf in outgoing.items():
            self.bytes_sent[src] = self.bytes_sent.get(src, 0) + buf.numel()
        received: dict[Edge, torch.Tensor] = {}
        copies: dict[int, torch.Tensor] = {}
        for edge in sorted(expected):
            if self.is_local(edge[0]):
                buf = outgoing.get(edge)
                if buf is None:
                    raise CommError(f"round {round_}: node {edge[0]} sent nothing to node {edge[1]}",
                                    round=round_, sender=edge[0], receiver=edge[1])
                if buf.numel() > expected[edge]:
                    raise CommError(
                        f"round {round_}: node {edge[0]} sent {buf.numel()} bytes to node {edge[1]},"
                        f" more than the {expected[edge]} it announced it could send",
                        round=round_, sender=edge[0], receiver=edge[1],
                    )
                key = id(buf)
                if key not in copies:
                    copies[key] = self._local_copy(len(copies), buf)
                received[edge] = copies[key]
        remote_out = {e: b for e, b in outgoing.items() if not self.is_local(e[1])}
        remote_in = {e: c for e, c in expected.items() if not self.is_local(e[0])}
        if remote_out or remote_in:
            received.update(self._exchange_remote(remote_out, remote_in, seq, round_))
        return received

    def exchange_rows(self, rows, plan, seq: int, round_: int) -> None:
        """One phase of a block of nodes (:mod:`gossip.engine.block`): ``rows.mine()`` are the block's
        messages (row r sent by node ``plan.senders[r]``); the messages of remote senders land
        in ``rows.recv`` at their staging rows (``plan.remote_in``; a plan without lost
        messages fills every row). Local receivers read the senders' rows."""
        if not self._count_rows(rows, plan):
            return
        nbytes = rows.nbytes
        own, recv = rows.mine(), rows.received()
        outgoing = {(plan.senders[r], j): own[r] for r, j in plan.remote_out}
        expected = {(j, i): nbytes for j, i, _ in plan.remote_in}
        received = self._exchange_remote(outgoing, expected, seq, round_)
        own_rows = len(plan.senders)  # staging row s is recv[s - own_rows]
        for j, i, s in plan.remote_in:
            buf = received[(j, i)]
            if buf.numel() != nbytes:
                raise CommError(f"round {round_}: node {j} sent {buf.numel()} bytes to node {i}, "
                                f"expected {nbytes}", round=round_, sender=j, receiver=i)
            recv[s - own_rows].copy_(buf)

    def _count_rows(self, rows, plan) -> bool:
        """Count a block phase's bytes (each row ``nbytes`` times its out-degree, for its
        sender); whether any of its messages crosses a process boundary."""
        nbytes, sent = rows.nbytes, self.bytes_sent
        for i, degree in zip(plan.senders, plan.out_degree):
            sent[i] = sent.get(i, 0) + nbytes * degree
        return bool(plan.remote_in or plan.remote_out)

    def _local_copy(self, slot: int, buf: torch.Tensor) -> torch.Tensor:
        """Copy ``buf`` into a reused buffer (grown on demand) so the sender may overwrite it."""
        store = self._copies.get(slot)
        if store is None or store.numel() < buf.numel() or store.device != buf.device:
            store = torch.empty(max(buf.numel(), 1), dtype=torch.uint8, device=buf.device)
            self._copies[slot] = store
        out = store[: buf.numel()]
        out.copy_(buf)
        return out

    @abstractmethod
    def _exchange_remote(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        expected: Mapping[Edge, int],
        seq: int,
        round_: int,
    ) -> dict[Edge, torch.Tensor]:
        """Move the messages that cross process boundaries."""

    def barrier(self) -> None:
        """Wait for every process (no-op in process)."""

    def close(self) -> None:
        """Release communication resources."""
