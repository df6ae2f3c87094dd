"""The torch.distributed link: sends and receives of byte tensors (gloo on CPU, NCCL on GPUs).

Started by ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``). CPU byte tensors travel over gloo; with NCCL, CUDA rows are sent from device
memory and the world's small CPU reductions go over a gloo group beside it. Waits have the
run's deadline: gloo's are bounded waits, NCCL's polls of the work's completion, so a silent
rank ends the run with :class:`CommTimeout` naming it, as under MPI.

Start-up is bounded by the same deadline: the ranks meet in the launcher's key-value store (a
roll call, then the process group's own rendezvous), and a rank that does not arrive is named in
one :class:`CommTimeout`. The store then carries each rank's end: a rank that fails leaves its
error there, and one whose script ends leaves a note, so a rank whose connection to it breaks
names the rank that stopped (and why) instead of blaming the neighbor that failed because of it.
"""

from __future__ import annotations

import atexit
import datetime
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from gossip.comm.link import Link, Peer, What, wait_text
from gossip.errors import CommConfigError, CommError, CommTimeout

_STORE: dist.Store | None = None
"""The launcher's store this process joined the group through (None: the script's own group)."""
_RANK = 0
_FAILED = False  # this process left a "failed" note: it never says it exited normally


def _key(what: str, rank: int) -> str:
    """A key of this library in the store, apart for each restart of an elastic job."""
    return f"gossip/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{what}/{rank}"


def init_process_group(backend: str, timeout: float) -> None:
    """Join the process group of a ``torchrun`` job (unless the script already did).

    ``nccl`` also gets gloo for CPU tensors (``cpu:gloo,cuda:nccl``); ``timeout`` bounds the
    rendezvous. A group joined here is destroyed when the interpreter exits
    (:func:`destroy_process_group`), so torch does not warn that it was left alive; one the
    script initialised itself stays the script's to destroy."""
    if dist.is_initialized():
        return
    if backend == "nccl" and not torch.cuda.is_available():
        raise CommConfigError(
            "--transport nccl needs CUDA GPUs and torch sees none; use --transport gloo (CPU) "
            "or run on GPU machines")
    spec = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
    if backend == "nccl":
        local, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
        if local > gpus:
            raise CommConfigError(
                f"--transport nccl needs a GPU per process: this machine runs {local} processes on "
                f"{gpus} GPU(s); start at most {gpus} per machine (torchrun --nproc-per-node "
                f"{gpus}, with --nodes N to host several nodes per process), or use --transport "
                "mpi, whose CUDA messages go through host memory")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % gpus)
    delta = datetime.timedelta(seconds=timeout)
    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    try:
        store, rank, size = next(dist.rendezvous("env://", timeout=delta))
    except (RuntimeError, ValueError, TimeoutError) as exc:  # DistStoreError is a RuntimeError
        raise CommTimeout(
            f"rank {rank} could not join the torchrun world through its store at {where} within "
            f"{timeout:g} s ({_reason(exc)}); is the launcher (or rank 0) running? Raise --timeout "
            "if start-up is legitimately slower", rank=rank) from None
    store.set_timeout(delta)
    _roll_call(store, rank, size, timeout)
    try:
        dist.init_process_group(spec, store=dist.PrefixStore("default_pg", store), rank=rank,
                                world_size=size, timeout=delta)
    except (RuntimeError, TimeoutError) as exc:  # a rank died between the roll call and here
        raise CommTimeout(
            f"rank {rank}: the torchrun world's process group did not form within {timeout:g} s "
            f"({_reason(exc)}); did a rank stop or die at start-up? its own output may say why",
            rank=rank) from None
    global _STORE, _RANK
    _STORE, _RANK = store, rank
    atexit.register(destroy_process_group)


def _roll_call(store: dist.Store, rank: int, size: int, timeout: float) -> None:
    """Every rank checks in; raise :class:`CommTimeout` naming the ranks that did not within
    ``timeout`` seconds (stuck, crashed or still starting). The count is polled rather than
    waited for, so that a timeout is this one line and no warning of the store's socket."""
    store.set(_key("arrived", rank), "1")
    count = _key("arrivals", 0)
    store.add(count, 1)
    deadline = time.monotonic() + timeout
    while store.add(count, 0) < size:
        if time.monotonic() > deadline:
            try:
                missing = [r for r in range(size) if not store.check([_key("arrived", r)])]
            except (RuntimeError, TimeoutError):
                missing = []
            who = f"rank(s) {missing}" if missing else "some ranks"
            raise CommTimeout(
                f"rank {rank} waited {timeout:g} s at start-up for the other ranks of the torchrun "
                f"world: {who} never arrived (stuck, crashed or slow to start). Raise --timeout if "
                "start-up is legitimately slower", rank=rank)
        time.sleep(0.01)


def _reason(exc: BaseException) -> str:
    """torch's reason on one line, without its source location."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", " ".join(str(exc).split()))
    return text.split(". ")[0].rstrip(".") or type(exc).__name__


def leave_note(what: str, text: str) -> None:
    """Tell the other ranks, through the store, how this one ended (``failed``: its error;
    ``exited``: its script ended). Best effort: a store that is gone is ignored."""
    global _FAILED
    _FAILED |= what == "failed"
    if _STORE is None:
        return
    try:
        _STORE.set(_key(what, _RANK), text)
    except Exception:  # noqa: BLE001 (the store's server may be gone: nothing to tell)
        pass


def note_of(rank: int) -> tuple[str, str] | None:
    """How ``rank`` ended, as it told the store (``("failed", its error)`` or ``("exited",
    "")``), None when it said nothing (killed, or still running) or the store is gone."""
    if _STORE is None:
        return None
    try:
        for what in ("failed", "exited"):
            if _STORE.check([_key(what, rank)]):
                return what, _STORE.get(_key(what, rank)).decode(errors="replace")
    except Exception:  # noqa: BLE001
        return None
    return None


def destroy_process_group() -> None:
    """Tear the default process group (and the groups made beside it) down, if still alive.

    Registered with :mod:`atexit` by :func:`init_process_group`: every rank of a finished run
    reaches it, after its last message. An exit by :meth:`TorchLink.abort` (``os._exit``)
    skips it, as it should: a rank ending a failed job must not wait on its peers. A rank
    whose script ends leaves a note first (:func:`leave_note`): a peer still waiting for its
    messages then says that it stopped."""
    if dist.is_initialized():
        if not _FAILED and getattr(sys, "last_value", None) is None:  # not after an error
            leave_note("exited", "")
        dist.destroy_process_group()


class TorchLink(Link):
    """Byte messages over the default torch.distributed process group."""

    kind = "torchrun world"
    launcher = "torchrun --nproc-per-node {n}"

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise CommConfigError(
                "torch.distributed is not initialised: start the script with torchrun (e.g. "
                "torchrun --nproc-per-node 4 script.py) or call "
                "torch.distributed.init_process_group first")
        super().__init__(dist.get_rank(), dist.get_world_size())
        backend = str(dist.get_backend())
        self.moves_cuda = "nccl" in backend
        # CPU tensors need a CPU backend: one beside NCCL when the script asked for NCCL alone
        self._cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else None
        self._cpu_pg = self._cpu_group if self._cpu_group is not None else dist.group.WORLD
        """The gloo group CPU buffers are posted on (its ranks are the world's)."""

    def exchange(self, recvs: Sequence[tuple[torch.Tensor, int]],
                 sends: Sequence[tuple[torch.Tensor, int]], tag: int) -> list:
        if not recvs and not sends:
            return []
        cuda = (recvs or sends)[0][0].is_cuda
        try:
            if not cuda:
                # gloo: each posted on the group itself, as dist.irecv/isend do after their
                # checks (batch_isend_irecv's ops and coalescing pass doubled the posts' cost)
                pg = self._cpu_pg
                works = [pg.recv([buf], src, tag) for buf, src in recvs]
                works += [pg.send([buf], dst, tag) for buf, dst in sends]
                return [_Handle([w], False) for w in works]
            ops = [dist.P2POp(dist.irecv, buf, src, tag=tag) for buf, src in recvs]
            ops += [dist.P2POp(dist.isend, buf, dst, tag=tag) for buf, dst in sends]
            works = dist.batch_isend_irecv(ops)
        except RuntimeError as exc:  # a peer's connection closed before the messages were posted
            ranks = sorted({r for _, r in (*recvs, *sends)})
            error = CommError(_broken_post(self.rank, ranks, exc, self.size), rank=self.rank)
            leave_note("failed", str(error))
            raise error from None
        if len(works) == len(ops):
            return [_Handle([w], cuda) for w in works]
        batch = _Handle(works, cuda)  # NCCL coalesces a batch into one work
        return [batch] * len(ops)

    def wait(self, handles: list, *, timeout: float, peers: Sequence[Peer], what: What,
             round: int | None = None, sizes: Sequence[int] | None = None) -> None:
        """Wait for every handle before the deadline. The library does not report how many
        bytes arrived, so ``sizes`` is not checked here (the phase layout fixes them)."""
        deadline = time.monotonic() + timeout
        done: set[int] = set()
        for k, handle in enumerate(handles):
            if id(handle) in done:
                continue
            try:
                finished = handle.wait_until(deadline)
            except RuntimeError as exc:
                if "Timed out" not in str(exc):
                    blamed = peers[k][1]
                    text = (what if isinstance(what, str) else what[k]).format(timeout="{timeout}",
                                                                               round=round)
                    error = CommError(_broken(text, peers[k][0], exc, blamed, self.size), round=round,
                                      rank=self.rank)
                    leave_note("failed", str(error))
                    raise error from None
                finished = False
            if not finished:
                pending = [p for j, (h, p) in enumerate(zip(handles, peers)) if h is handle
                           and (isinstance(what, str) or what[j] == what[k])]
                ranks = sorted({q for p in pending
                                for q in (p[1] if isinstance(p[1], tuple) else (p[1],))})
                head = f"{wait_text(what, k, timeout, round)} {', '.join(p[0] for p in pending)}"
                text = (f"{head}; rank(s) {ranks} stopped answering (crashed, killed or stuck). "
                        "Raise --timeout if rounds are legitimately slower.")
                leave_note("failed", text)  # at once: a rank timing out on this one reads it
                why = _ended_meanwhile(ranks, min(NOTE_GRACE_S, timeout))
                if why:
                    text = f"{head}: {why}"
                    leave_note("failed", text)
                raise CommTimeout(text, round=round, rank=self.rank)
            done.add(id(handle))

    def abort(self, code: int) -> None:
        """Exit this process: torchrun then stops every other worker of the job."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _broken_post(rank: int, ranks: list[int], exc: BaseException, size: int) -> str:
    """The line for messages that could not even be posted: a connection to one of ``ranks``
    closed; the first rank (of them, then any other) that left a note is named with it."""
    found = _first_note(ranks, rank, size)
    if found:
        return f"rank {rank}: a connection to rank(s) {ranks} broke: {found}"
    return (f"rank {rank}: a connection to rank(s) {ranks} broke before this rank's messages "
            f"were posted (torch.distributed: {_reason(exc)}); did one die or get killed? its "
            "own output, above, may say why")


NOTE_GRACE_S = 0.5
"""After a wait timed out, how long a rank looks for a note of the ranks it waited for: one
that failed first (at nearly the same instant, waiting on the rank that stopped) is named with
its reason rather than blamed."""


def _ended_meanwhile(ranks: list[int], grace: float) -> str | None:
    """The reason the first of ``ranks`` to leave a note within ``grace`` seconds gave."""
    if _STORE is None:
        return None
    deadline = time.monotonic() + grace
    while True:
        for r in ranks:
            line = _why_ended(r)
            if line:
                return line
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _first_note(first: Sequence[int], rank: int, size: int) -> str | None:
    """The reason the first rank of ``first``, then of the others but ``rank``, left in the
    store. A broken connection is reported by gloo on whichever operation is waited for, so
    the rank that closed it may be another than the one waited for."""
    for r in [*first, *(q for q in range(size) if q != rank and q not in first)]:
        line = _why_ended(r)
        if line:
            return line
    return None


def _why_ended(rank: int) -> str | None:
    """Why ``rank`` is gone, from its note in the store (None: it left none)."""
    note = note_of(rank)
    if note is None:
        return None
    if note[0] == "exited":
        return (f"rank {rank} stopped stepping early (its script ended and its process exited "
                "normally while this rank still waits for its messages): every process must take "
                "the same number of steps (opt.step() calls, rounds)")
    return f"rank {rank} stopped after its own error: {note[1]}"


def _broken(what: str, peer: str, exc: BaseException, blamed: Any = None,
            size: int = 0) -> str:
    """The line for a wait that failed at once (a peer's connection closed), from the wait's
    ``what`` ("round t: rank r waited {timeout} for a message from") without the wait it did
    not do, and why: the peer's own note in the store when it left one (its script ended: it
    stopped stepping; or its error, which names the rank that stopped first), else the
    library's reason without its source location (it died or was killed)."""
    head, _, rest = what.partition(" waited {timeout} ")
    lead = f"{head}: the connection broke while it waited {rest or 'for'} {peer}"
    ranks = blamed if isinstance(blamed, tuple) else (blamed,) if isinstance(blamed, int) else ()
    head_rank = re.search(r"rank (\d+)", head)
    line = _first_note(ranks, int(head_rank[1]) if head_rank else -1, size)
    if line:
        return f"{lead}: {line}"
    return (f"{lead} (torch.distributed: {_reason(exc)}); did that rank die or get killed? its "
            "own output, above, may say why")


class _Handle:
    """One posted operation (or NCCL's coalesced batch), waited for against a deadline."""

    def __init__(self, works: list, cuda: bool):
        self.works = works
        self.cuda = cuda

    def wait_until(self, deadline: float) -> bool:
        """True once done; False when the deadline passed first."""
        for work in self.works:
            if self.cuda:  # NCCL: poll the work's CUDA event
                while not work.is_completed():
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0)
            else:  # gloo: a wait with a timeout (its works do not report completion otherwise)
                left = max(deadline - time.monotonic(), 1e-3)
                work.wait(timeout=datetime.timedelta(seconds=left))
        return True
