"""Transports: move byte buffers between node ids (in process, or over MPI point to point)."""

from gossip.comm.base import CommError, Transport
from gossip.comm.local import LocalTransport
from gossip.comm.mpi import CommTimeout, MPITransport

__all__ = ["CommError", "CommTimeout", "LocalTransport", "MPITransport", "Transport"]
