"""Was this process started by mpiexec or torchrun, and as which rank? Read from the launcher's
environment variables alone, without importing MPI or torch (``--help`` under a launcher asks it)."""

from __future__ import annotations

import os

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torch.distributed's env://


def launched_by_mpi() -> bool:
    """True when this process was started by mpiexec/mpirun (checked without importing MPI)."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


def launched_by_torchrun() -> bool:
    """True when the environment names a torch.distributed job (torchrun, or a launcher that
    sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)."""
    return all(v in os.environ for v in _TORCHRUN_VARS)


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (0 when not under a launcher)."""
    names = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
    for var in names + (("RANK",) if launched_by_torchrun() else ()):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def launcher_size() -> int:
    """How many processes the launcher started (1 when not under a launcher)."""
    names = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE") + (("WORLD_SIZE",) if launched_by_torchrun() else ())
    for var in names:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1
