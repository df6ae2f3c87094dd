"""Checkpoint and resume: a killed run resumes to the same log bit for bit; bad checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.launch import ROOT, Beside, launch_command, mpiexec, run_py

LAUNCHES_MARKED_PER_TEST = True  # only the mpiexec test launches (tests/conftest.py)

RUNS = {
    "choco": ["experiments/consensus.py", "--algorithm", "choco", "--compressor", "topk:0.1",
              "--gamma", "0.2", "--dim", "60", "--rounds", "300"],
    "powergossip": ["experiments/consensus.py", "--algorithm", "powergossip", "--rank", "1",
                    "--shape", "8x6", "--rounds", "300"],
    "lead": ["experiments/optimize.py", "--problem", "least-squares", "--algorithm", "lead",
             "--compressor", "lead:2", "--dim", "20", "--samples-per-node", "30",
             "--iterations", "300"],
}
COMMON = ["--dtype", "float64", "--log-every", "10", "--seed", "4"]


def rounds_of(path: Path, apart: tuple[str, ...] = ()) -> list[dict]:
    keep = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "round":
            keep.append({k: v for k, v in rec.items() if not k.endswith("_s") and k not in apart})
    return keep


def manifest_round(ck: Path) -> int:
    m = ck / "run00" / "manifest.json"
    try:
        return max(json.loads(m.read_text())["rounds"])
    except (FileNotFoundError, json.JSONDecodeError, ValueError):
        return 0


@pytest.mark.slow
@pytest.mark.launches
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
@pytest.mark.parametrize("name", sorted(RUNS))
def test_sigkill_all_ranks_then_resume_equals_uninterrupted(tmp_path, name):
    """The uninterrupted run is the in-process one of the same 4 nodes (equal to mpiexec's bit
    for bit: tests/engine/test_mpi.py), which costs one interpreter rather than a launch."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    args = [*RUNS[name], *COMMON]
    full, cut, ck = tmp_path / "full.jsonl", tmp_path / "cut.jsonl", tmp_path / "ck"
    mpi = launch_command("mpiexec", 4)
    with Beside([*args, "--nodes", "4", "--out", str(full)], timeout=300) as uninterrupted:
        proc = subprocess.Popen([*mpi, *args, "--out", str(cut), "--checkpoint-dir", str(ck),
                                 "--checkpoint-every", "20"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.time() + 120
        while manifest_round(ck) < 60 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # every rank and the launcher at once
        proc.wait()
    res = uninterrupted.result
    assert res.returncode == 0, res.stderr[-2000:]
    reached = manifest_round(ck)
    assert 60 <= reached < 300, f"kill came at round {reached}"
    res = subprocess.run([*mpi, *args, "--out", str(cut), "--resume", str(ck)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    apart = ("args", "world_size")  # the launch's own, not the run's
    assert rounds_of(cut, apart) == rounds_of(full, apart)


@pytest.mark.slow
def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path):
    args = [*RUNS["choco"][:-1], "40", *COMMON, "--nodes", "4"]
    full, ck = tmp_path / "full.jsonl", tmp_path / "ck"
    assert run_py([*args, "--out", str(full)]).returncode == 0
    res = run_py([*args, "--out", str(tmp_path / "a.jsonl"), "--checkpoint-dir", str(ck),
                  "--checkpoint-every", "10"])
    assert res.returncode == 0
    manifest = json.loads((ck / "run00" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["rounds"] == [30, 40]
    # pretend the run died at round 40 before finishing, with a torn node file
    manifest["complete"] = False
    (ck / "run00" / "manifest.json").write_text(json.dumps(manifest))
    node = ck / "run00" / "round-000040" / "node-0002.pt"
    node.write_bytes(node.read_bytes()[:100])
    res = run_py([*args, "--out", str(tmp_path / "b.jsonl"), "--resume", str(ck)])
    assert res.returncode == 0, res.stderr
    assert "round 40 is unreadable" in res.stderr and "older checkpoint" in res.stderr
    assert rounds_of(tmp_path / "b.jsonl") == rounds_of(full)


@pytest.mark.slow
def test_resume_with_a_different_run_is_refused(tmp_path):
    args = [*RUNS["choco"][:-1], "20", *COMMON, "--nodes", "4"]
    ck = tmp_path / "ck"
    assert run_py([*args, "--checkpoint-dir", str(ck), "--checkpoint-every", "10"]).returncode == 0
    other = [a if a != "topk:0.1" else "sign" for a in args]
    res = run_py([*other, "--resume", str(ck)])
    assert res.returncode != 0
    assert "different run" in res.stderr and "compressor" in res.stderr


@pytest.mark.slow
def test_sigterm_writes_a_final_checkpoint_and_exits_cleanly(tmp_path):
    args = [*RUNS["choco"][:-1], "100000", *COMMON, "--nodes", "4"]
    ck = tmp_path / "ck"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, *args, "--checkpoint-dir", str(ck)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (ck / "run00" / "records.jsonl").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by signal SIGTERM" in err
    assert manifest_round(ck) > 0
