"""Non-smooth regularizers ``r`` with their proximal operators (docs/algorithms/prox-lead.md).

``r`` is shared by all nodes and belongs to the *average* objective ``(1/n) Σ f_i + r``; every
node applies ``prox_{ηr}`` locally (Prox-LEAD's last line), so no scaling by ``n`` is involved.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from gossip.errors import ConfigError


@runtime_checkable
class Regularizer(Protocol):
    """What a problem's ``regularizer`` offers."""

    def prox(self, v: torch.Tensor, eta: float, out: torch.Tensor | None = None) -> torch.Tensor:
        """``argmin_x r(x) + ‖x − v‖²/(2η)``, written into ``out`` when given (may alias ``v``)."""
        ...

    def value(self, x: torch.Tensor) -> float:
        """``r(x)``."""
        ...


class L1:
    """``r(x) = lam · ‖x‖₁``; its prox is soft thresholding ``sign(v) ⊙ max(|v| − η·lam, 0)``."""

    def __init__(self, lam: float):
        lam = float(lam)
        if not np.isfinite(lam) or lam < 0:
            raise ConfigError(f"the L1 weight must be a finite number >= 0, got {lam}")
        self.lam = lam

    def prox(self, v: torch.Tensor, eta: float, out: torch.Tensor | None = None) -> torch.Tensor:
        eta = float(eta)
        if not eta > 0:
            raise ConfigError(f"the prox step eta must be > 0, got {eta}")
        res = F.softshrink(v, self.lam * eta)
        if out is None:
            return res
        return out.copy_(res)

    def value(self, x: torch.Tensor) -> float:
        return self.lam * float(x.abs().sum())

    def prox_numpy(self, v: np.ndarray, eta: float) -> np.ndarray:
        """The same prox on a float64 numpy array (used by the central solver and tests)."""
        t = self.lam * eta
        return np.sign(v) * np.maximum(np.abs(v) - t, 0.0)

    def __repr__(self) -> str:
        return f"L1(lam={self.lam})"
