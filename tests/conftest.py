"""Pytest setup for every test: one torch thread, and the `launches` mark.

A test module that starts several processes (``mpiexec``, ``torchrun``, a rank stopped on purpose)
is marked ``launches`` as a whole, from its source: those tests time out ranks and wait on each
other, so ``make test`` runs them one at a time after the in-process tests, which it spreads over
the cores (pytest-xdist). A module can also mark itself with ``pytestmark = pytest.mark.launches``.
Shared helpers live in tests/helpers/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

LAUNCHES = re.compile(r"mpiexec|torchrun|run_mpi|run_torchrun|stop_a_rank|scenario_records|"
                      r"launch_command")
"""What a module's source names when it starts several processes (tests/helpers/launch.py)."""

_launching: dict[Path, bool] = {}


def _starts_processes(path: Path) -> bool:
    if path not in _launching:
        _launching[path] = bool(LAUNCHES.search(path.read_text(encoding="utf-8")))
    return _launching[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_processes(Path(item.path)):
            item.add_marker(pytest.mark.launches)
