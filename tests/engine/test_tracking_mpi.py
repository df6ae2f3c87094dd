"""Tracking, directed, momentum and primal-dual algorithms: the same records under mpiexec as
in one process (one launch, every scenario of tests/helpers/mpi_tracking_scenarios.py)."""

from __future__ import annotations

import pytest

from tests.helpers.launch import mpiexec, scenario_records
from tests.helpers.mpi_tracking_scenarios import SCENARIOS

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def test_mpi_equals_in_process(tmp_path):
    a, b = scenario_records("tests/helpers/mpi_tracking_scenarios.py", tmp_path, 4, 8)
    assert len(a) == len(b) == len(SCENARIOS) * 6
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    finals = {r["scenario"]: r for r in a if r["type"] == "round" and r["round"] == 20}
    assert set(finals) == set(SCENARIOS)
    assert all(r["bits_per_node"] > 0 for r in finals.values())
    first = {r["scenario"]: r for r in a if r["type"] == "round" and r["round"] == 0}
    for name, r in finals.items():  # every run made progress toward x*
        assert r["distance_to_optimum"] < first[name]["distance_to_optimum"], name
        # ‖∇f(x̄)‖ (a running sum over the ranks) and the oracle counters, compared above too
        assert 0 <= r["grad_norm"] < first[name]["grad_norm"], name
        assert r["grads_per_node"] + r["prox_per_node"] >= 20, name  # admm: local solves
    for records in (a, b):  # --overlap moves gradients in time, never in value
        by = {}
        for r in records:
            by.setdefault(r["scenario"], []).append({k: v for k, v in r.items() if k != "scenario"})
        for name in SCENARIOS:
            if name.endswith("-overlap"):
                assert by[name] == by[name.removesuffix("-overlap")], name
