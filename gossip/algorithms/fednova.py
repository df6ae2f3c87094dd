"""FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): normalized averaging for clients that
take different numbers of local steps (docs/algorithms/fednova.md).

FedAvg's round (:class:`~gossip.algorithms.federated.FedAvg`) with clients of K_i local plain
SGD steps (``local_steps``, one K per client): client i sends its update normalized by its
steps, and the server rescales the average by the effective number of steps::

    i ∈ S → server:   d_i = (y_i − x) / K_i           (‖a_i‖₁ = K_i for plain SGD)
    server:           τ_eff = Σ_{i∈S} p_i K_i;   x ← ServerOpt(x, τ_eff Σ_{i∈S} p_i d_i)

with ``p_i = 1/|S|`` (``aggregation="mean"``) or ``n_i / Σ_{j∈S} n_j`` (``"data"``). Equal K_i:
``τ_eff d_i = y_i − x``, FedAvg itself.
"""

from __future__ import annotations

import math

import torch

from gossip.algorithms.federated import _ARGS, FedAvg
from gossip.core.block import Block


class FedNova(FedAvg):
    __doc__ = """FedNova (Wang et al. NeurIPS'20): FedAvg with updates normalized by each client's
    local steps K_i and the average rescaled by ``τ_eff = Σ p_i K_i`` (module docstring,
    docs/algorithms/fednova.md). The clients take plain steps (their ``a_i`` is all ones).
""" + _ARGS

    name = "fednova"
    takes_optimizer = False  # a_i = (1, ..., 1): plain local steps; momentum would change a_i

    def finish_local(self, block: Block, rows: list[int], down: torch.Tensor,
                     up: torch.Tensor) -> None:
        """``up[r] = (y_r − x) / K_r``: the normalized update."""
        super().finish_local(block, rows, down, up)
        for r in rows:
            up[r].div_(self.steps_of(block.ids[r]))

    def tau_eff(self, sample: list[int]) -> float:
        """``Σ_{i∈S} p_i K_i`` over this round's clients (each as often as drawn), with the
        averaging weights ``p_i`` of the uplink average."""
        if self.aggregation == "data":
            w = [self.client_weights[i - 1] for i in sample]
        else:
            w = [1.0] * len(sample)
        return math.fsum(wi * self.steps_of(i) for wi, i in zip(w, sample, strict=True)) / math.fsum(w)

    def server_update(self, block: Block, r: int, avg: torch.Tensor) -> None:
        """The server optimizer's step with ``τ_eff Σ p_i d_i``."""
        avg.mul_(self.tau_eff(block.workspace["link"].sample))
        super().server_update(block, r, avg)
