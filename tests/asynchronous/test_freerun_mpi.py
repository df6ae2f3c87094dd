"""Free-running asynchronous runs under mpiexec (gossip/engine/freerun.py): one node per rank,
wall-clock order; they end without a hang, learn, and route around a rank that stops
answering (tests/helpers/mpi_freerun.py)."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.metrics import read_jsonl
from tests.helpers.launch import mpiexec, run_mpi

needs_mpi = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def _free_run(tmp_path, *args):
    out = tmp_path / "run.jsonl"
    res = run_mpi(4, ["tests/helpers/mpi_freerun.py", str(out), *args], timeout=60)
    return res, (read_jsonl(out) if out.exists() else [])


@needs_mpi
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
def test_a_silent_rank_is_routed_around_and_named(tmp_path):
    res, recs = _free_run(tmp_path, "ad-psgd", "none", "3.0", "2")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "node 2 (rank 2) did not answer node 1 within 3 s: routed around it" in out, out[-3000:]
    assert "node 2 (rank 2) did not answer node 3 within 3 s: routed around it" in out
    assert "rank(s) [2] stopped answering" in out  # the final metrics need every rank
    assert [r["round"] for r in recs] == [0]


@pytest.mark.parametrize(("name", "kw", "needle"), [
    ("ad-psgd", {}, "needs mpiexec with one node per rank"),
    ("dpsgd", {}, "runs in rounds"),
])
def test_free_run_refusals(name, kw, needle):
    from gossip.problems import make_problem

    problem = make_problem("least-squares", n_nodes=4, dim=5, samples_per_node=5, seed=0,
                           dtype=torch.float64)
    with pytest.raises(ConfigError, match=needle):
        Engine(make_algorithm(name), topologies.build("ring", 4), lambda i: torch.zeros(5, dtype=torch.float64),
               oracles=lambda i, g: problem.oracle(i, g), free_run=0.01, **kw)
