"""Pytest setup for every test: one torch thread, and the `launches` mark.

A test that starts several processes (``mpiexec``, ``torchrun``, a rank stopped on purpose) is
marked ``launches``: those tests time out ranks and wait on each other, so ``make test`` runs
them after the in-process tests, which it spreads over the cores (pytest-xdist), two at a time
(their ranks leave about half of two cores idle while they wait on each other). A launching
test whose outcome depends on timing (a free run's steps per wall second, paced rounds, a rank
stopped or killed on purpose, whose neighbours' error lines race the launcher's teardown and
deadlines) is also marked ``alone``: ``make test`` runs those last, one at a time, with
nothing beside them (run two at a time, a killed rank's torchrun job was ended before a
neighbour printed its line).

By default a whole module is marked, from its source (it names a launcher or a launching helper
of tests/helpers/launch.py): the safe side. A module that mixes in-process tests with launching
ones (or only names a launcher in its strings) says ``LAUNCHES_MARKED_PER_TEST = True`` and marks
its launching tests itself (``@pytest.mark.launches``); its other tests (single-process runs of a
script included) join the parallel phase. The helpers of tests/helpers/launch.py refuse to start
several processes from a test not marked, so a launching test left unmarked fails at once,
naming the mark, rather than running beside others.
Shared helpers live in tests/helpers/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers import launch

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
        module = getattr(item, "module", None)
        if getattr(module, "LAUNCHES_MARKED_PER_TEST", False):
            continue
        if _starts_processes(Path(item.path)):
            item.add_marker(pytest.mark.launches)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: a launching test whose outcome depends on "
                            "timing; make test runs these one at a time (tests/conftest.py)")


@pytest.fixture(autouse=True)
def _launches_only_when_marked(request: pytest.FixtureRequest):
    """Let the test start several processes only when it is marked ``launches``."""
    launch.LAUNCHES_ALLOWED = request.node.get_closest_marker("launches") is not None
    yield
    launch.LAUNCHES_ALLOWED = True
