"""A rogue rank in the metric reductions under mpiexec (tests/helpers/mpi_rogue_metrics.py):
what it sends into a record's per-node values or the ordered sum of the mean model is checked
(size, and NaN/Inf that the sender's flag does not announce), and the honest rank stops with
one line naming it instead of "the run diverged"; an honest rank whose model diverged still
reads as a diverged run on every rank."""

from __future__ import annotations

import re

import pytest

from tests.helpers.launch import mpiexec, run_mpi

needs_mpi = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

EXPECTED = {  # case -> what rank 0's line says
    "sum-nan": "rank 1 sent the sum over every rank for the mean model with NaN/Inf",
    "sum-garbage": "rank 1 sent the sum over every rank for the mean model with a flag of",
    "sum-truncated": "rank 1 sent a message of 28 bytes, expected 56",
    "values-nan": "rank 1 sent the per-node values of node 1 with NaN/Inf",
    "values-garbage": "rank 1 sent the per-node values of node 1 with a flag of",
    "values-truncated": "rank 1 sent a message of 8 bytes, expected 16",
    "values-appended-1MiB": "rank 1 sent a message larger than the receive buffer",
}


@needs_mpi
@pytest.mark.slow
def test_a_rogue_rank_in_the_metrics_is_named_and_divergence_still_reads_as_such():
    from tests.helpers.mpi_rogue_metrics import CASES

    assert set(CASES) == {*EXPECTED, "honest-divergence"}
    res = run_mpi(2, ["tests/helpers/mpi_rogue_metrics.py"], timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    lines = re.findall(r"^CASE (\S+): rank (\d): (.*)$", res.stdout, re.M)
    said = {(case, int(rank)): line for case, rank, line in lines}
    for case, needle in EXPECTED.items():
        line = said[(case, 0)]
        assert line.startswith("CommError: metrics: rank 0: ") and needle in line, (case, line)
        assert "the run diverged" not in line, (case, line)
    for rank in (0, 1):
        line = said[("honest-divergence", rank)]
        assert line.startswith("DivergenceError: ") and "the run diverged" in line, line
