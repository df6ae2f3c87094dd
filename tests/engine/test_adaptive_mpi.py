"""Under mpiexec the adaptive and all-reduce methods give the in-process numbers, bit for bit."""

from __future__ import annotations

import pytest

from gossip.metrics import read_jsonl
from tests.helpers.launch import mpiexec, run_mpi, scenario_records

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


# local and remote neighbors: 2 ranks x 4 and x 2 nodes, 3 ranks with 2, 2 and 1 of 5 (odd n:
# no vote ties, blocks of unequal size); train.py: 4 x 1
@pytest.mark.parametrize(("ranks", "nodes"), [(2, 8), (2, 4), (3, 5)])
def test_adaptive_mpi_equals_in_process(tmp_path, ranks, nodes):
    from tests.helpers.mpi_adaptive import SCENARIOS

    a, b = scenario_records("tests/helpers/mpi_adaptive.py", tmp_path, ranks, nodes)
    skipped = sum(1 for alg, _, _ in SCENARIOS.values() if alg == "adasum" and nodes & (nodes - 1))
    assert len(a) == len(b) == (len(SCENARIOS) - skipped) * 5
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    finals = [r for r in a if r["type"] == "round" and r["round"] == 12]
    assert all(r["bits_per_node"] > 0 for r in finals)


def test_train_script_onebit_adam_under_mpi_equals_in_process(tmp_path):
    from tests.helpers.launch import script
    from tests.helpers.train_runs import comparable

    args = ["experiments/train.py", "--algorithm", "onebit-adam", "--topology", "complete",
            "--hparam", "freeze_step=3", "eps=1e-3", "--hidden", "16", "--rounds", "8",
            "--log-every", "4", "--dtype", "float64", "--lr", "0.01"]
    res = run_mpi(4, [*args, "--out", str(tmp_path / "m.jsonl")])
    assert res.returncode == 0, res.stdout + res.stderr
    script("train").main([*args[1:], "--nodes", "4", "--out", str(tmp_path / "l.jsonl")])
    a, b = comparable(read_jsonl(tmp_path / "l.jsonl")), comparable(read_jsonl(tmp_path / "m.jsonl"))
    assert len(a) == 3 and a == b and a[-1]["bits_per_node"] > 0
