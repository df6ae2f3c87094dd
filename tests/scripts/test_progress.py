"""``--progress`` is on by default when stderr is a terminal and off otherwise; ``--no-progress``
(or ``no-progress = true`` in a run file) turns it off."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from tests.helpers.launch import ROOT


def _progress_used(tmp_path, *flags: str, terminal: bool) -> bool:
    """The ``progress`` value a short consensus run recorded, with stderr a pty or a pipe."""
    log = tmp_path / f"run{len(list(tmp_path.iterdir()))}.jsonl"
    cmd = [sys.executable, "experiments/consensus.py", "--nodes", "4", "--rounds", "2", "--dim",
           "4", "--out", str(log), *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if terminal:
        leader, follower = pty.openpty()
        try:
            res = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=follower,
                                 timeout=120)
        finally:
            os.close(follower)
            os.close(leader)
    else:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert res.returncode == 0
    config = json.loads(log.read_text().splitlines()[0])
    return config["args"]["progress"]


@pytest.mark.parametrize("flags, terminal, expected", [
    ((), True, True), ((), False, False), (("--no-progress",), True, False),
    (("--progress",), False, True),
])
def test_progress_follows_the_terminal_unless_a_flag_says(tmp_path, flags, terminal, expected):
    assert _progress_used(tmp_path, *flags, terminal=terminal) is expected


def test_no_progress_in_a_run_file(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text("no-progress = true\n")
    (tmp_path / "logs").mkdir()
    assert _progress_used(tmp_path / "logs", "--config", str(run), terminal=True) is False
