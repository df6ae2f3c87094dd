"""The README's recipe for a 4-rank gossip.wrap run in one process: examples/train_gossip_nodes.py
(nodes=4 in one process) prints what mpiexec -n 4 examples/train_gossip.py prints."""

from __future__ import annotations

import re

import pytest

from tests.helpers.launch import Beside, mpiexec, run_mpi


@pytest.mark.slow
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_four_nodes_in_one_process_equal_four_ranks():
    steps = ["--steps", "30"]  # past the first epoch of every node's data (12 batches)
    with Beside(["examples/train_gossip_nodes.py", "--nodes", "4", *steps], timeout=180) as nodes:
        ranks = run_mpi(4, ["examples/train_gossip.py", *steps], timeout=180)
    one = nodes.result
    assert one.returncode == 0, one.stderr[-3000:]
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    line = re.search(r"steps 30 .*test accuracy 0\.\d+", one.stdout)
    assert line, one.stdout
    assert line.group(0) in ranks.stdout, (one.stdout, ranks.stdout)
    assert len(re.findall(r"test accuracy", ranks.stdout)) == 1, ranks.stdout  # rank 0 prints
