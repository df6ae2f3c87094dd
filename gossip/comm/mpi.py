"""The MPI link: buffer-based ``Isend``/``Irecv`` of raw byte buffers (no object serialization).

Buffers are handed to MPI as numpy views of the tensors' memory; CUDA tensors are staged
through pinned host memory by the transport. Every wait busy-polls against a deadline: a
silent neighbor raises :class:`CommTimeout` naming its rank and the round instead of hanging
the job.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from gossip.comm.link import Link, Peer, What, wait_head, wait_text
from gossip.errors import CommError, CommTimeout


def wait_requests(
    reqs: list,
    *,
    timeout: float,
    rank: int,
    peers: list[tuple[str, int | tuple[int, ...]]],
    what: What,
    statuses: list | None = None,
    spin: int = 100,
    yield_cpu: bool = True,
    round: int | None = None,
) -> None:
    """Busy-poll MPI requests until all are done; past ``timeout`` seconds, raise CommTimeout.

    Every wait of a run (the transport's messages, the metric reductions, barriers) goes
    through here, so a crashed, killed or stopped rank ends the run with an error instead of a
    hang. ``peers[k]`` is ``(label, rank)`` of the process ``reqs[k]`` talks to; the error names
    those still pending. Where that process may itself be waiting for others (a chain of
    ranks), ``rank`` is the tuple of every rank whose silence would leave it pending.
    ``what`` starts the message (one text, or one per request: a phase's receives and sends
    are waited for together, and the message names the pending peers of the first pending
    request's text); ``{timeout}`` and ``{round}`` in it become the deadline and the round.
    ``statuses`` (one per request, reused by the caller) receive the requests' statuses. After ``spin``
    polls each further poll yields the CPU (oversubscribed ranks). ``round`` (when known) and
    ``rank`` become the error's fields.
    """
    if not reqs:
        return
    MPI = _MPI or _load_mpi()
    deadline = time.monotonic() + timeout
    test = MPI.Request.Testall
    polls = 0
    while True:
        try:
            done = test(reqs, statuses) if statuses is not None else test(reqs)
        except MPI.Exception as exc:  # e.g. MPI_ERR_TRUNCATE, at once (no deadline passed)
            errors = [MPI.Get_error_class(st.Get_error()) for st in statuses or ()]
            failed = [p for p, e in zip(peers, errors) if e not in (MPI.SUCCESS, MPI.ERR_PENDING)]
            truncated = exc.Get_error_class() == MPI.ERR_TRUNCATE or MPI.ERR_TRUNCATE in errors
            if exc.Get_error_class() == MPI.ERR_TRUNCATE and not failed:
                failed = peers
            head = wait_head(what, round)  # "round t: rank r" without the wait
            if truncated:
                raise CommError(
                    f"{head}: {', '.join(p[0] for p in failed)} sent a message larger than the "
                    "receive buffer its settings announce (the ranks run different settings, or a "
                    "rank is faulty); start every rank with the same flags and files",
                    round=round, rank=rank,
                ) from exc
            raise CommError(
                f"{head}: MPI error with {', '.join(p[0] for p in (failed or peers))}: "
                f"{exc.Get_error_string().split(', error stack')[0]} (a peer died?)",
                round=round, rank=rank,
            ) from exc
        if done:
            return
        polls += 1
        if polls > spin and yield_cpu:
            os.sched_yield()  # let the process we wait for run
        if time.monotonic() > deadline:
            left = [k for k, r in enumerate(reqs) if not r.Test()]
            text = wait_text(what, left[0], timeout, round) if left else wait_text(what, 0, timeout, round)
            pending = [peers[k] for k in left  # those of the first one's text ("message from")
                       if isinstance(what, str) or what[k] == what[left[0]]]
            ranks = sorted({q for p in pending for q in (p[1] if isinstance(p[1], tuple) else (p[1],))})
            chain = any(isinstance(p[1], tuple) and len(p[1]) > 1 for p in pending)
            raise CommTimeout(
                f"{text} {', '.join(p[0] for p in pending)}; "
                f"{'one of ' if chain else ''}rank(s) {ranks} stopped answering (crashed, killed "
                "or stuck). Raise --timeout if rounds are legitimately slower.",
                round=round, rank=rank,
            )


_MPI = None


def _load_mpi():
    """mpi4py's ``MPI`` module (imported at the first wait: importing it starts MPI)."""
    global _MPI
    from mpi4py import MPI

    _MPI = MPI
    return MPI


class MPILink(Link):
    """Byte messages over an mpi4py communicator (one process per rank)."""

    kind = "MPI world"
    launcher = "mpiexec -n {n}"
    spin = 100  # busy polls before each further poll yields the CPU

    def __init__(self, comm, yield_cpu: bool = True):
        super().__init__(comm.Get_rank(), comm.Get_size())
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.yield_cpu = yield_cpu
        self._statuses: dict[int, list] = {}  # per count, reused (a failed request's error is in its status)

    def exchange(self, recvs: Sequence[tuple[torch.Tensor, int]],
                 sends: Sequence[tuple[torch.Tensor, int]], tag: int) -> list:
        return self.post(self.prepare(recvs, sends), tag)

    def prepare(self, recvs: Sequence[tuple[torch.Tensor, int]],
                sends: Sequence[tuple[torch.Tensor, int]]) -> Any:
        """Each buffer as mpi4py's ``[numpy view, BYTE]`` (what ``buf.numpy()`` costs a round)."""
        BYTE = self._mpi.BYTE
        return ([([buf.numpy(), BYTE], src) for buf, src in recvs],
                [([buf.numpy(), BYTE], dst) for buf, dst in sends])

    def post(self, prepared: Any, tag: int) -> list:
        recvs, sends = prepared
        irecv, isend = self.comm.Irecv, self.comm.Isend
        handles = [irecv(buf, src, tag) for buf, src in recvs]
        handles += [isend(buf, dst, tag) for buf, dst in sends]
        return handles

    def wait(self, handles: list, *, timeout: float, peers: Sequence[Peer], what: What,
             round: int | None = None, sizes: Sequence[int] | None = None) -> None:
        MPI = self._mpi
        statuses = self._statuses.get(len(handles))
        if statuses is None:
            statuses = self._statuses[len(handles)] = [MPI.Status() for _ in handles]
        wait_requests(handles, timeout=timeout, rank=self.rank, peers=peers, what=what,
                      statuses=statuses, spin=self.spin, yield_cpu=self.yield_cpu, round=round)
        if not sizes:
            return
        BYTE, SUCCESS = MPI.BYTE, MPI.SUCCESS
        for k, size in enumerate(sizes):
            status = statuses[k]
            if status.Get_count(BYTE) != size or status.Get_error() != SUCCESS:
                count = status.Get_count(BYTE)
                raise CommError(
                    f"{wait_head(what, round)}: {peers[k][0]} sent a message of {count} bytes, "
                    f"expected {size} (the ranks run different settings? start every rank with "
                    "the same flags and files)", round=round, rank=self.rank,
                )

    def progress(self) -> None:
        """One call into MPI's progress engine (``Iprobe``: it completes no request, so the
        statuses that :meth:`wait` checks stay with their requests)."""
        self.comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=self._mpi.ANY_TAG)

    def abort(self, code: int) -> None:
        """``MPI_Abort``: mpiexec ends every rank. Output is flushed and given a moment to be
        forwarded first: mpiexec tears down the job's I/O at the abort.

        The library's own report of the abort (MPICH: ``Abort(1) on node 0 (rank 0 in comm
        0): application called MPI_Abort(...)``) would follow the caller's one-line reason and
        say nothing more, so this rank's stderr is closed to it: the exit status still
        reaches mpiexec."""
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(FORWARD_S)
        _silence_stderr()
        self.comm.Abort(code)


def _silence_stderr() -> None:
    """Point file descriptor 2 at the null device (what is written after this is dropped)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    except OSError:  # no null device: the abort's line shows, which is harmless
        pass


FORWARD_S = 1.0  # seconds the launcher gets to forward a rank's last output before an abort
