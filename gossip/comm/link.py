"""Links: nonblocking byte messages between the processes of a run (MPI or torch.distributed).

A link is the only part of the communication stack that knows the library moving the bytes.
The transport (message rows of a phase) and the world's reductions (metrics, barriers, votes)
post a batch of receives and sends with :meth:`Link.exchange` and wait for it with
:meth:`Link.wait` against the run's deadline, so a silent process ends the run with
:class:`~gossip.errors.CommTimeout` naming its rank whichever library carries the bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

TAG_SPACE = 1 << 20  # message phases use tags below; the world's reductions use tags above

Peer = tuple[str, "int | tuple[int, ...]"]  # (label for messages, rank(s) whose silence blocks it)

What = str | Sequence[str]
"""How a wait's messages start: one text for every handle, or one per handle (a phase's
receives "... waited {timeout} for a message from", its sends "... for the send to"); each may
hold ``{timeout}`` and ``{round}``, filled in by :func:`wait_text` when an error is raised."""


def wait_text(what: What, k: int, timeout: float, round: int | None) -> str:
    """The start of the message about handle ``k`` of a wait (``what``: see :data:`What`),
    its deadline and round filled in."""
    text = what if isinstance(what, str) else what[k]
    return text.format(timeout=f"{timeout:g} s", round=round)


def wait_head(what: What, round: int | None) -> str:
    """``"round t: rank r"``: the start of a wait's message without the wait (for an error
    that came at once, before any deadline)."""
    text = what if isinstance(what, str) else what[0]
    return text.split(" waited ")[0].format(round=round)


class Link(ABC):
    """Point-to-point byte messages between ``size`` processes; this one is ``rank``."""

    kind: str = ""  # the world's name in messages, e.g. "MPI world"
    launcher: str = ""  # the command line that starts N processes, with N as "{n}"
    moves_cuda: bool = False  # False: the caller stages CUDA buffers through host memory

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size

    @abstractmethod
    def exchange(
        self,
        recvs: Sequence[tuple[torch.Tensor, int]],
        sends: Sequence[tuple[torch.Tensor, int]],
        tag: int,
    ) -> list:
        """Post receives into ``recvs[k][0]`` (1-D uint8 tensors) from rank ``recvs[k][1]`` and
        sends of ``sends[k][0]`` to rank ``sends[k][1]``; one handle per receive, then per send.

        Messages between two processes with the same ``tag`` match in the order they are
        posted; buffers must stay untouched until :meth:`wait` returns.
        """

    def prepare(self, recvs: Sequence[tuple[torch.Tensor, int]],
                sends: Sequence[tuple[torch.Tensor, int]]) -> Any:
        """The buffers of an exchange (as :meth:`exchange` takes them) in the form :meth:`post`
        posts: a phase that comes back round after round with the same buffers prepares them
        once (the MPI link turns each into its numpy view here, not every round)."""
        return recvs, sends

    def post(self, prepared: Any, tag: int) -> list:
        """:meth:`exchange` of buffers :meth:`prepare` returned."""
        recvs, sends = prepared
        return self.exchange(recvs, sends, tag)

    @abstractmethod
    def wait(
        self,
        handles: list,
        *,
        timeout: float,
        peers: Sequence[Peer],
        what: What,
        round: int | None = None,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Wait for ``handles`` (``peers[k]`` is who ``handles[k]`` talks to) for at most
        ``timeout`` seconds, else raise CommTimeout: ``what`` (:data:`What`: one text, or one
        per handle) starts the message, then the silent peers (those of the first silent
        handle's text). ``sizes[k]``: bytes the k-th receive (the first handles) must hold,
        checked where the library reports it (CommError otherwise)."""

    def progress(self) -> None:
        """Let posted messages move while the caller computes (a library that moves bytes
        only inside its own calls, as MPI does without a progress thread); nothing by
        default (torch.distributed moves them on its own threads)."""

    def launch_hint(self, n: int) -> str:
        """How to start ``n`` processes of this kind (for error messages)."""
        return self.launcher.format(n=n)

    def abort(self, code: int) -> None:
        """End every process of the job (the caller has printed why)."""
        raise SystemExit(code)
