"""Tracking, directed, momentum and primal-dual algorithms: the same records under mpiexec as
in one process (one launch, every scenario of tests/mpi_tracking_scenarios.py)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import mpiexec, run_mpi, run_py
from tests.mpi_tracking_scenarios import SCENARIOS

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def _records(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def test_mpi_equals_in_process(tmp_path):
    local, remote = tmp_path / "local.jsonl", tmp_path / "mpi.jsonl"
    res = run_py(["tests/mpi_tracking_scenarios.py", str(local), "8"])
    assert res.returncode == 0, res.stderr
    res = run_mpi(4, ["tests/mpi_tracking_scenarios.py", str(remote), "8"])
    assert res.returncode == 0, res.stdout + res.stderr
    a, b = _records(local), _records(remote)
    assert len(a) == len(b) == len(SCENARIOS) * 6
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    finals = {r["scenario"]: r for r in a if r["type"] == "round" and r["round"] == 20}
    assert set(finals) == set(SCENARIOS)
    assert all(r["bits_per_node"] > 0 for r in finals.values())
    first = {r["scenario"]: r for r in a if r["type"] == "round" and r["round"] == 0}
    for name, r in finals.items():  # every run made progress toward x*
        assert r["distance_to_optimum"] < first[name]["distance_to_optimum"], name
