"""Who runs where: the process group, node placement, and collective reductions for metrics.

Reductions are written so that their floating-point results do not depend on how nodes are
spread over processes: vectors are summed in node order along a chain of ranks (exactly the
order an in-process loop uses) and per-node scalars are gathered and summed in node order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import torch

from gossip.comm.base import Transport

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpi() -> bool:
    """True when this process was started by mpiexec/mpirun (checked without importing MPI)."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


class World:
    """This process's place among the processes of a run (a single process when ``comm`` is None)."""

    def __init__(self, comm=None):
        self.comm = comm
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()

    @classmethod
    def detect(cls) -> World:
        """The MPI world when started under mpiexec with more than one rank, else in process."""
        if not launched_by_mpi():
            return cls(None)
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        return cls(comm if comm.Get_size() > 1 else None)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def placement(self, n: int) -> list[int]:
        """Rank hosting each node: contiguous blocks, the first ``n % size`` ranks one larger."""
        if n < self.size:
            raise ValueError(
                f"{n} nodes cannot fill {self.size} MPI ranks; run mpiexec -n {n} or pass --nodes "
                f">= {self.size}"
            )
        blocks = np.array_split(np.arange(n), self.size)
        out = [0] * n
        for r, block in enumerate(blocks):
            for i in block:
                out[int(i)] = r
        return out

    def local_nodes(self, n: int) -> list[int]:
        return [i for i, r in enumerate(self.placement(n)) if r == self.rank]

    def transport(self, n: int, timeout: float = 120.0) -> Transport:
        from gossip.comm.local import LocalTransport

        if self.comm is None:
            return LocalTransport(n)
        from gossip.comm.mpi import MPITransport

        return MPITransport(self.comm, self.placement(n), timeout=timeout)

    # -- collectives -----------------------------------------------------------------------
    def node_values(self, n: int, local: Mapping[int, float]) -> np.ndarray:
        """All nodes' scalars (float64, indexed by node) on every process."""
        mine = np.array([local[i] for i in sorted(local)], dtype=np.float64)
        if self.comm is None:
            return mine
        from mpi4py import MPI

        placement = self.placement(n)
        counts = [placement.count(r) for r in range(self.size)]
        out = np.empty(n, dtype=np.float64)
        self.comm.Allgatherv([mine, MPI.DOUBLE], [out, (counts, None), MPI.DOUBLE])
        return out

    def ordered_sum(self, n: int, local: Mapping[int, torch.Tensor]) -> torch.Tensor:
        """Σ_i x_i over all nodes, added in node order, identical on every process."""
        acc: torch.Tensor | None = None
        if self.comm is not None and self.rank > 0:
            like = next(iter(local.values()))
            host = np.empty(like.numel(), dtype=_np_dtype(like.dtype))
            self.comm.Recv([host, _mpi_type(like.dtype)], source=self.rank - 1, tag=7)
            acc = torch.from_numpy(host).to(like.device).view_as(like)
        for i in sorted(local):
            acc = local[i].clone() if acc is None else acc.add_(local[i])
        assert acc is not None
        if self.comm is None:
            return acc
        host = np.ascontiguousarray(acc.detach().cpu().numpy())
        if self.rank < self.size - 1:
            self.comm.Send([host, _mpi_type(acc.dtype)], dest=self.rank + 1, tag=7)
        self.comm.Bcast([host, _mpi_type(acc.dtype)], root=self.size - 1)
        return torch.from_numpy(host).to(acc.device).view_as(acc)

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any."""
        if self.comm is None:
            return flag
        from mpi4py import MPI

        buf = np.array([1 if flag else 0], dtype=np.int32)
        out = np.empty(1, dtype=np.int32)
        self.comm.Allreduce([buf, MPI.INT], [out, MPI.INT], op=MPI.MAX)
        return bool(out[0])

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        """Stop every process of the job (after the caller logged why)."""
        if self.comm is not None:
            self.comm.Abort(code)


def _np_dtype(dtype: torch.dtype):
    return {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}[dtype]


def _mpi_type(dtype: torch.dtype):
    from mpi4py import MPI

    return {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE, torch.float16: MPI.BYTE}[dtype]
