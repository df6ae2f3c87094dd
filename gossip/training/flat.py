"""A module's tensors in one flat buffer, so that a node's model — and a message — is one tensor.

:func:`bind` re-points a module's parameters (and, as an option, its floating-point buffers
such as BatchNorm running statistics) to views into a flat vector. The module keeps its
``Parameter`` objects, so an optimizer built on ``module.parameters()`` still works, and every
``optimizer.step()`` writes straight into the flat vector the gossip step reads. Nothing is
copied after binding.

Order (documented because messages depend on it): every parameter in ``module.named_modules()``
order, each module's own ``_parameters`` in registration order (the order of
``module.named_parameters()``), then — with ``buffers=True`` — every floating-point buffer in
the same order. Integer buffers (``num_batches_tracked``) never enter the flat vector.
"""

from __future__ import annotations

import torch
from torch import nn

from gossip.errors import ConfigError, ConfigTypeError
from gossip.layout import Layout


def parameters(module: nn.Module) -> list[nn.Parameter]:
    """The module's parameters in flat-buffer order (shared parameters once)."""
    return [p for _, p in module.named_parameters()]


def float_buffers(module: nn.Module) -> list[torch.Tensor]:
    """The module's floating-point buffers in flat-buffer order (shared buffers once)."""
    return [b for _, b in module.named_buffers() if b.is_floating_point()]


def tensors(module: nn.Module, buffers: bool = False) -> list[torch.Tensor]:
    """What the flat vector holds: parameters, then float buffers when ``buffers``."""
    return parameters(module) + (float_buffers(module) if buffers else [])


def layout_of(module: nn.Module, buffers: bool = False) -> Layout:
    """The :class:`~gossip.layout.Layout` of the flat vector (shapes in flat order)."""
    return Layout.from_tensors(tensors(module, buffers))


def numel(module: nn.Module, buffers: bool = False) -> int:
    """Entries in the flat vector."""
    return sum(t.numel() for t in tensors(module, buffers))


def flatten(module: nn.Module, buffers: bool = False) -> torch.Tensor:
    """A new flat vector holding the module's current values (a copy)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors(module, buffers)])


def split(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views into ``flat`` shaped like the tensors of ``like``, back to back."""
    total = sum(t.numel() for t in like)
    if flat.dim() != 1 or flat.numel() != total:
        raise ConfigError(
            f"expected a flat tensor of {total} entries, got shape {tuple(flat.shape)}"
        )
    out, pos = [], 0
    for t in like:
        out.append(flat[pos : pos + t.numel()].view(t.shape))
        pos += t.numel()
    return out


def bind(module: nn.Module, flat: torch.Tensor, buffers: bool = False) -> list[torch.Tensor]:
    """Make the module's parameters (and float buffers) views into ``flat``; returns the views.

    ``flat`` keeps its values: it is the model from now on (the module's old values are
    dropped). The module must already have ``flat``'s dtype and device.
    """
    targets = tensors(module, buffers)
    views = split(flat, targets)
    for t, v in zip(targets, views, strict=True):
        if t.dtype != v.dtype or t.device != v.device:
            raise ConfigTypeError(
                f"the module holds {t.dtype} on {t.device} but the flat vector is {v.dtype} on "
                f"{v.device}; move the module first (module.to(dtype=..., device=...))"
            )
        t.data = v
    return views


def load(module: nn.Module, flat: torch.Tensor, buffers: bool = False) -> None:
    """Copy ``flat`` into the module's parameters (and float buffers), without binding."""
    with torch.no_grad():
        targets = tensors(module, buffers)
        for t, v in zip(targets, split(flat, targets), strict=True):
            t.copy_(v)

