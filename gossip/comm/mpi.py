"""Point-to-point MPI transport: buffer-based ``Isend``/``Irecv`` of raw byte buffers only.

Receive buffers are numpy-allocated (they move about twice as fast as torch-allocated ones on
this MPICH wheel), preallocated per sending node and grown on demand. CUDA tensors are staged
through pinned host memory. Every wait busy-polls against a deadline: a silent neighbor raises
:class:`CommTimeout` naming its rank and the round instead of hanging the job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import numpy as np
import torch

from gossip.comm.base import Edge, Transport, check_timeout
from gossip.errors import CommError, CommTimeout

TAG_SPACE = 1 << 20


def wait_requests(
    reqs: list,
    *,
    timeout: float,
    rank: int,
    peers: list[tuple[str, int | tuple[int, ...]]],
    what: str,
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
    ``what`` starts the message; ``{timeout}`` in it becomes the deadline. After ``spin``
    polls each further poll yields the CPU (oversubscribed ranks). ``round`` (when known) and
    ``rank`` become the error's fields.
    """
    if not reqs:
        return
    from mpi4py import MPI

    deadline = time.monotonic() + timeout
    test = MPI.Request.Testall
    polls = 0
    while True:
        try:
            done = test(reqs, statuses) if statuses is not None else test(reqs)
        except MPI.Exception as exc:  # e.g. MPI_ERR_TRUNCATE
            raise CommError(
                f"{what.format(timeout=f'{timeout:g} s')} {', '.join(p[0] for p in peers)}: MPI "
                f"error on rank {rank}: {exc.Get_error_string()} (a neighbor sent more bytes "
                "than it announced, or a peer died)",
                round=round, rank=rank,
            ) from exc
        if done:
            return
        polls += 1
        if polls > spin and yield_cpu:
            os.sched_yield()  # let the process we wait for run
        if time.monotonic() > deadline:
            pending = [p for p, r in zip(peers, reqs) if not r.Test()]
            ranks = sorted({q for p in pending for q in (p[1] if isinstance(p[1], tuple) else (p[1],))})
            chain = any(isinstance(p[1], tuple) and len(p[1]) > 1 for p in pending)
            raise CommTimeout(
                f"{what.format(timeout=f'{timeout:g} s')} {', '.join(p[0] for p in pending)}; "
                f"{'one of ' if chain else ''}rank(s) {ranks} stopped answering (crashed, killed "
                "or stuck). Raise --timeout if rounds are legitimately slower.",
                round=round, rank=rank,
            )


class MPITransport(Transport):
    """One process per rank; nodes may be several per rank (``placement`` says where each is)."""

    spin = 100  # busy polls before each further poll yields the CPU

    def __init__(self, comm, placement: list[int], timeout: float = 120.0, yield_cpu: bool = True):
        super().__init__(placement, rank=comm.Get_rank(), world_size=comm.Get_size())
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.timeout = check_timeout(timeout)
        self.yield_cpu = yield_cpu
        self._recv_bufs: dict[Edge, np.ndarray] = {}
        self._send_stage: dict[Edge, np.ndarray] = {}
        self._rows_host: dict[str, torch.Tensor] = {}

    # -- buffers -------------------------------------------------------------------------
    def _recv_buffer(self, edge: Edge, capacity: int) -> np.ndarray:
        buf = self._recv_bufs.get(edge)
        if buf is None or buf.size < capacity:
            buf = np.empty(max(capacity, 1), dtype=np.uint8)
            self._recv_bufs[edge] = buf
        return buf

    def _host_view(self, edge: Edge, t: torch.Tensor) -> np.ndarray:
        """A numpy view of a CPU tensor, or a staged host copy of a CUDA one."""
        if t.device.type == "cpu":
            return t.contiguous().numpy()
        stage = self._send_stage.get(edge)
        if stage is None or stage.size < t.numel():
            pinned = torch.empty(t.numel(), dtype=torch.uint8, pin_memory=True)
            stage = pinned.numpy()
            self._send_stage[edge] = stage
        host = torch.from_numpy(stage[: t.numel()])
        host.copy_(t)
        return stage[: t.numel()]

    # -- the exchange --------------------------------------------------------------------
    def _exchange_remote(
        self, outgoing: Mapping[Edge, torch.Tensor], expected: Mapping[Edge, int], seq: int,
        round_: int,
    ) -> dict[Edge, torch.Tensor]:
        MPI = self._mpi
        tag = seq % TAG_SPACE
        device = next(iter(outgoing.values())).device if outgoing else torch.device("cpu")
        recv_edges = sorted(expected)
        recv_reqs, recv_bufs = [], []
        for edge in recv_edges:
            buf = self._recv_buffer(edge, expected[edge])
            recv_bufs.append(buf)
            recv_reqs.append(self.comm.Irecv([buf, MPI.BYTE], source=self.placement[edge[0]], tag=tag))
        send_reqs = []
        send_edges = sorted(outgoing)
        if any(outgoing[e].device.type == "cuda" for e in send_edges):
            torch.cuda.synchronize()
        for edge in send_edges:
            data = self._host_view(edge, outgoing[edge])
            send_reqs.append(self.comm.Isend([data, MPI.BYTE], dest=self.placement[edge[1]], tag=tag))
        statuses = [MPI.Status() for _ in recv_reqs]
        self._wait(recv_reqs, statuses, recv_edges, round_)
        self._wait(send_reqs, None, send_edges, round_, sending=True)
        received = {}
        for edge, buf, status in zip(recv_edges, recv_bufs, statuses):
            count = status.Get_count(MPI.BYTE)
            if status.Get_error() != MPI.SUCCESS:
                raise CommError(
                    f"round {round_}: message from node {edge[0]} (rank {self.placement[edge[0]]})"
                    f" to node {edge[1]} failed (larger than the {expected[edge]} bytes announced?)",
                    round=round_, sender=edge[0], receiver=edge[1], rank=self.rank,
                )
            host = torch.from_numpy(buf[:count])
            received[edge] = host if device.type == "cpu" else host.to(device, non_blocking=False)
        return received

    def exchange_rows(self, rows, plan, seq: int, round_: int) -> None:
        """A block's phase without copies on CPU: sends are row views of ``rows.own``, receives
        land in ``rows.recv`` in place (CUDA blocks go through pinned host copies)."""
        if not self._count_rows(rows, plan):
            return
        nbytes = rows.nbytes
        MPI = self._mpi
        tag = seq % TAG_SPACE
        own, recv = rows.own, rows.recv
        cuda = own.device.type != "cpu"
        if cuda:
            host_own, host_recv = self._host_rows("own", own), self._host_rows("recv", recv)
            if plan.remote_out:
                host_own.copy_(own)
        else:
            host_own, host_recv = own, recv
        on, rn = host_own.numpy(), host_recv.numpy()
        recv_edges = [(j, i) for j, i, _ in plan.remote_in]
        own_rows = len(plan.senders)  # staging row s is recv[s - own_rows]
        recv_reqs = [self.comm.Irecv([rn[s - own_rows], nbytes, MPI.BYTE],
                                     source=self.placement[j], tag=tag)
                     for j, _, s in plan.remote_in]
        send_edges = [(plan.senders[r], j) for r, j in plan.remote_out]
        send_reqs = [self.comm.Isend([on[r], nbytes, MPI.BYTE], dest=self.placement[j], tag=tag)
                     for r, j in plan.remote_out]
        statuses = [MPI.Status() for _ in recv_reqs]
        self._wait(recv_reqs, statuses, recv_edges, round_)
        self._wait(send_reqs, None, send_edges, round_, sending=True)
        for (j, i), status in zip(recv_edges, statuses):
            count = status.Get_count(MPI.BYTE)
            if status.Get_error() != MPI.SUCCESS or count != nbytes:
                raise CommError(
                    f"round {round_}: message from node {j} (rank {self.placement[j]}) to node {i}"
                    f" has {count} bytes, expected {nbytes} (the ranks run different settings?)",
                    round=round_, sender=j, receiver=i, rank=self.rank,
                )
        if cuda and plan.remote_in:
            recv.copy_(host_recv)

    def _host_rows(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        """A pinned host twin of CUDA message rows (reused while the shape holds)."""
        host = self._rows_host.get(key)
        if host is None or host.shape != rows.shape:
            host = self._rows_host[key] = torch.empty(rows.shape, dtype=torch.uint8, pin_memory=True)
        return host

    def _wait(self, reqs, statuses, edges, round_: int, sending: bool = False) -> None:
        """Wait for ``reqs`` (one per edge) against the deadline, naming the silent peers."""
        node = [e[1] if sending else e[0] for e in edges]
        wait_requests(
            reqs, statuses=statuses, timeout=self.timeout, rank=self.rank,
            peers=[(f"node {j} (rank {self.placement[j]})", self.placement[j]) for j in node],
            what=f"round {round_}: rank {self.rank} waited {{timeout}} for a "
                 f"{'send to' if sending else 'message from'}",
            spin=self.spin, yield_cpu=self.yield_cpu, round=round_,
        )

    def barrier(self) -> None:
        from gossip.comm.world import World

        World(self.comm, timeout=self.timeout).barrier()
