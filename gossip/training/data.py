"""Per-node data: split any map-style ``Dataset`` over the nodes and give each node a loader.

The split reuses :func:`gossip.problems.data.partition` (``iid``, ``sorted``, ``dirichlet:ALPHA``)
on the data set's labels, seeded from the run seed only, so every process computes the same
split whatever the MPI layout. Each node's ``DataLoader`` shuffles with its own seeded
``torch.Generator`` (:func:`gossip.rng.data_seed`): the same seed gives the same
mini-batches in process and under ``mpiexec``.

A ``TensorDataset`` takes a fast path: the node's rows are gathered once into its own
``TensorDataset`` and each mini-batch is one fancy-indexing call instead of ``batch_size``
``__getitem__`` calls and a collate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    Subset,
    TensorDataset,
)

from gossip.errors import ConfigError
from gossip.problems.data import partition
from gossip.rng import data_seed, generator, partition_seed


def labels_of(dataset: Dataset) -> np.ndarray:
    """The integer label of every sample, as a numpy array.

    Uses, in order: a ``TensorDataset``'s second tensor, a ``targets`` attribute (torchvision
    style), a ``Subset`` of either, else ``dataset[i][1]`` for every ``i`` (slow, but general).
    """
    if isinstance(dataset, TensorDataset):
        if len(dataset.tensors) < 2:
            raise ConfigError("a TensorDataset needs (inputs, labels) tensors to be partitioned; got "
                               f"{len(dataset.tensors)} tensor(s): build it as TensorDataset(x, y)")
        return np.asarray(dataset.tensors[1].detach().cpu().numpy()).reshape(-1)
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        if isinstance(targets, torch.Tensor):
            return targets.detach().cpu().numpy().reshape(-1)
        return np.asarray(targets).reshape(-1)
    if isinstance(dataset, Subset):
        return labels_of(dataset.dataset)[np.asarray(dataset.indices)]
    out = []
    for i in range(len(dataset)):  # type: ignore[arg-type]
        y = dataset[i][1]
        out.append(int(y.item() if isinstance(y, torch.Tensor) else y))
    return np.asarray(out)


def partition_indices(
    dataset: Dataset, n_nodes: int, scheme: str = "iid", seed: int = 0
) -> list[np.ndarray]:
    """One sorted index array per node (see :func:`gossip.problems.data.partition`)."""
    if scheme.strip().lower().startswith("iid"):
        return partition(len(dataset), n_nodes, scheme, seed)  # type: ignore[arg-type]
    return partition(labels_of(dataset), n_nodes, scheme, seed)


def partition_dataset(
    dataset: Dataset, n_nodes: int, scheme: str = "iid", seed: int = 0
) -> list[Subset]:
    """The data set split over ``n_nodes`` nodes, one ``Subset`` each."""
    parts = partition_indices(dataset, n_nodes, scheme, seed)
    return [Subset(dataset, idx.tolist()) for idx in parts]


def node_loader(
    dataset: Dataset,
    indices: Sequence[int] | np.ndarray,
    batch_size: int,
    generator: torch.Generator,
    *,
    drop_last: bool = False,
    dtype: torch.dtype | None = None,
) -> DataLoader:
    """A shuffling ``DataLoader`` over ``dataset[indices]`` driven by ``generator``.

    ``dtype`` casts floating-point tensors of a ``TensorDataset`` once, up front (other data
    sets are cast batch by batch by the oracle).
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    if isinstance(dataset, TensorDataset):
        local = TensorDataset(*(_cast(t[idx], dtype) for t in dataset.tensors))
        sampler = BatchSampler(RandomSampler(local, generator=generator), batch_size, drop_last)
        return DataLoader(local, sampler=sampler, batch_size=None, generator=generator)
    return DataLoader(Subset(dataset, idx.tolist()), batch_size=batch_size, shuffle=True,
                      drop_last=drop_last, generator=generator)


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


class BatchStream:
    """An endless stream of mini-batches: a new shuffled pass starts when one ends.

    Its position is saved by :meth:`state_dict` as (the loader generator's state at the start
    of the current pass, batches drawn since), so a resumed run draws the same batches.

    Attributes:
        passes: completed passes over the node's data (local epochs).
    """

    def __init__(self, loader: DataLoader):
        if len(loader) == 0:
            raise ConfigError("a node's loader yields no batch (no data, or less than one batch with "
                               "drop_last=True); lower batch_size, give the node more data or set "
                               "drop_last=False")
        self.loader = loader
        self.passes = 0
        self._it: Iterator[Any] | None = None
        self._pass_state: torch.Tensor | None = None
        self._drawn = 0

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Any:
        if self._it is not None:
            try:
                batch = next(self._it)
                self._drawn += 1
                return batch
            except StopIteration:
                self.passes += 1
        self._start_pass()
        batch = next(self._it)
        self._drawn = 1
        return batch

    def _start_pass(self) -> None:
        gen = self.loader.generator
        self._pass_state = gen.get_state() if gen is not None else None
        self._it = iter(self.loader)
        self._drawn = 0

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: passes, the current pass's generator state, batches drawn."""
        return {"passes": self.passes, "pass_state": self._pass_state, "drawn": self._drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where :meth:`state_dict` was taken (replays the current pass)."""
        self.passes = int(state["passes"])
        if state.get("pass_state") is None:
            self._it, self._pass_state, self._drawn = None, None, 0
            return
        if self.loader.generator is None:
            raise ConfigError("a BatchStream whose loader has no generator cannot be restored: build the "
                               "DataLoader with generator=torch.Generator() (node_loader does)")
        self.loader.generator.set_state(state["pass_state"])
        self._start_pass()
        for _ in range(int(state["drawn"])):
            next(self._it)
        self._drawn = int(state["drawn"])


class NodeSampler(Sampler[int]):
    """Node ``node``'s part of ``dataset``, reshuffled every pass by the node's own generator:
    the samples, in the order, that :class:`~gossip.training.DecentralizedTrainer` (same
    ``seed``, ``nodes`` and ``partition``) feeds that node. For your own loop::

        loader = DataLoader(train_set, batch_size=32, sampler=NodeSampler(train_set, rank, 4))

    The split is :func:`partition_indices` with the run's partition seed, so every process
    computes the same one; an explicit ``partition`` (one index array per node) is used as is.
    Each pass draws from the node's generator what the trainer's seeded ``DataLoader`` draws
    (its base seed, then the permutation), which keeps the mini-batches equal.
    """

    def __init__(self, dataset: Dataset, node: int, nodes: int, *, seed: int = 0,
                 partition: str | Sequence[Sequence[int]] = "iid"):
        if not 0 <= int(node) < int(nodes):
            raise ConfigError(f"node {node} is not one of the {nodes} nodes (0..{int(nodes) - 1})")
        if isinstance(partition, str):
            parts = partition_indices(dataset, int(nodes), partition, partition_seed(seed))
        else:
            parts = [np.sort(np.asarray(p, dtype=np.int64)) for p in partition]
            if len(parts) != int(nodes):
                raise ConfigError(f"an explicit partition needs {nodes} index arrays, got {len(parts)}")
        self.indices = np.asarray(parts[int(node)], dtype=np.int64)
        if self.indices.size == 0:
            raise ConfigError(f"node {node} got no sample of the {len(dataset)} (partition "  # type: ignore[arg-type]
                               f"{partition!r} over {nodes} nodes): use fewer nodes or an iid split")
        self.node, self.nodes = int(node), int(nodes)
        self.generator = generator(data_seed(seed, self.node))
        self.passes = 0
        self._pass_start: torch.Tensor | None = None  # the generator when the current pass began
        self._drawn = 0  # samples handed out of the current pass
        self._skip = 0  # samples of the next pass already handed out before a checkpoint

    def __len__(self) -> int:
        return int(self.indices.size)

    def __iter__(self) -> Iterator[int]:
        gen = self.generator
        self._pass_start, self._drawn = gen.get_state(), 0
        skip, self._skip = self._skip, 0
        torch.empty((), dtype=torch.int64).random_(generator=gen)  # the loader's base seed
        for pos, k in enumerate(RandomSampler(range(len(self)), generator=gen)):
            if pos < skip:
                continue
            self._drawn = pos + 1
            yield int(self.indices[k])
        self.passes += 1
        self._pass_start, self._drawn = None, 0

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler is: the generator at the start of the current pass and the samples
        handed out of it, so that a resumed loader continues with the next batch (exact with
        ``num_workers=0``, where a DataLoader draws indices as it is asked for batches)."""
        start = self._pass_start if self._pass_start is not None else self.generator.get_state()
        return {"generator": start.clone(), "drawn": self._drawn, "passes": self.passes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the next pass replays the saved one from where it was."""
        self.generator.set_state(state["generator"])
        self._skip = int(state["drawn"])
        self.passes = int(state["passes"])
        self._pass_start, self._drawn = None, 0
