"""Transports: move byte buffers between node ids (in process, or over MPI point to point)."""

from gossip.comm.base import Transport
from gossip.comm.local import LocalTransport
from gossip.comm.mpi import MPITransport
from gossip.errors import CommError, CommTimeout

__all__ = ["CommError", "CommTimeout", "LocalTransport", "MPITransport", "Transport"]
