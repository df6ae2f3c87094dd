"""experiments/train.py --free-run under mpiexec: a model trained in wall-clock order (one node
per rank, node 0 five times slower) ends, logs its trajectory at the common wall instants and
learns the digits; the straggler's node records show its fewer steps. Outside mpiexec the run
is refused in one line before it trains."""

from __future__ import annotations

import pytest

from gossip.metrics import read_jsonl
from tests.helpers.launch import mpiexec, run_mpi, script

pytestmark = pytest.mark.alone  # a free run: steps per wall second (tests/conftest.py)
EVERY = 24  # sweeps between snapshots: 2 epochs of the digits' 12 sweeps (4 nodes, batch 32)


@pytest.mark.slow
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_train_free_run_logs_its_trajectory_learns_and_shows_the_straggler(tmp_path):
    out = tmp_path / "run.jsonl"
    res = run_mpi(4, ["experiments/train.py", "--algorithm", "ad-psgd", "--hidden", "32",
                      "--epochs", "8", "--eval-every", "2", "--lr", "0.2", "--free-run", "0.02",
                      "--network", "compute=exp:1;slow=nodes:0x5", "--no-progress",
                      "--out", str(out)], timeout=150)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| ad-psgd none |" in res.stdout and "wall s" in res.stdout
    recs = read_jsonl(out)
    rounds = [r for r in recs if r["type"] == "round"]
    nodes = [r for r in recs if r["type"] == "node"]
    assert recs[-1]["type"] == "summary" and recs[-1]["status"] == "ok"
    # the trajectory: the start, one record per instant (2, 4, 6 epochs), the end
    assert [r["round"] for r in rounds] == [0, EVERY, 2 * EVERY, 3 * EVERY, 4 * EVERY]
    assert [r["epoch"] for r in rounds] == [0.0, 2.0, 4.0, 6.0, 8.0]
    for rec in rounds[1:-1]:
        assert rec["wall_s"] == pytest.approx(rec["round"] * 0.02)
        assert rec["train_loss"] is not None and rec["lr"] == pytest.approx(0.2)
        assert {"test_accuracy", "worst_node_accuracy", "consensus_error"} <= rec.keys()
    steps = [r["local_steps"] for r in rounds]
    assert steps == sorted(steps) and steps[-1] > steps[1] > 0
    losses = [r["train_loss"] for r in rounds[1:]]
    assert losses[-1] < 0.5 * losses[0]
    end = rounds[-1]
    assert end["test_accuracy"] > 0.8, end  # chance is 0.1
    assert end["routed_around"] == 0 and end["wall_s"] >= 4 * EVERY * 0.02
    # node records: every node at every instant; node 0 (5x slower) took the fewest steps
    assert sorted((r["round"], r["node"]) for r in nodes) == [
        (k * EVERY, i) for k in (1, 2, 3) for i in range(4)]
    last = {r["node"]: r for r in nodes if r["round"] == 3 * EVERY}
    assert all(last[0]["local_steps"] < 0.6 * last[i]["local_steps"] for i in (1, 2, 3)), last
    assert all(r["train_loss"] == r["train_loss"] for r in last.values())  # not NaN: it stepped


def test_train_free_run_outside_mpiexec_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="needs mpiexec with one node per rank") as err:
        script("train").main(["--algorithm", "ad-psgd", "--nodes", "4", "--hidden", "8",
                              "--epochs", "1", "--free-run", "0.01"])
    assert "\n" not in str(err.value)
