"""Seeds of a training run, derived from the one run seed.

The engine's own streams (``gossip.seeding``: node and edge generators) stay untouched; the
training side draws from separate streams so that adding data shuffling or a model never
shifts a compressor's randomness. Every seed depends only on (run seed, purpose, node id), never
on the MPI layout, which keeps in-process and MPI runs equal.
"""

from __future__ import annotations

import numpy as np

_MODEL, _DATA, _SPLIT, _PARTITION = 11, 12, 13, 14


def derive(*words: int) -> int:
    """A 63-bit seed from non-negative integers (``numpy.random.SeedSequence``)."""
    state = np.random.SeedSequence([int(w) for w in words]).generate_state(1, np.uint64)[0]
    return int(state >> 1)


def model_seed(seed: int) -> int:
    """Seed for initialising the model (the same initial model on every node and process)."""
    return derive(seed, _MODEL)


def data_seed(seed: int, node: int) -> int:
    """Seed of node ``node``'s mini-batch shuffling."""
    return derive(seed, _DATA, node)


def split_seed(seed: int) -> int:
    """Seed of the train/test split of a built-in data set."""
    return derive(seed, _SPLIT)


def partition_seed(seed: int) -> int:
    """Seed of the split of the training set over the nodes."""
    return derive(seed, _PARTITION)
