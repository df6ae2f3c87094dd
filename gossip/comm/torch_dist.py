"""The torch.distributed link: ``batch_isend_irecv`` of byte tensors (gloo on CPU, NCCL on GPUs).

Started by ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``). CPU byte tensors travel over gloo; with NCCL, CUDA rows are sent from device
memory and the world's small CPU reductions go over a gloo group beside it. Waits have the
run's deadline: gloo's are bounded waits, NCCL's polls of the work's completion, so a silent
rank ends the run with :class:`CommTimeout` naming it, as under MPI.
"""

from __future__ import annotations

import atexit
import datetime
import os
import re
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from gossip.comm.link import Link, Peer
from gossip.errors import CommConfigError, CommError, CommTimeout

BACKENDS = ("gloo", "nccl")


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
    dist.init_process_group(spec, timeout=datetime.timedelta(seconds=timeout))
    atexit.register(destroy_process_group)


def destroy_process_group() -> None:
    """Tear the default process group (and the groups made beside it) down, if still alive.

    Registered with :mod:`atexit` by :func:`init_process_group`: every rank of a finished run
    reaches it, after its last message. An exit by :meth:`TorchLink.abort` (``os._exit``)
    skips it, as it should: a rank ending a failed job must not wait on its peers."""
    if dist.is_initialized():
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
        self.backend = "nccl" if self.moves_cuda else "gloo"
        # CPU tensors need a CPU backend: one beside NCCL when the script asked for NCCL alone
        self._cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else None

    def exchange(self, recvs: Sequence[tuple[torch.Tensor, int]],
                 sends: Sequence[tuple[torch.Tensor, int]], tag: int) -> list:
        if not recvs and not sends:
            return []
        cuda = (recvs or sends)[0][0].is_cuda
        group = None if cuda else self._cpu_group
        ops = [dist.P2POp(dist.irecv, buf, src, group=group, tag=tag) for buf, src in recvs]
        ops += [dist.P2POp(dist.isend, buf, dst, group=group, tag=tag) for buf, dst in sends]
        works = dist.batch_isend_irecv(ops)
        if len(works) == len(ops):
            return [_Handle([w], cuda) for w in works]
        batch = _Handle(works, cuda)  # NCCL coalesces a batch into one work
        return [batch] * len(ops)

    def wait(self, handles: list, *, timeout: float, peers: Sequence[Peer], what: str,
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
                    raise CommError(_broken(what, peers[k][0], exc), round=round,
                                    rank=self.rank) from exc
                finished = False
            if not finished:
                pending = [p for h, p in zip(handles, peers) if h is handle]
                ranks = sorted({q for p in pending
                                for q in (p[1] if isinstance(p[1], tuple) else (p[1],))})
                raise CommTimeout(
                    f"{what.format(timeout=f'{timeout:g} s')} {', '.join(p[0] for p in pending)}; "
                    f"rank(s) {ranks} stopped answering (crashed, killed or stuck). Raise "
                    "--timeout if rounds are legitimately slower.", round=round, rank=self.rank)
            done.add(id(handle))

    def abort(self, code: int) -> None:
        """Exit this process: torchrun then stops every other worker of the job."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _broken(what: str, peer: str, exc: BaseException) -> str:
    """The line for a wait that failed at once (a peer's connection reset: it died or was
    killed), from the wait's ``what`` ("round t: rank r waited {timeout} for a message from")
    without the wait it did not do, and the library's reason without its source location."""
    head, _, rest = what.partition(" waited {timeout} ")
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # gloo's "[.../pair.cc:537] "
    reason = text.split(". ")[0].rstrip(".")
    return (f"{head}: the connection broke while it waited {rest or 'for'} {peer} "
            f"(torch.distributed: {reason}); did that rank die or get killed? its own output, "
            "above, may say why")


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
