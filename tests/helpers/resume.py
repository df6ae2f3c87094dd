"""Resume-equals-uninterrupted, the engine's way: one run straight through, and one stopped,
saved (``torch.save`` of its node and run state, loaded back with ``weights_only=True``, as a
checkpoint file is) and resumed in a fresh engine."""

from __future__ import annotations

import io
from collections.abc import Callable

import torch

from gossip.engine import Engine


def stopped_and_resumed(make_engine: Callable[[], Engine], rounds: int,
                        stop: int) -> tuple[Engine, Engine]:
    """``(straight, resumed)``: ``make_engine()`` run ``rounds`` rounds, and another run
    ``stop`` rounds, saved, loaded into a third ``make_engine()`` and run to ``rounds``."""
    straight = make_engine()
    for _ in range(rounds):
        straight.step()
    first = make_engine()
    for _ in range(stop):
        first.step()
    buf = io.BytesIO()
    torch.save({"nodes": first.node_state_dicts(), "run": first.run_state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = make_engine()
    resumed.load_state_dicts(saved["nodes"], saved["run"])
    for _ in range(rounds - stop):
        resumed.step()
    return straight, resumed
