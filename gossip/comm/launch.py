"""Was this process started by mpiexec, and as which rank? Read from the launcher's environment
variables alone, without importing MPI or torch (``--help`` under mpiexec asks it)."""

from __future__ import annotations

import os

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpi() -> bool:
    """True when this process was started by mpiexec/mpirun (checked without importing MPI)."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (0 when not under mpiexec)."""
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0
