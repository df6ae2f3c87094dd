"""topologies: graphs, mixing matrices and per-node views for decentralized learning.

Pure networkx / numpy / scipy; nothing about tensors or MPI.

    >>> from topologies import build
    >>> topo = build("ring", 8)
    >>> round(topo.gap, 4), topo.view(0).neighbors
    (0.1953, (1, 7))
"""

from .builders import (
    complete,
    directed_exponential,
    directed_random,
    erdos_renyi,
    exponential,
    geometric,
    grid,
    hypercube,
    path,
    random_regular,
    ring,
    star,
    torus,
    watts_strogatz,
)
from .errors import (
    DisconnectedGraphError,
    GraphFileError,
    MatrixShapeError,
    MixingMatrixError,
    NegativeWeightError,
    NonFiniteWeightError,
    NoSpectralGapError,
    NotDoublyStochasticError,
    NotNeighborError,
    NotSymmetricError,
    OffGraphWeightError,
    SelfLoopError,
    SpecError,
    TopologyError,
    WeightRuleError,
)
from .factory import build
from .io import load, load_callable, relabel
from .mixing import mixing_matrix, validate
from .spec import parse
from .spectral import Spectrum, beta, lambda2, rho, spectral_gap, spectrum
from .timevarying import one_peer_exponential, random_matchings
from .topology import NodeView, TimeVaryingTopology, Topology

__all__ = [
    # entry points
    "build",
    "parse",
    "load",
    "load_callable",
    "relabel",
    # objects
    "Topology",
    "TimeVaryingTopology",
    "NodeView",
    # matrices and spectra
    "mixing_matrix",
    "validate",
    "spectrum",
    "Spectrum",
    "spectral_gap",
    "rho",
    "beta",
    "lambda2",
    # builders
    "ring",
    "path",
    "torus",
    "grid",
    "complete",
    "star",
    "hypercube",
    "exponential",
    "directed_exponential",
    "directed_random",
    "random_regular",
    "erdos_renyi",
    "geometric",
    "watts_strogatz",
    "one_peer_exponential",
    "random_matchings",
    # errors
    "TopologyError",
    "SpecError",
    "GraphFileError",
    "SelfLoopError",
    "WeightRuleError",
    "NotNeighborError",
    "MixingMatrixError",
    "MatrixShapeError",
    "NonFiniteWeightError",
    "OffGraphWeightError",
    "NegativeWeightError",
    "NotDoublyStochasticError",
    "NotSymmetricError",
    "DisconnectedGraphError",
    "NoSpectralGapError",
]
