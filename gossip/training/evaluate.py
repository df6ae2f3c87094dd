"""Loss and accuracy of a module on (part of) a data set, as sums that add up across nodes.

The trainer splits evaluation work by node id, never by process: node i evaluates the averaged
model on the i-th contiguous slice of the test set, and the per-node sums are gathered and
added in node order. The result is the same in process and under MPI, and no process evaluates
the whole test set alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset


@dataclass
class Sums:
    """Summed per-sample loss, correct predictions and sample count."""

    loss: float = 0.0
    correct: float = 0.0
    count: int = 0

    @property
    def mean_loss(self) -> float:
        return self.loss / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else float("nan")


def shard(n_samples: int, n_nodes: int, node: int) -> np.ndarray:
    """Node ``node``'s contiguous slice of ``range(n_samples)`` (sizes differ by at most 1)."""
    return np.array_split(np.arange(n_samples), n_nodes)[node]


@torch.no_grad()
def evaluate(
    module: nn.Module,
    dataset: Dataset,
    indices: np.ndarray | None = None,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Sums:
    """Sum of losses and of correct top-1 predictions of ``module`` (in eval mode) on
    ``dataset[indices]`` (all of it when ``indices`` is None); restores the module's mode."""
    loss_fn = loss_fn or nn.functional.cross_entropy
    was_training = module.training
    module.eval()
    out = Sums()
    try:
        for inputs, targets in _batches(dataset, indices, batch_size):
            inputs = inputs.to(device=device, dtype=dtype) if inputs.is_floating_point() \
                else inputs.to(device)
            targets = targets.to(device)
            logits = module(inputs)
            bs = int(targets.shape[0])
            out.loss += float(loss_fn(logits, targets)) * bs
            out.correct += float((logits.argmax(dim=1) == targets).sum())
            out.count += bs
    finally:
        module.train(was_training)
    return out


def _batches(dataset: Dataset, indices: np.ndarray | None, batch_size: int):
    if isinstance(dataset, TensorDataset):
        n = len(dataset)
        idx = torch.arange(n) if indices is None else torch.as_tensor(indices, dtype=torch.int64)
        for start in range(0, idx.numel(), batch_size):
            sel = idx[start : start + batch_size]
            yield tuple(t[sel] for t in dataset.tensors[:2])
        return
    ds = dataset if indices is None else Subset(dataset, np.asarray(indices).tolist())
    yield from DataLoader(ds, batch_size=batch_size, shuffle=False)
