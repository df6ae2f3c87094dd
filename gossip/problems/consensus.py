"""Average consensus written as an optimization problem.

``f_i(x) = ‖x − c_i‖²/2``: the minimizer of ``(1/n) Σ f_i`` is the average of the targets, so
optimization algorithms (D-PSGD, LEAD, BEER, ...) can be checked on the simplest heterogeneous
problem there is. It is **not** a finite sum (each node has one deterministic target), so only the
``full`` estimator applies.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gossip.errors import ConfigError
from gossip.problems.base import Problem, Smoothness


class Consensus(Problem):
    """``f_i(x) = ‖x − c_i‖²/2`` with per-node targets ``c_i`` (rows of ``targets``)."""

    quadratic = True
    block_gradients = True

    def __init__(
        self,
        targets: np.ndarray | torch.Tensor | Sequence,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if not isinstance(targets, torch.Tensor):
            targets = torch.as_tensor(np.asarray(targets, dtype=np.float64))
        c = targets
        if c.dim() != 2 or c.shape[0] == 0 or c.shape[1] == 0:
            raise ConfigError(
                f"targets must be an n_nodes × dim matrix, got shape {tuple(c.shape)}"
            )
        self.device = torch.device(device)
        self.dtype = dtype
        self.targets = c.to(device=self.device, dtype=dtype).contiguous()
        self.n_nodes, self.dim = (int(s) for s in self.targets.shape)
        self._last_block: tuple[tuple[int, ...], torch.Tensor, int, torch.Tensor] | None = None

    def local_loss(self, i: int, x: torch.Tensor) -> float:
        i = self.check_node(i)
        return 0.5 * float((x - self.targets[i]).square().sum())

    def grad_full(self, i: int, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        i = self.check_node(i)
        return torch.sub(x, self.targets[i], out=out)

    def grad_full_block(self, nodes: Sequence[int], X: torch.Tensor,
                        out: torch.Tensor) -> torch.Tensor:
        """``out = X − C`` with C the nodes' targets: a slice of them when the nodes are
        consecutive (a process's block), gathered otherwise. Elementwise, so every row has
        the bits of :meth:`grad_full`."""
        if len(nodes) != X.shape[0] or X.shape != out.shape:
            raise ConfigError(f"grad_full_block: {len(nodes)} nodes for X of shape "
                              f"{tuple(X.shape)} and out of shape {tuple(out.shape)}")
        key = tuple(nodes)
        last = self._last_block  # a process's block asks for the same nodes every round
        if (last is not None and last[0] == key and last[1] is self.targets
                and last[2] == self.targets._version):  # (a gathered copy follows no change)
            return torch.sub(X, last[3], out=out)
        targets = self._block_targets(nodes)
        self._last_block = (key, self.targets, self.targets._version, targets)
        return torch.sub(X, targets, out=out)

    def _block_targets(self, nodes: Sequence[int]) -> torch.Tensor:
        """The targets of ``nodes`` as [len(nodes), d] rows (checked indices)."""
        idx = np.asarray(nodes, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_nodes):
            raise ConfigError(f"grad_full_block: node indices must be in [0, {self.n_nodes})")
        first = int(idx[0]) if idx.size else 0
        if idx.size == 0 or np.array_equal(idx, np.arange(first, first + idx.size)):
            targets = self.targets[first:first + idx.size]
        else:
            targets = self.targets.index_select(0, torch.from_numpy(idx).to(self.device))
        return targets

    def local_quadratic(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``H_i = I``, ``c_i`` = the node's target (float64)."""
        i = self.check_node(i)
        return np.eye(self.dim), self.targets[i].to("cpu", torch.float64).numpy()

    def _smoothness(self) -> Smoothness:
        return Smoothness(L=1.0, L_max=1.0, mu=1.0)

    def _solve(self) -> np.ndarray:
        return self.targets.to("cpu", torch.float64).numpy().mean(axis=0)
