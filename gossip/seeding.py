"""Seeds derived from one run seed: per node (private) and per edge (shared by both ends).

Derivation is independent of how nodes are spread over processes, which is what makes an MPI
run and an in-process run draw the same numbers.
"""

from __future__ import annotations

import numpy as np
import torch

_NODE, _EDGE, _INIT = 1, 2, 3


def _derive(*words: int) -> int:
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1, np.uint64)[0] >> 1)


def node_seed(seed: int, node: int) -> int:
    """Seed of node ``node``'s private generator (compressor dither, sample draws)."""
    return _derive(seed, _NODE, node)


def edge_seed(seed: int, i: int, j: int) -> int:
    """Seed shared by the two ends of edge {i, j}, whatever the order of i and j."""
    return _derive(seed, _EDGE, min(i, j), max(i, j))


def init_seed(seed: int, node: int) -> int:
    """Seed for drawing node ``node``'s initial vector (separate from its run-time stream)."""
    return _derive(seed, _INIT, node)


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
