"""Local optimizers and learning-rate schedules, built from short names (what ``train.py`` uses).

Any ``torch.optim`` optimizer works in a :class:`~gossip.training.DecentralizedTrainer`; these
helpers only save typing. Schedules count **rounds** (one optimizer step per round; for an
asynchronous algorithm the sweeps, however many steps a node takes in one: docs/asynchronous.md);
epochs are converted with the trainer's ``rounds_per_epoch``.

Schedule = linear warm-up of the multiplier from ``warmup_start`` to 1 over ``warmup_epochs``,
then ``constant`` (1), ``step`` (× ``decay`` at every epoch in ``milestones``) or ``cosine``
(from 1 down to ``min_factor`` at the last round). Use it through
``torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(...))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from gossip.catalog import OPTIMIZERS, SCHEDULES
from gossip.errors import ConfigError


def make_optimizer(
    name: str,
    params: Iterable[nn.Parameter],
    lr: float,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    decay_1d: bool = True,
) -> torch.optim.Optimizer:
    """``sgd`` (plain), ``momentum`` (heavy ball), ``nesterov``, ``adam`` or ``adamw``.

    ``decay_1d=False`` puts tensors with ndim ≤ 1 (biases, norm weights) in a group without
    weight decay, as the ResNet recipes do.
    """
    params = list(params)
    if decay_1d or weight_decay == 0.0:
        groups: list[dict] = [{"params": params}]
    else:
        groups = [{"params": [p for p in params if p.dim() > 1]},
                  {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, weight_decay=weight_decay)
    if name in ("momentum", "nesterov"):
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=name == "nesterov")
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    raise ConfigError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def lr_multiplier(
    *,
    rounds_per_epoch: int,
    total_rounds: int,
    schedule: str = "constant",
    warmup_epochs: float = 0.0,
    warmup_start: float = 0.1,
    milestones: Sequence[float] = (),
    decay: float = 0.1,
    min_factor: float = 0.0,
) -> Callable[[int], float]:
    """``factor(step)`` for ``LambdaLR``: step 0 is the first round's optimizer step."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if rounds_per_epoch < 1 or total_rounds < 1:
        raise ConfigError(f"rounds_per_epoch and total_rounds must be >= 1, got rounds_per_epoch="
                          f"{rounds_per_epoch}, total_rounds={total_rounds}")
    warm = warmup_epochs * rounds_per_epoch
    marks = sorted(m * rounds_per_epoch for m in milestones)

    def factor(step: int) -> float:
        if step < warm:
            return warmup_start + (1.0 - warmup_start) * step / warm
        if schedule == "step":
            return decay ** sum(1 for m in marks if step >= m)
        if schedule == "cosine":
            span = max(total_rounds - 1 - warm, 1.0)
            progress = min(max((step - warm) / span, 0.0), 1.0)
            return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor
