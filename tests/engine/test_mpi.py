"""MPI runs equal in-process runs bit for bit; bad world sizes and dead ranks fail cleanly."""

from __future__ import annotations

import signal

import pytest

from gossip.metrics import read_jsonl
from tests.helpers.launch import Beside, mpiexec, run_mpi, scenario_records, stop_a_rank

pytestmark = [pytest.mark.skipif(mpiexec() is None, reason="no mpiexec"), pytest.mark.slow]


@pytest.mark.parametrize(("ranks", "nodes"), [(4, 4), (2, 8)])
def test_mpi_equals_in_process(tmp_path, ranks, nodes):
    a, b = scenario_records("tests/helpers/mpi_scenarios.py", tmp_path, ranks, nodes)
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    scenarios = {r["scenario"] for r in a}
    assert len(scenarios) >= 8
    # runs that converge really did something: bits moved, error changed
    finals = [r for r in a if r["type"] == "round" and r["round"] == 20]
    assert all(r["bits_per_node"] > 0 for r in finals)


def test_one_node_per_rank_mixes_long_rows_as_in_process(tmp_path):
    """One node per rank with rows of 5000 entries: each rank mixes by the fused kernel (and
    sends the model it found finite without another pass), in process the block takes the
    numpy path; the records and final models are the same bits."""
    a, b = scenario_records("tests/helpers/mpi_long_rows.py", tmp_path, 4, 4)
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    assert len(a[-1]["xbar"]) == 5000


def test_consensus_script_under_mpi_matches_in_process(tmp_path):
    common = ["experiments/consensus.py", "--topology", "ring", "--dim", "64", "--rounds", "30",
              "--log-every", "10", "--dtype", "float64", "--compressor", "none", "sign",
              "--gamma", "1", "0.3"]
    with Beside([*common, "--nodes", "4", "--out", str(tmp_path / "l.jsonl")]) as local:
        res = run_mpi(4, [*common, "--out", str(tmp_path / "m.jsonl")])
    assert res.returncode == 0, res.stderr
    res2 = local.result
    assert res2.returncode == 0, res2.stderr
    strip = lambda recs: [  # noqa: E731
        {k: v for k, v in r.items() if not k.endswith("_s") and k not in ("args", "world_size")}
        for r in recs if r["type"] == "round"
    ]
    assert strip(read_jsonl(tmp_path / "m.jsonl")) == strip(read_jsonl(tmp_path / "l.jsonl"))
    assert "| run |" in res.stdout


def test_graph_size_must_match_world(tmp_path):
    graph = tmp_path / "tri.edgelist"
    graph.write_text("a b\nb c\nc a\n")
    res = run_mpi(2, ["experiments/consensus.py", "--topology", str(graph), "--rounds", "2"])
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "has 3 nodes" in out and "mpiexec -n 3" in out
    res = run_mpi(2, ["experiments/consensus.py", "--nodes", "1", "--rounds", "2"])
    assert res.returncode != 0
    assert "smaller than the MPI world" in res.stdout + res.stderr


@pytest.mark.alone  # a rank stopped or killed on purpose (tests/conftest.py)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_dead_or_silent_rank_stops_the_job(tmp_path, sig):
    """One rank is killed (SIGKILL) or stops answering (SIGSTOP) mid-run.

    Killed: mpiexec stops the whole job at once (its message names the signal). Silent: the
    neighbors' deadline (5 s here) fires, their error names rank 2, and the job is aborted.
    Either way every process exits non-zero instead of hanging.
    """
    code, out, seconds = stop_a_rank("mpiexec", 4, ["tests/helpers/mpi_victim.py"], tmp_path, sig)
    assert code != 0
    assert seconds < 40
    if sig == signal.SIGKILL:
        assert "BAD TERMINATION" in out and "signal 9" in out, out[-3000:]
    else:
        assert "rank(s) [2] stopped answering" in out, out[-3000:]
