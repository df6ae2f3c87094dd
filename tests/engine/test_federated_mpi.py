"""Federated methods: the same records under mpiexec (the server a rank's node, clients several per
rank) as in one process (one launch, every scenario of tests/helpers/mpi_federated_scenarios.py)."""

from __future__ import annotations

import pytest

from tests.helpers.launch import mpiexec, scenario_records
from tests.helpers.mpi_federated_scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")]


def test_mpi_equals_in_process(tmp_path):
    a, b = scenario_records("tests/helpers/mpi_federated_scenarios.py", tmp_path, 3, 9)
    assert len(a) == len(b) == len(SCENARIOS) * 6
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    rounds = [r for r in a if r["type"] == "round"]
    first = {r["scenario"]: r for r in rounds if r["round"] == 0}
    finals = {r["scenario"]: r for r in rounds if r["round"] == 20}
    assert set(finals) == set(SCENARIOS)
    for name, r in finals.items():  # every run moved toward x*, and bits went both ways
        assert r["distance_to_optimum"] < first[name]["distance_to_optimum"], name
        assert r["bits_up_per_client"] > 0 and r["bits_down_per_client"] > 0, name
        if "cada" in name:  # workers skipped: the server learned whose upload comes across ranks
            assert 0.1 < r["skip_rate"] < 1, name


def test_gloo_equals_in_process(tmp_path):
    """The same scenarios over torch.distributed (gloo), 3 ranks."""
    from tests.helpers.launch import run_torchrun, torchrun

    if torchrun() is None:
        pytest.skip("no torchrun")
    a, b = scenario_records("tests/helpers/mpi_federated_scenarios.py", tmp_path, 3, 9,
                            launch=run_torchrun)
    assert len(a) == len(b) == len(SCENARIOS) * 6
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
