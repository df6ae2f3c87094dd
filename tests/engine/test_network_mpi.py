"""Message loss, late messages (and virtual time) under mpiexec: the same seed gives the same
drops, lags, bytes, virtual times and trajectories as in one process (one launch of 2 ranks, 4
nodes each, runs every scenario of tests/helpers/mpi_network_scenarios.py)."""

from __future__ import annotations

import pytest

from tests.helpers.launch import mpiexec, scenario_records
from tests.helpers.mpi_network_scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")]


def test_lossy_runs_under_mpi_equal_in_process(tmp_path):
    a, b = scenario_records("tests/helpers/mpi_network_scenarios.py", tmp_path, 2, 8)
    assert len(a) == len(b) == len(SCENARIOS) * 6
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    finals = {r["scenario"]: r for r in a if r["type"] == "round" and r["round"] == 20}
    assert set(finals) == set(SCENARIOS)
    for name, r in finals.items():  # every scenario lost (or held late) messages, and sent some
        counted = "messages_late_total" if "stale=" in SCENARIOS[name][5] else "messages_lost_total"
        assert r[counted] > 0 and r["bits_per_node"] > 0, name
        assert ("time_virtual_s" in r) == (name == "dpsgd-timed"), name
        assert ("nodes_active" in r) == ("active=" in SCENARIOS[name][5]), name
    assert finals["dpsgd-timed"]["time_virtual_s"] > 20  # 20 rounds, each the slowest of 8 exp(1) steps
