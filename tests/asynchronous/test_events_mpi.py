"""Asynchronous runs under mpiexec equal the same runs in one process: the same event trace
(every rank walks all of it), bits, losses, virtual times and models (one launch of 3 ranks for
8 nodes, so the placement is uneven, runs every scenario of tests/helpers/mpi_async_scenarios.py)."""

from __future__ import annotations

import pytest

from tests.helpers.launch import mpiexec, scenario_records
from tests.helpers.mpi_async_scenarios import RESUMED, SCENARIOS

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def test_asynchronous_runs_under_mpi_equal_in_process(tmp_path):
    a, b = scenario_records("tests/helpers/mpi_async_scenarios.py", tmp_path, 3, 8)
    assert len(a) == len(b) == (len(SCENARIOS) + len(RESUMED)) * 7
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("type"), ra.get("round"))
    for name in RESUMED:  # checkpointed at sweep 10 and resumed: the uninterrupted run's records
        base = name.removesuffix("-resumed")
        for recs in (a, b):
            assert ([r | {"scenario": base} for r in recs if r["scenario"] == name]
                    == [r for r in recs if r["scenario"] == base])
    finals = {r["scenario"]: r for r in a if r["type"] == "round" and r["round"] == 20}
    assert set(finals) == set(SCENARIOS) | set(RESUMED)
    for name, r in finals.items():
        assert r["activations"] == 160 and r["bits_per_node"] > 0, name
    for name in ("pairwise-lossy", "async-choco-topk", "gossip-learning-late", "async-sgp-late"):
        assert finals[name]["messages_lost_total"] > 0, name
    traces = {r["scenario"]: r for r in a if r["type"] == "trace"}
    assert all(t["events"] > 160 for t in traces.values())


@pytest.mark.alone  # a rank stopped or killed on purpose (tests/conftest.py)
def test_a_silent_rank_stops_an_asynchronous_run_naming_it(tmp_path):
    """Rank 2 stops answering (SIGSTOP) mid-run: the ranks waiting for it (in a pairwise exchange
    or a sweep's metrics) time out (5 s) naming it, the job ends, and the records logged so far
    are intact."""
    import signal

    from gossip.metrics import read_jsonl
    from tests.helpers.launch import stop_a_rank

    code, out, seconds = stop_a_rank("mpiexec", 4, ["tests/helpers/mpi_victim.py"], tmp_path,
                                     signal.SIGSTOP, settle=2.0, script_args=["async"])
    assert code != 0 and seconds < 40
    # the stop lands in an exchange with it or in a sweep's metrics, which wait for every rank
    named = ("pairwise exchange" in out and "(rank 2)" in out) or "rank(s) [2] stopped answering" in out
    assert named, out[-3000:]
    records = read_jsonl(tmp_path / "pids.jsonl")
    assert records and all(r["type"] == "round" for r in records)
    assert [r["round"] for r in records] == list(range(0, 10 * len(records), 10))
