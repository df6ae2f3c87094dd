"""Who runs where: the process group, node placement, and collective reductions for metrics.

Reductions are written so that their floating-point results do not depend on how nodes are
spread over processes: vectors are summed in node order along a chain of ranks (exactly the
order an in-process loop uses) and per-node scalars are gathered and summed in node order.

Every reduction is made of nonblocking point-to-point byte messages waited for against the
run's deadline (``timeout``, the transport's): a rank that stops answering inside a metric
reduction, a barrier or a stop-signal vote ends the run with :class:`CommTimeout` naming it,
like a silent neighbor does during an exchange, instead of hanging the job.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping

import numpy as np
import torch

from gossip.comm.base import Transport, check_timeout
from gossip.comm.launch import launched_by_mpi, launcher_rank  # noqa: F401 (also read from here)
from gossip.errors import CommConfigError


class World:
    """This process's place among the processes of a run (a single process when ``comm`` is None)."""

    def __init__(self, comm=None, timeout: float = 120.0):
        self.comm = comm
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()
        self.timeout = check_timeout(timeout)  # seconds any wait for another rank may take

    @classmethod
    def detect(cls, timeout: float = 120.0) -> World:
        """The MPI world when started under mpiexec with more than one rank, else in process."""
        if not launched_by_mpi():
            return cls(None, timeout)
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        return cls(comm if comm.Get_size() > 1 else None, timeout)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def placement(self, n: int) -> list[int]:
        """Rank hosting each node: contiguous blocks, the first ``n % size`` ranks one larger."""
        if n < self.size:
            raise CommConfigError(
                f"{n} nodes cannot fill {self.size} MPI ranks; run mpiexec -n {n} or pass --nodes "
                f">= {self.size}", rank=self.rank,
            )
        blocks = np.array_split(np.arange(n), self.size)
        out = [0] * n
        for r, block in enumerate(blocks):
            for i in block:
                out[int(i)] = r
        return out

    def local_nodes(self, n: int) -> list[int]:
        return [i for i, r in enumerate(self.placement(n)) if r == self.rank]

    def transport(self, n: int, timeout: float | None = None) -> Transport:
        """The transport for ``n`` nodes; ``timeout`` (default: this world's) becomes the
        deadline of every wait of the run, the reductions' included."""
        from gossip.comm.local import LocalTransport

        if timeout is not None:
            self.timeout = check_timeout(timeout)
        if self.comm is None:
            return LocalTransport(n)
        from gossip.comm.mpi import MPITransport

        return MPITransport(self.comm, self.placement(n), timeout=self.timeout)

    # -- collectives (point to point, every wait against the deadline) ---------------------
    def node_values(self, n: int, local: Mapping[int, float]) -> np.ndarray:
        """All nodes' scalars (float64, indexed by node) on every process."""
        mine = np.array([local[i] for i in sorted(local)], dtype=np.float64)
        if self.comm is None:
            return mine
        placement = self.placement(n)
        sizes = [placement.count(r) * 8 for r in range(self.size)]
        out = np.empty(n, dtype=np.float64)
        self._all_to_all(mine.view(np.uint8), out.view(np.uint8), sizes, _TAG_VALUES,
                         "the per-node metric values of")
        return out

    def ordered_sum(self, n: int, local: Mapping[int, torch.Tensor]) -> torch.Tensor:
        """Σ_i x_i over all nodes, added in node order, identical on every process.

        Rank r receives the running sum of ranks < r, adds its nodes and passes it on; the
        last rank sends the total to every other rank.
        """
        acc: torch.Tensor | None = None
        last = self.size - 1
        if self.comm is not None:
            # every rank answers first, so a rank already silent is named itself rather than
            # through the chain of ranks waiting for it
            self.barrier()
        if self.comm is not None and self.rank > 0:
            like = next(iter(local.values()))
            host = torch.empty(like.shape, dtype=like.dtype)
            before = tuple(range(self.rank))
            self._wait([self.comm.Irecv([_bytes(host), self._mpi.BYTE], source=self.rank - 1,
                                        tag=_TAG_CHAIN)], [(self.rank - 1, before)],
                       "the running sum from")
            acc = host.to(like.device)
        for i in sorted(local):
            acc = local[i].clone() if acc is None else acc.add_(local[i])
        assert acc is not None
        if self.comm is None:
            return acc
        BYTE = self._mpi.BYTE
        host = acc.detach().cpu().contiguous()
        if self.rank < last:
            send = self.comm.Isend([_bytes(host), BYTE], dest=self.rank + 1, tag=_TAG_CHAIN)
            total = torch.empty_like(host)
            recv = self.comm.Irecv([_bytes(total), BYTE], source=last, tag=_TAG_SUM)
            after = tuple(range(self.rank + 1, self.size))
            self._wait([send, recv], [(self.rank + 1, (self.rank + 1,)), (last, after)],
                       "the running sum (passed from rank to rank) with")
            return total.to(acc.device)
        reqs = [self.comm.Isend([_bytes(host), BYTE], dest=r, tag=_TAG_SUM) for r in range(last)]
        self._wait(reqs, list(range(last)), "the sum to be received by")
        return acc

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any."""
        if self.comm is None:
            return flag
        out = np.empty(self.size, dtype=np.uint8)
        self._all_to_all(np.array([int(flag)], dtype=np.uint8), out, [1] * self.size, _TAG_ANY,
                         "a vote (stop signal or unreadable checkpoint) of")
        return bool(out.any())

    def barrier(self) -> None:
        """Wait until every process got here (or the deadline passes)."""
        if self.comm is not None:
            out = np.empty(self.size, dtype=np.uint8)
            self._all_to_all(np.zeros(1, dtype=np.uint8), out, [1] * self.size, _TAG_BARRIER,
                             "a barrier with")

    def _all_to_all(self, mine: np.ndarray, out: np.ndarray, sizes: list[int], tag: int,
                    what: str) -> None:
        """Rank r's ``sizes[r]`` bytes land in ``out`` at offset ``sum(sizes[:r])`` everywhere."""
        BYTE = self._mpi.BYTE
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        out[offsets[self.rank]:offsets[self.rank + 1]] = mine
        reqs, peers = [], []
        for r in range(self.size):
            if r != self.rank:
                part = out[offsets[r]:offsets[r + 1]]
                reqs.append(self.comm.Irecv([part, BYTE], source=r, tag=tag))
                peers.append(r)
        for r in range(self.size):
            if r != self.rank:
                reqs.append(self.comm.Isend([mine, BYTE], dest=r, tag=tag))
                peers.append(r)
        self._wait(reqs, peers, what)

    def _wait(self, reqs: list, peers: list, what: str) -> None:
        """``peers[k]``: the rank ``reqs[k]`` talks to, or (that rank, the ranks it waits on)."""
        from gossip.comm.mpi import wait_requests

        peers = [p if isinstance(p, tuple) else (p, (p,)) for p in peers]
        wait_requests(reqs, timeout=self.timeout, rank=self.rank,
                      peers=[(f"rank {r}", blame) for r, blame in peers],
                      what=f"metrics: rank {self.rank} waited {{timeout}} for {what}")

    @property
    def _mpi(self):
        from mpi4py import MPI

        return MPI

    def abort(self, code: int = 1) -> None:
        """Stop every process of the job (after the caller logged why). Output is flushed and
        forwarded first: ``mpiexec`` tears down the job's I/O at the abort, and a message
        still in its pipes would be lost."""
        if self.comm is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            time.sleep(_FORWARD_S)
            self.comm.Abort(code)


_FORWARD_S = 1.0  # seconds mpiexec gets to forward a rank's last output before an abort

# Tags of the reductions: above every tag the transport uses (round tags are below TAG_SPACE).
_TAG_VALUES, _TAG_CHAIN, _TAG_SUM, _TAG_ANY, _TAG_BARRIER = ((1 << 20) + k for k in range(5))


def _bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a numpy array (shared memory, any dtype)."""
    return t.reshape(-1).view(torch.uint8).numpy()
