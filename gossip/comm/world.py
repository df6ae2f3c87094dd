"""Who runs where: the process group (MPI or torch.distributed), node placement, and reductions.

Reductions are written so that their floating-point results do not depend on how nodes are
spread over processes: vectors are summed in node order along a chain of ranks (exactly the
order an in-process loop uses) and per-node scalars are gathered and summed in node order.

Every reduction is made of nonblocking point-to-point byte messages waited for against the
run's deadline (``timeout``, the transport's): a rank that stops answering inside a metric
reduction, a barrier or a stop-signal vote ends the run with :class:`CommTimeout` naming it,
like a silent neighbor does during an exchange, instead of hanging the job.

What a rank receives in a reduction is checked before it is used, as a round's messages are:
its size (exactly what the settings give), and for the metrics' values (:meth:`World.node_values`,
:meth:`World.ordered_sum`) that they are finite unless the sender says they are not. Each such
message ends with one float64 *flag*: 1.0 when the rank's own numbers are not all finite (its
model diverged: the caller's divergence check then names the run as diverged, as in process),
else 0.0. NaN/Inf that no flag announces, or a flag that is neither, is what a corrupt message
or a faulty rank sends, and stops the run with :class:`CommError` naming the sender, instead of
reading as "the run diverged".
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from gossip.comm.base import Transport, check_latency, check_timeout
from gossip.comm.launch import (
    launched_by_mpi,
    launched_by_torchrun,
    launcher_rank,
    launcher_size,
)
from gossip.comm.link import Link
from gossip.errors import CommConfigError, CommError, CommTimeout


class World:
    """This process's place among the processes of a run (a single process when ``link`` is None),
    and how its messages travel.

    Args:
        link: the processes' link (None: this process alone, every node in it).
        timeout: seconds any wait for another rank (or a neighbor's message) may take before
            the run stops naming it; the deadline of every transport this world makes.
        link_latency: seconds every phase's messages take to arrive on top of the real
            transfer (a simulated link delay, to measure what overlap hides); default 0.
    """

    def __init__(self, link: Link | None = None, timeout: float = 120.0,
                 link_latency: float = 0.0):
        self.link = link
        self.rank = 0 if link is None else link.rank
        self.size = 1 if link is None else link.size
        self.timeout = check_timeout(timeout)
        self.link_latency = check_latency(link_latency)

    def configure(self, *, timeout: float | None = None,
                  link_latency: float | None = None) -> World:
        """Set :attr:`timeout` and :attr:`link_latency` (None: unchanged), checked as in the
        constructor; returns the world (``Engine(..., world=World.detect().configure(...))``)."""
        if timeout is not None:
            self.timeout = check_timeout(timeout)
        if link_latency is not None:
            self.link_latency = check_latency(link_latency)
        return self

    @classmethod
    def detect(cls, timeout: float = 120.0, transport: str = "auto",
               device: str | torch.device | None = None, link_latency: float = 0.0) -> World:
        """The world this process was started in: ``transport`` ``mpi`` (mpiexec),
        ``gloo``/``nccl``/``torch`` (torchrun; ``torch`` picks NCCL for a CUDA ``device``, else
        gloo), ``local`` (in process), or ``auto``: whichever launcher started it.

        A world of one process is in process. A torch.distributed process group the script
        initialised itself is used as it is. ``timeout`` bounds the start-up too (torchrun's
        rendezvous); ``link_latency`` as in the constructor. The outcome is remembered for
        :meth:`current`."""
        check_latency(link_latency)  # refused before any rendezvous
        _DETECTED["failed"] = True  # until it returns: an error here leaves no world to join
        world = cls._detect(timeout, transport, device).configure(link_latency=link_latency)
        _DETECTED.update(world=world, failed=False)
        return world

    @classmethod
    def current(cls) -> World:
        """The world of this process for an error handler, never waiting on a start-up again:
        the last one :meth:`detect` returned; a process alone (rank from the launcher) when
        detection failed (the ranks never formed a group); else detected now (an error before
        the script looked for its world: all ranks meet the same one)."""
        if _DETECTED["world"] is not None:
            return _DETECTED["world"]
        if _DETECTED["failed"]:
            alone = cls(None)
            alone.rank = launcher_rank()  # so that rank 0 alone prints what every rank met
            return alone
        return cls.detect()

    @classmethod
    def _detect(cls, timeout: float, transport: str,
                device: str | torch.device | None) -> World:
        if transport not in TRANSPORTS:
            raise CommConfigError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
        cuda = device is not None and torch.device(device).type == "cuda"
        if transport == "auto":
            transport = ("mpi" if launched_by_mpi() else
                         "torch" if launched_by_torchrun() or _torch_initialized() else "local")
        if transport == "local":
            _alone_or_refuse("--transport local runs every node in this process")
            return cls(None, timeout)
        if transport == "mpi":
            from mpi4py import MPI

            from gossip.comm.mpi import MPILink

            comm = MPI.COMM_WORLD
            if comm.Get_size() == 1:
                _alone_or_refuse("--transport mpi found no MPI job (a world of one process)")
            return cls(MPILink(comm) if comm.Get_size() > 1 else None, timeout)
        if not (launched_by_torchrun() or _torch_initialized()):
            raise CommConfigError(
                f"--transport {transport} needs a torch.distributed job: start the script with "
                "torchrun (e.g. torchrun --nproc-per-node 4 script.py ...), or use --transport mpi "
                "under mpiexec")
        from gossip.comm import torch_dist

        backend = ("nccl" if cuda else "gloo") if transport == "torch" else transport
        if cuda and backend == "gloo":
            raise CommConfigError(
                "--transport gloo moves CPU tensors only and the run is on CUDA: use --transport "
                "nccl (or torch) for GPUs, or --device cpu")
        if not cuda and backend == "nccl":
            raise CommConfigError(
                "--transport nccl moves CUDA tensors only and the run is on the CPU: use "
                "--transport gloo (or torch), or --device cuda")
        torch_dist.init_process_group(backend, timeout)
        link = torch_dist.TorchLink()
        if cuda and not link.moves_cuda:
            raise CommConfigError(
                "the torch.distributed process group has no NCCL backend and the run is on CUDA: "
                "initialise it with backend 'nccl' (or 'cpu:gloo,cuda:nccl'), or use --device cpu")
        return cls(link if link.size > 1 else None, timeout)

    @property
    def kind(self) -> str:
        """The world's name in messages: "MPI world", "torchrun world" (or "world" in process)."""
        return "world" if self.link is None else self.link.kind

    def launch_hint(self, n: int) -> str:
        """How to start a world of ``n`` processes like this one."""
        return (MPI_HINT if self.link is None else self.link.launcher).format(n=n)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def placement(self, n: int) -> list[int]:
        """Rank hosting each node: contiguous blocks, the first ``n % size`` ranks one larger."""
        if n < self.size:
            raise CommConfigError(
                f"{n} nodes cannot fill {self.size} ranks; run {self.launch_hint(n)} or pass "
                f"--nodes >= {self.size}", rank=self.rank,
            )
        return np.repeat(np.arange(self.size), self._shares(n)).tolist()  # (no per-node loop)

    def _shares(self, n: int) -> list[int]:
        """Nodes per rank, as :func:`numpy.array_split` deals them (the first ``n % size`` one more)."""
        base, extra = divmod(n, self.size)
        return [base + (r < extra) for r in range(self.size)]

    def local_nodes(self, n: int) -> list[int]:
        """This rank's nodes (a contiguous block of ids, :meth:`placement`)."""
        if n < self.size:
            self.placement(n)  # (refuses it, saying how to fix)
        shares = self._shares(n)
        first = sum(shares[: self.rank])
        return list(range(first, first + shares[self.rank]))

    def transport(self, n: int) -> Transport:
        """The transport for ``n`` nodes: :attr:`timeout` is the deadline of its every wait
        (the reductions' too), :attr:`link_latency` holds each phase back."""
        from gossip.comm.local import LocalTransport

        if self.link is None:
            transport: Transport = LocalTransport(n)
        else:
            transport = Transport(self.placement(n), rank=self.rank, link=self.link,
                                  timeout=self.timeout)
        transport.latency = self.link_latency
        return transport

    # -- collectives (point to point, every wait against the deadline) ---------------------
    def node_values(self, n: int, local: Mapping[int, Any],
                    what: str = "metrics: the per-node values of", width: int = 0) -> np.ndarray:
        """All nodes' scalars (float64, indexed by node) on every process; ``what`` names the
        exchange in a timeout ("metrics: ..." for the metrics, else what it is for).
        ``width`` > 0: each node gives ``width`` floats (a sequence), gathered in one exchange
        into an ``[n, width]`` array."""
        w = max(width, 1)
        mine = np.array([local[i] for i in sorted(local)], dtype=np.float64).reshape(-1)
        if self.link is None:
            return mine.reshape(-1, width) if width else mine
        placement = self.placement(n)
        counts = [w * placement.count(r) for r in range(self.size)]
        sent = np.append(mine, _flag(np.isfinite(mine).all()))  # the values, then the flag
        got = np.empty(w * n + self.size, dtype=np.float64)
        self._all_to_all(sent.view(np.uint8), got.view(np.uint8), [8 * (c + 1) for c in counts],
                         _TAG_VALUES, what)
        out, at = np.empty(w * n, dtype=np.float64), 0
        for r, count in enumerate(counts):
            values = got[at + r: at + r + count]  # rank r's section: its values, then its flag
            if r != self.rank:
                first, last = at // w, (at + count) // w - 1
                nodes = f"node {first}" if first == last else f"nodes {first}..{last}"
                self._check_values(bool(np.isfinite(values).all()), float(got[at + r + count]),
                                   r, f"{what.removeprefix('metrics: ')} {nodes}")
            out[at: at + count] = values
            at += count
        return out.reshape(-1, width) if width else out

    def ordered_sum(self, local: Mapping[int, torch.Tensor]) -> torch.Tensor:
        """Σ_i x_i over all nodes, added in node order, identical on every process.

        Rank r receives the running sum of ranks < r, adds its nodes and passes it on; the
        last rank sends the total to every other rank.
        """
        acc: torch.Tensor | None = None
        last = self.size - 1
        if self.link is not None:
            # every rank answers first, so a rank already silent is named itself rather than
            # through the chain of ranks waiting for it
            self.barrier("metrics: the barrier before the running sum with")
        if self.link is not None and self.rank > 0:
            like = next(iter(local.values()))
            got = _flagged(torch.empty(like.shape, dtype=like.dtype))
            before = tuple(range(self.rank))
            self._wait([(got, self.rank - 1)], [], _TAG_CHAIN, [(self.rank - 1, before)],
                       "metrics: the running sum from")
            host = self._check_sum(got, like, self.rank - 1,
                                   f"the running sum of ranks 0..{self.rank - 1}")
            acc = host.to(like.device)
        for i in sorted(local):
            acc = local[i].clone() if acc is None else acc.add_(local[i])
        assert acc is not None
        if self.link is None:
            return acc
        host = acc.detach().cpu().contiguous()
        sent = _flagged(host, bool(torch.isfinite(host).all()))
        if self.rank < last:
            total = torch.empty_like(sent)
            after = tuple(range(self.rank + 1, self.size))
            self._wait([(total, last)], [(sent, self.rank + 1)], _TAG_SUM,
                       [(last, after), (self.rank + 1, (self.rank + 1,))],
                       "metrics: the running sum (passed from rank to rank) with",
                       send_tag=_TAG_CHAIN)
            return self._check_sum(total, host, last, "the sum over every rank").to(acc.device)
        self._wait([], [(sent, r) for r in range(last)], _TAG_SUM, list(range(last)),
                   "metrics: the sum to be received by")
        return acc

    def _check_sum(self, got: torch.Tensor, like: torch.Tensor, sender: int,
                   what: str) -> torch.Tensor:
        """The tensor (shaped like ``like``) of a flagged sum from ``sender``, checked."""
        values, flag = _unflagged(got, like)
        self._check_values(bool(torch.isfinite(values).all()), flag, sender,
                           f"{what} for the mean model")
        return values

    def _check_values(self, finite: bool, flag: float, sender: int, what: str) -> None:
        """Refuse, naming ``sender``, values that are not all ``finite`` while its flag does
        not announce it, or a flag that is neither 0 nor 1 (module doc)."""
        if flag == 0.0 and finite or flag == 1.0:
            return
        wrong = (f"a flag of {flag!r} (0 or 1 are sent)" if flag not in (0.0, 1.0) else
                 "NaN/Inf that its flag does not announce (a rank whose model diverged says so)")
        raise CommError(f"metrics: rank {self.rank}: rank {sender} sent {what} with {wrong}: a "
                        f"corrupt message or a faulty rank; check rank {sender}'s process and "
                        "host", rank=self.rank)

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any."""
        if self.link is None:
            return flag
        out = np.empty(self.size, dtype=np.uint8)
        self._all_to_all(np.array([int(flag)], dtype=np.uint8), out, [1] * self.size, _TAG_ANY,
                         "a vote (stop signal or unreadable checkpoint) of")
        return bool(out.any())

    def all_stop(self, within: float) -> bool:
        """True when every process calls this within ``within`` seconds (they all met the same
        error and may exit together, with no abort); False when one does not answer."""
        if self.link is None:
            return True
        saved, self.timeout = self.timeout, min(self.timeout, within)
        try:
            out = np.empty(self.size, dtype=np.uint8)
            self._all_to_all(np.ones(1, dtype=np.uint8), out, [1] * self.size, _TAG_STOP,
                             "a vote to stop with")
            return True
        except CommTimeout:
            return False
        finally:
            self.timeout = saved

    def barrier(self, what: str = "a barrier with") -> None:
        """Wait until every process got here (or the deadline passes); ``what`` names it in
        the timeout's message."""
        if self.link is not None:
            out = np.empty(self.size, dtype=np.uint8)
            self._all_to_all(np.zeros(1, dtype=np.uint8), out, [1] * self.size, _TAG_BARRIER,
                             what)

    def _all_to_all(self, mine: np.ndarray, out: np.ndarray, sizes: list[int], tag: int,
                    what: str) -> None:
        """Rank r's ``sizes[r]`` bytes land in ``out`` at offset ``sum(sizes[:r])`` everywhere."""
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        out[offsets[self.rank]:offsets[self.rank + 1]] = mine
        others = [r for r in range(self.size) if r != self.rank]
        recvs = [(torch.from_numpy(out[offsets[r]:offsets[r + 1]]), r) for r in others]
        sends = [(torch.from_numpy(mine), r) for r in others]
        self._wait(recvs, sends, tag, others + others, what)

    def _wait(self, recvs: list, sends: list, tag: int, peers: list, what: str,
              send_tag: int | None = None) -> None:
        """Post ``recvs``/``sends`` ((byte tensor, rank) pairs) and wait for them against the
        deadline. ``peers[k]``: the rank the k-th message (receives first) talks to, or (that
        rank, the ranks it waits on); ``send_tag``: the sends' tag, when not ``tag``."""
        assert self.link is not None
        if send_tag is None or not sends:
            handles = self.link.exchange(recvs, sends, tag)
        else:
            handles = self.link.exchange(recvs, [], tag) + self.link.exchange([], sends, send_tag)
        peers = [p if isinstance(p, tuple) else (p, (p,)) for p in peers]
        purpose = "metrics: " if what.startswith("metrics: ") else ""  # else a barrier or a vote
        text = f"{purpose}rank {self.rank} waited {{timeout}} for {what.removeprefix(purpose)}"
        try:
            self.link.wait(handles, timeout=self.timeout, what=text,
                           peers=[(f"rank {r}", blame) for r, blame in peers],
                           sizes=[buf.numel() for buf, _ in recvs])
        except CommTimeout as exc:
            if not any(len(blame) > 1 for _, blame in peers):
                raise
            silent = self._silent_ranks()  # a chain of ranks: ask every rank who is still there
            if not silent:
                raise
            raise CommTimeout(
                f"{text.format(timeout=f'{self.timeout:g} s')} rank {peers[0][0]}; rank(s) "
                f"{silent} stopped answering (crashed, killed or stuck: the other ranks answered "
                "a roll call). Raise --timeout if rounds are legitimately slower.",
                round=exc.round, rank=self.rank) from None

    def _silent_ranks(self) -> list[int]:
        """The ranks that do not answer a roll call (a byte to and from every rank) within
        ``min(timeout, 10 s)``: the ranks still alive all enter it when their own waits time
        out, so what is left is the rank that stopped."""
        assert self.link is not None
        others = [r for r in range(self.size) if r != self.rank]
        inbox = torch.empty(len(others), dtype=torch.uint8)
        handles = self.link.exchange([(inbox[k:k + 1], r) for k, r in enumerate(others)],
                                     [(torch.ones(1, dtype=torch.uint8), r) for r in others],
                                     _TAG_ROLL)
        deadline = time.monotonic() + min(self.timeout, 10.0)
        silent = []
        for r, handle in zip(others, handles):
            try:
                self.link.wait([handle], timeout=max(deadline - time.monotonic(), 1e-3),
                               peers=[(f"rank {r}", r)], what="a roll call: {timeout} for")
            except CommTimeout:
                silent.append(r)
        return silent

    def abort(self, code: int = 1) -> None:
        """Stop every process of the job (after the caller logged why)."""
        if self.link is not None:
            self.link.abort(code)


def _alone_or_refuse(what: str) -> None:
    """Refuse a world of one process where the launcher started several: each process would
    run the whole job by itself, writing the same log and checkpoints at once."""
    size = launcher_size()
    if size > 1:
        launcher = "torchrun" if launched_by_torchrun() else "mpiexec"
        raise CommConfigError(
            f"{what}, but {launcher} started {size} processes: each would run the whole job and "
            f"write the same files; leave --transport out (auto) to join them, or start the "
            "script without a launcher")


def _torch_initialized() -> bool:
    """A torch.distributed process group exists already (the script made it)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


TRANSPORTS = ("auto", "local", "mpi", "torch", "gloo", "nccl")
_DETECTED: dict = {"world": None, "failed": False}
"""The outcome of this process's last :meth:`World.detect` (see :meth:`World.current`)."""
MPI_HINT = "mpiexec -n {n}"  # the launcher named to a run in process

# Tags of the reductions: above every tag the transport uses (round tags are below TAG_SPACE).
_TAG_VALUES, _TAG_CHAIN, _TAG_SUM, _TAG_ANY, _TAG_BARRIER, _TAG_ROLL, _TAG_STOP = (
    (1 << 20) + k for k in range(7))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous CPU tensor (shared memory, any dtype)."""
    return t.reshape(-1).view(torch.uint8)


def _flag(finite: bool) -> float:
    """A rank's flag on its metric values (module doc): 0.0 when all are finite, else 1.0."""
    return 0.0 if finite else 1.0


def _flagged(t: torch.Tensor, finite: bool = True) -> torch.Tensor:
    """A contiguous CPU tensor's bytes followed by its 8-byte flag (one new uint8 buffer)."""
    return torch.cat([_bytes(t), torch.tensor([_flag(finite)], dtype=torch.float64).view(torch.uint8)])


def _unflagged(got: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The tensor shaped like ``like`` and the flag of a :func:`_flagged` buffer. The flag's 8
    bytes are copied before they are read as a float64: they follow the values, so they start
    at any byte (28 for 7 float32 entries), where a float64 view is refused."""
    nbytes = got.numel() - 8
    values = got[:nbytes].view(like.dtype).view(like.shape)
    return values, float(got[nbytes:].clone().view(torch.float64)[0])
