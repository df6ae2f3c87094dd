"""Free-running asynchronous runs under mpiexec (gossip/network/freerun.py): one node per rank,
wall-clock order; they end without a hang, learn, log their trajectory (node records as they
go, round records at common wall instants), route around a rank that stops answering,
keeping what it logged before (tests/helpers/mpi_freerun.py), and lose and delay messages
from the keyed draws (tests/helpers/mpi_freerun_loss.py)."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.metrics import read_jsonl
from gossip.network.freerun import NODE_FIELDS
from tests.helpers.launch import mpiexec, run_mpi

LAUNCHES_MARKED_PER_TEST = True  # the refusals run in process (tests/conftest.py)
needs_mpi = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
pytestmark = pytest.mark.alone  # free runs: steps per wall second (tests/conftest.py)


def _free_run(tmp_path, *args):
    out = tmp_path / "run.jsonl"
    res = run_mpi(4, ["tests/helpers/mpi_freerun.py", str(out), *args], timeout=60)
    return res, (read_jsonl(out) if out.exists() else [])


@needs_mpi
@pytest.mark.launches
@pytest.mark.parametrize("name", ["ad-psgd", "gossip-learning"])
def test_a_free_run_with_a_straggler_ends_and_learns(tmp_path, name):
    res, recs = _free_run(tmp_path, name, "compute=exp:1;slow=nodes:0x5", "1.0")
    assert res.returncode == 0, res.stdout + res.stderr
    start, end = recs
    assert end["round"] == 100 and end["routed_around"] == 0
    assert end["local_steps"] > 40 and end["bits_per_node"] > 0
    assert end["consensus_error"] < 0.05 * start["consensus_error"]
    assert 1.0 <= end["wall_s"] < 20


@needs_mpi
@pytest.mark.launches
@pytest.mark.slow
def test_a_free_run_logs_its_trajectory(tmp_path):
    """Snapshots every 10 sweeps (0.1 s here): node records as rank 0 got them, each node's
    in its order, with steps and bits growing; the round records of the instants agree with them exactly (the
    same snapshots) and lead up to the end record, which is the one a run without them has."""
    res, recs = _free_run(tmp_path, "ad-psgd", "compute=exp:1;slow=nodes:0x5", "1.0", "-1", "10")
    assert res.returncode == 0, res.stdout + res.stderr
    start, end = recs[0], recs[-1]
    nodes = [r for r in recs if r["type"] == "node"]
    rounds = [r for r in recs if r["type"] == "round"][1:-1]
    assert recs == [start, *nodes, *rounds, end]
    assert start["round"] == 0 and start["wall_s"] == 0 and start["local_steps"] == 0
    # the end record, as without snapshots
    assert end["round"] == 100 and end["routed_around"] == 0
    assert {"local_steps", "wall_s", "consensus_error", "distance_to_optimum"} <= end.keys()
    assert end["consensus_error"] < 0.05 * start["consensus_error"]
    # node records: all nodes at every instant before the end, each node's in its order
    assert set(NODE_FIELDS) | {"distance_to_optimum", "loss"} <= nodes[0].keys()
    assert sorted((r["round"], r["node"]) for r in nodes) == [
        (k, i) for k in range(10, 100, 10) for i in range(4)]
    walls = [r["wall_s"] for r in nodes]
    assert 0.1 <= min(walls) and max(walls) < end["wall_s"]
    for i in range(4):
        mine = [r for r in nodes if r["node"] == i]
        assert [r["round"] for r in mine] == list(range(10, 100, 10))
        assert [r["wall_s"] for r in mine] == sorted(r["wall_s"] for r in mine)
        for key in ("local_steps", "bits_sent"):
            assert [r[key] for r in mine] == sorted(r[key] for r in mine), (i, key)
        assert mine[-1]["local_steps"] >= (5 if i == 0 else 30)  # 90 sweeps, 5x slower or not
    # round records at the instants: the nodes' snapshots combined
    assert [r["round"] for r in rounds] == list(range(10, 100, 10))
    for rec in rounds:
        mine = [r for r in nodes if r["round"] == rec["round"]]
        assert rec["wall_s"] == pytest.approx(rec["round"] / 100)
        assert 0 <= rec["snapshot_lag_s"] <= max(r["wall_s"] for r in mine) - rec["wall_s"] + 1e-9
        assert rec["local_steps"] == sum(r["local_steps"] for r in mine)
        assert rec["bits_per_node"] == pytest.approx(sum(r["bits_sent"] for r in mine) / 4)
        assert rec["distance_to_optimum"] == pytest.approx(
            sum(r["distance_to_optimum"] for r in mine) / 4, rel=1e-12)
    steps = [r["local_steps"] for r in [*rounds, end]]
    bits = [r["bits_per_node"] for r in [*rounds, end]]
    assert steps == sorted(steps) and bits == sorted(bits)
    last = rounds[-1]  # 0.1 s before the budget's end: near the end state
    assert end["distance_to_optimum"] / 3 < last["distance_to_optimum"] < 3 * end["distance_to_optimum"]


@needs_mpi
@pytest.mark.launches
def test_a_silent_rank_is_routed_around_and_named(tmp_path):
    """Rank 2 stops (SIGSTOP) after 1 s of 3: the others finish; the node records sent so
    far, its own up to the stop included, are written before the final metrics stop the job."""
    res, recs = _free_run(tmp_path, "ad-psgd", "none", "3.0", "2", "10")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "node 2 (rank 2) did not answer node 1 within 3 s: routed around it" in out, out[-3000:]
    assert "node 2 (rank 2) did not answer node 3 within 3 s: routed around it" in out
    assert "rank(s) [2] did not send the end of their node records within 3 s" in out
    assert "rank(s) [2] stopped answering" in out  # the final metrics need every rank
    assert [r["round"] for r in recs if r["type"] == "round"] == [0]
    nodes = [r for r in recs if r["type"] == "node"]
    stopped = [r["round"] for r in nodes if r["node"] == 2]
    assert 1 <= len(stopped) <= 4 and stopped == list(range(10, 10 * len(stopped) + 1, 10))
    for i in (0, 1, 3):
        assert [r["round"] for r in nodes if r["node"] == i] == list(range(10, 100, 10))


@needs_mpi
@pytest.mark.launches
@pytest.mark.slow
def test_a_killed_rank_leaves_the_node_records_written_so_far(tmp_path):
    """Rank 2 kills itself (SIGKILL) after 1 s of 3, and mpiexec ends the whole job at once:
    the node records rank 0 got until then are in the log already (they used to be written
    only after the run, so the log kept round 0 alone)."""
    res, recs = _free_run(tmp_path, "ad-psgd", "none", "3.0", "kill:2", "10")
    assert res.returncode != 0
    assert recs[0]["type"] == "round" and recs[0]["round"] == 0
    nodes = [r for r in recs[1:] if r["type"] == "node"]
    assert len(nodes) == len(recs) - 1  # nothing but node records after round 0
    for i in range(4):  # the instants every 0.3 s before the kill, each node's in its order
        rounds = [r["round"] for r in nodes if r["node"] == i]
        assert 2 <= len(rounds) and rounds == list(range(10, 10 * len(rounds) + 1, 10)), (i, recs)
    assert max(r["wall_s"] for r in nodes) < 2.0


@needs_mpi
@pytest.mark.launches
def test_free_runs_lose_and_delay_messages_from_the_keyed_draws(tmp_path):
    """loss=0.1 (and delay= on posts): every node lost exactly the messages the keyed draws
    say for what it sent on each arc; the runs end without a hang and reach consensus;
    async-choco's two ends of every arc keep the same copy; posts delayed a tenth of the run
    are held that long: the last tenth's are still on their way at the end
    (tests/helpers/mpi_freerun_loss.py)."""
    from tests.helpers.mpi_freerun_loss import SCENARIOS

    out = tmp_path / "loss.jsonl"
    res = run_mpi(4, ["tests/helpers/mpi_freerun_loss.py", str(out), "1.0"], timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    recs = read_jsonl(out)
    start, end, check = [r for r in recs if r["scenario"] == "late"]
    assert end["round"] == 100 and end["messages_lost_total"] == 0
    # posts held 10 virtual s (0.1 wall s) of 100: about the last tenth still on their way
    assert 0.03 < check["dropped_in_flight"] / end["messages"] < 0.25, (check, end)
    for name in SCENARIOS:
        if name == "late":
            continue
        start, end, check = [r for r in recs if r["scenario"] == name]
        assert (start["round"], end["round"], check["type"]) == (0, 100, "check")
        assert check["lost"] == check["drawn"], name
        assert end["messages_lost_total"] == sum(check["lost"]) > 0, name
        assert 0.05 < end["messages_lost_total"] / end["messages"] < 0.2, name
        assert end["routed_around"] == 0 and end["wall_s"] < 10, name
        assert end["consensus_error"] < 0.05 * start["consensus_error"], name
    check = next(r for r in recs if r["type"] == "check" and r["scenario"] == "async-choco")
    assert check["copies_gap"] < 1e-9


@pytest.mark.parametrize(("name", "kw", "needle"), [
    ("ad-psgd", {}, "needs mpiexec with one node per rank"),
    ("dpsgd", {}, "needs mpiexec with one node per rank"),  # rounds paced: test_wallrounds_mpi
    ("ad-psgd", {"network": "delay=0.5"}, "ad-psgd's pairwise exchanges take no virtual time"),
    ("gossip-learning", {"network": "churn=rate:0.1,mean_away:2"}, "churn= and stale= are "
                                                                   "modeled in virtual time"),
])
def test_free_run_refusals(name, kw, needle):
    from gossip.problems import make_problem

    problem = make_problem("least-squares", n_nodes=4, dim=5, samples_per_node=5, seed=0,
                           dtype=torch.float64)
    with pytest.raises(ConfigError, match=needle):
        Engine(make_algorithm(name), topologies.build("ring", 4), lambda i: torch.zeros(5, dtype=torch.float64),
               oracles=lambda i, g: problem.oracle(i, g), free_run=0.01, **kw)
