"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, ICLR 2021): federated learning with
dynamic regularization (docs/algorithms/feddyn.md).

Client k keeps ``g_k`` (its last ``∇L_k(θ_k)``, 0 at the start), the server ``h`` (0 at the
start). One round, for the clients P drawn this round, on FedAvg's star round
(:class:`~gossip.algorithms.federated.FedAvg`), with K local steps approximating the client's
argmin::

    client k ∈ P:   θ_k ≈ argmin_θ  L_k(θ) − ⟨g_k, θ⟩ + (α/2) ‖θ − x‖²
                      K times  y ← y − η (∇L_k(y) − g_k + α (y − x)),  from y = x
    k → server:     Δ_k = θ_k − x  (compressed as FedAvg's uplink)
    client k:       g_k ← g_k − α Δ̂_k
    server:         h ← h − α (1/N) Σ_{k∈P} Δ̂_k;   x ← ServerOpt(x, (1/|P|) Σ Δ̂_k) − h/α

Δ̂_k is what the server receives (Δ_k when exact): the clients move g_k by it, so ``h`` stays
``(1/N) Σ_k g_k`` under compression too (our choice, as SCAFFOLD's c). α = 0 is FedAvg: ``h``
stays 0 and its term is dropped.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gossip.algorithms.federated import _ARGS, FedAvg
from gossip.core.algorithm import check_range
from gossip.core.block import Block
from gossip.core.star import StarLink
from gossip.errors import ConfigError


class FedDyn(FedAvg):
    __doc__ = """FedDyn (Acar et al. ICLR'21): clients add the dynamic regularizer
    ``−⟨g_k, θ⟩ + (α/2)‖θ − x‖²`` to their loss and move ``g_k`` by ``−α Δ_k``; the server
    keeps ``h = (1/N) Σ_k g_k`` and subtracts ``h/α`` from the average (module docstring,
    docs/algorithms/feddyn.md).

    Args:
        alpha: the regularization weight α >= 0 (the paper's 0.01 .. 0.1; 0: FedAvg).
""" + _ARGS

    name = "feddyn"
    state_copies = 16  # FedAvg's and the g_k / h rows

    def __init__(self, alpha: float = 0.01, clients_per_round: int | None = None,
                 local_steps: int | list[int] = 5, eta: float = 0.01, sampling: str = "uniform",
                 availability: float = 1.0, server_optimizer: str | None = None,
                 server_lr: float | None = None, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3, weight_decay: float = 0.0, uplink_memory: str | None = "auto",
                 client_weights: list[float] | None = None,
                 downlink_compressor: str | None = None, aggregation: str = "mean",
                 selection: str = "sampled", candidates: int | None = None):
        check_range("alpha", alpha, 0.0, math.inf, "FedDyn's regularization weight α",
                    include_low=True)
        super().__init__(clients_per_round, local_steps, eta, sampling, availability,
                         server_optimizer, server_lr, beta1, beta2, tau, weight_decay,
                         uplink_memory, client_weights, downlink_compressor, aggregation,
                         selection, candidates)
        self.alpha = float(alpha)

    def validate(self, topology: Any, compressor: Any) -> None:
        """FedAvg's checks; the plain average only (``h`` is the clients' plain mean)."""
        super().validate(topology, compressor)
        if self.aggregation != "mean":
            raise ConfigError("feddyn averages its clients plainly (its h is the mean of the "
                              "clients' g_k): use aggregation 'mean'")

    def setup(self, block: Block) -> None:
        block.state["feddyn.g"] = torch.zeros_like(block.x)  # g_k (clients), h (server)
        super().setup(block)

    def correction(self, block: Block, rows: list[int], y: torch.Tensor,
                   down: torch.Tensor, out: torch.Tensor) -> None:
        d, g = y.shape[1], block.state["feddyn.g"]
        for r in rows:  # − g_k + α (y − x)
            out[r].sub_(g[r])
            if self.alpha:
                out[r].add_(y[r] - down[r, :d], alpha=self.alpha)

    def after_upload(self, block: Block, link: StarLink, rows: list[int]) -> None:
        """``g_k ← g_k − α Δ̂_k``, by what the server adds (Δ_k itself when exact)."""
        if not self.alpha:
            return
        g, up = block.state["feddyn.g"], block.workspace["up"]
        link.delivered(up)
        for r in rows:
            g[r].sub_(up[r], alpha=self.alpha)

    def server_update(self, block: Block, r: int, avg: torch.Tensor) -> None:
        """``h ← h − α (|P|/N) avg``, the server optimizer's step, then ``x ← x − h/α``."""
        super().server_update(block, r, avg)
        if not self.alpha:
            return
        link, h = block.workspace["link"], block.state["feddyn.g"][r]
        h.sub_(avg, alpha=self.alpha * len(link.sample) / link.sampler.clients)
        block.x[r].sub_(h, alpha=1.0 / self.alpha)
