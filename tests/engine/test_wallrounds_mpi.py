"""Synchronous rounds in wall-clock time (``free_run=SCALE`` on a synchronous algorithm,
gossip/network/clock.py): under mpiexec, one node per rank, a straggler slows the rounds in
wall time as the virtual clock predicts, and the numbers are those of a run that does not sleep
(one launch of 4 ranks: tests/helpers/mpi_wallrounds.py); a forged running sum in a paced
run is refused naming its sender (the same launch's end)."""

from __future__ import annotations

import re

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.metrics import read_jsonl
from tests.helpers.launch import mpiexec, run_mpi
from tests.helpers.mpi_wallrounds import LOG_EVERY, ROUNDS, SCENARIOS

LAUNCHES_MARKED_PER_TEST = True  # the refusals run in process (tests/conftest.py)
SCALE = 0.01
MACHINE = ("wall_s", "time_s", "compute_s", "comm_s", "run")
"""The fields that differ between a paced run and a plain one (the machine's times)."""


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
@pytest.mark.launches
@pytest.mark.alone  # paced rounds: wall time against the virtual clock (tests/conftest.py)
def test_a_straggler_slows_the_rounds_in_wall_time_as_in_virtual_time(tmp_path):
    out = tmp_path / "wall.jsonl"
    res = run_mpi(4, ["tests/helpers/mpi_wallrounds.py", str(out), str(SCALE)], timeout=120)
    # the launch ends with the rogue run: node 1's counter from the future stops a receiver
    # (node 0 or 2 on the ring), which names it and aborts the job
    rogue = re.search(r"^ROGUE rank ([02]): NodeError: .*node \1 \(rank \1\) refused the message "
                      r"from node 1 \(rank 1\): .*counter 7", res.stdout, re.M)
    assert res.returncode != 0 and rogue, res.stdout + res.stderr
    recs = [r for r in read_jsonl(out) if r["type"] == "round"]
    for name in SCENARIOS:
        paced = [r for r in recs if r["scenario"] == name and r["run"] == "paced"]
        plain = [r for r in recs if r["scenario"] == name and r["run"] == "plain"]
        assert [r["round"] for r in paced] == list(range(0, ROUNDS + 1, LOG_EVERY))
        # the same numbers: models, errors, bits, lost messages, virtual times
        strip = [{k: v for k, v in r.items() if k not in MACHINE} for r in paced]
        assert strip == [{k: v for k, v in r.items() if k not in MACHINE} for r in plain]
        assert all("wall_s" not in r for r in plain)
        # wall time = virtual time x SCALE, plus what the machine adds (~ms a round)
        assert paced[0]["wall_s"] == 0.0
        for r in paced[1:]:
            predicted = r["time_virtual_s"] * SCALE
            assert 0.97 * predicted - 0.01 <= r["wall_s"] <= 1.15 * predicted + 0.05, (name, r)
        # the straggler rules: over 24 rounds of 5x-slower exp(1) steps, far above 24 x 1 s
        assert paced[-1]["time_virtual_s"] > 2.5 * ROUNDS
    lossy = [r for r in recs if r["scenario"] == "straggler-loss" and r["run"] == "paced"]
    assert lossy[-1]["messages_lost_total"] > 0


def _engine(name: str, network: str) -> Engine:
    from gossip.problems import make_problem

    problem = make_problem("least-squares", n_nodes=4, dim=5, samples_per_node=5, seed=0,
                           dtype=torch.float64)
    return Engine(make_algorithm(name), topologies.build("ring", 4),
                  lambda i: torch.zeros(5, dtype=torch.float64), network=network,
                  oracles=lambda i, g: problem.oracle(i, g), free_run=0.01)


@pytest.mark.parametrize(("name", "network", "needle"), [
    ("dpsgd", "compute=exp:1", "needs mpiexec with one node per rank"),
    ("dpsgd", "delay=0.5", "dpsgd runs in rounds, whose wall-clock pacing sleeps the "
                           "compute=/slow= draws; delay= stays in virtual time"),
])
def test_wall_rounds_refusals(name, network, needle):
    with pytest.raises(ConfigError, match=needle):
        _engine(name, network)
