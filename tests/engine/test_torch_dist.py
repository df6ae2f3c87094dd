"""torch.distributed as the transport: torchrun runs equal in-process runs bit for bit; silent
ranks, wrong backends and a missing launcher fail with one clear line."""

from __future__ import annotations

import re
import signal
import sys
import time

import pytest
import torch

from gossip.metrics import read_jsonl
from tests.helpers.launch import Beside, run_py, run_torchrun, scenario_records, stop_a_rank, torchrun

pytestmark = [pytest.mark.skipif(torchrun() is None, reason="no torchrun"), pytest.mark.slow]


def test_gloo_equals_in_process(tmp_path):
    """Two gloo ranks hosting four nodes: every record and final model equals the in-process run."""
    a, b = scenario_records("tests/helpers/mpi_scenarios.py", tmp_path, 2, 4, launch=run_torchrun)
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert ra == rb, (ra.get("scenario"), ra.get("round"))
    assert len({r["scenario"] for r in a}) >= 8


def test_consensus_script_under_torchrun(tmp_path):
    """The experiment script end to end (log, plot) under torchrun equals it in process."""
    common = ["experiments/consensus.py", "--topology", "ring", "--dim", "64", "--rounds", "20",
              "--log-every", "10", "--dtype", "float64", "--compressor", "none", "sign",
              "--gamma", "1", "0.3"]
    with Beside([*common, "--nodes", "2", "--out", str(tmp_path / "l.jsonl")]) as local:
        res = run_torchrun(2, [*common, "--transport", "gloo", "--out", str(tmp_path / "t.jsonl"),
                               "--plot", str(tmp_path / "t.png")])
    assert res.returncode == 0, res.stdout + res.stderr
    res2 = local.result
    assert res2.returncode == 0, res2.stderr
    strip = lambda recs: [  # noqa: E731
        {k: v for k, v in r.items() if not k.endswith("_s") and k not in ("args", "world_size")}
        for r in recs if r["type"] == "round"
    ]
    assert strip(read_jsonl(tmp_path / "t.jsonl")) == strip(read_jsonl(tmp_path / "l.jsonl"))
    assert (tmp_path / "t.png").stat().st_size > 0


def test_a_finished_run_destroys_its_process_group(tmp_path):
    """A torchrun run that ends normally tears its process group down before the interpreter
    exits (NCCL otherwise warns that destroy_process_group() was not called): the check's exit
    hook, which runs after the run's, finds no group alive on either rank, and stderr has no
    such warning."""
    res = run_torchrun(2, ["tests/helpers/torch_exit_check.py", "experiments/consensus.py",
                           "--transport", "gloo", "--nodes", "4", "--dim", "8", "--rounds", "3",
                           "--out", str(tmp_path / "r.jsonl")])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("process group alive at exit: False") == 2, res.stdout
    assert "alive at exit: True" not in res.stdout
    assert "destroy_process_group" not in res.stderr, res.stderr


def test_torchruns_failure_summary_shows_the_error_line():
    """A configuration error under torchrun: the one error: line, and torchrun's own failure
    report (printed after any worker fails) names that line as the root cause instead of
    "To enable traceback see ..."."""
    res = run_torchrun(2, ["experiments/consensus.py", "--transport", "gloo", "--nodes", "4",
                           "--dim", "8", "--rounds", "3", "--algorithm", "chocoo"])
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert out.count("[rank 0] error: --algorithm: unknown algorithm 'chocoo'") == 1, out
    assert "traceback : error: --algorithm: unknown algorithm 'chocoo'" in out, out
    assert "To enable traceback see" not in out, out


@pytest.mark.alone  # a rank stopped or killed on purpose (tests/conftest.py)
def test_silent_rank_is_named(tmp_path):
    """A rank that stops answering (SIGSTOP) ends the torchrun job: its neighbors' deadline
    (5 s) fires, and every rank that reports (the first one to fail always does; torchrun stops
    the others, maybe before they print) names rank 2; the others end well within the
    deadline's scale instead of hanging (the stopped one is then killed by the test, not left
    to torchrun's 30 s wait for it to take its SIGTERM)."""
    code, out, seconds = stop_a_rank("torchrun", 3, ["tests/helpers/mpi_victim.py"], tmp_path,
                                     signal.SIGSTOP, settle=2.0, timeout=60, release=True)
    assert code != 0 and seconds < 60
    lines = [ln for ln in out.splitlines() if re.match(r"rank [01]: ", ln)]
    assert lines, out[-3000:]
    assert all("rank(s) [2] stopped answering" in ln for ln in lines), out[-3000:]


@pytest.mark.alone  # a rank stopped or killed on purpose (tests/conftest.py)
def test_a_killed_rank_is_named_without_a_wait_it_did_not_do(tmp_path):
    """SIGKILL: the neighbors' connections reset at once; the line names the killed rank and
    gloo's reason (no "waited 5 s", no source path of gloo), and the job ends."""
    code, out, seconds = stop_a_rank("torchrun", 3, ["tests/helpers/mpi_victim.py"], tmp_path,
                                     signal.SIGKILL, settle=2.0, timeout=60)
    assert code != 0 and seconds < 30
    lines = [ln for ln in out.splitlines() if "the connection broke while it waited for" in ln]
    # a neighbor of the killed rank names it; a rank further off may name the neighbor that
    # exited after it (its connection closes too), so not every line names rank 2
    assert any(re.search(r"for [^(]*\(?rank 2\)? \(torch.distributed: ", ln) for ln in lines), out
    assert all("did that rank die or get killed?" in ln for ln in lines), out[-3000:]
    assert not any("waited 5 s" in ln or "pair.cc" in ln for ln in lines), out[-3000:]


@pytest.mark.alone  # a rank stopped or killed on purpose (tests/conftest.py)
def test_a_rank_missing_at_start_up_is_named_within_the_timeout():
    """A rank that never reaches the rendezvous: the others wait --timeout (3 s), not torch's
    default, and end with one line naming it; no store error, no second wait at start-up."""
    start = time.monotonic()
    res = run_torchrun(2, ["tests/helpers/torch_stop_at_start.py", "experiments/consensus.py",
                           "--nodes", "4", "--dim", "8", "--rounds", "3", "--timeout", "3"],
                       timeout=170, env_extra={"GOSSIP_TEST_STOP_RANK": "1"})
    seconds = time.monotonic() - start
    out = res.stdout + res.stderr
    assert res.returncode != 0
    lines = [ln for ln in out.splitlines() if ln.startswith(("error:", "[rank 0] error:"))]
    assert len(lines) == 1 and "waited 3 s at start-up" in lines[0], out[-3000:]
    assert "rank(s) [1] never arrived" in lines[0]
    assert "DistStoreError" not in out and "During handling" not in out, out[-3000:]
    assert seconds < 100, seconds  # launch and teardown included; 120 s waits are gone


@pytest.mark.alone  # a rank stopped or killed on purpose (tests/conftest.py)
def test_a_rank_that_stops_stepping_is_named_by_every_rank_that_reports():
    """gossip.wrap under torchrun, rank 1's script ends after two steps: the job ends non-zero,
    at least one rank's error names rank 1, and so does every error printed: its neighbors'
    directly, rank 3's through rank 0's note (torchrun stops every rank once one fails, so which
    of them get to print varies); none blames a rank that failed because of it, and gloo's raw
    error is not shown."""
    res = run_torchrun(4, ["tests/helpers/torch_wrap_stop.py", "5"], timeout=170)  # or it hung
    out = res.stdout + res.stderr
    assert res.returncode != 0
    errors = [ln for ln in out.splitlines() if "gossip.errors.Comm" in ln]
    assert errors and {ln[:7] for ln in errors} <= {"[rank0]", "[rank2]", "[rank3]"}, out[-4000:]
    assert all("rank 1 stopped stepping early" in ln for ln in errors), out[-4000:]
    assert "GLHF" not in out and "pair.cc" not in out, out[-4000:]


def test_bad_transport_choices_say_the_fix():
    """gloo without torchrun, NCCL on the CPU and gloo with a CUDA run: one line each."""
    base = ["experiments/consensus.py", "--rounds", "2", "--dim", "8"]
    with Beside(["experiments/consensus.py", "--rounds", "2", "--transport", "gloo"]) as alone:
        res = run_torchrun(2, [*base, "--transport", "nccl"])
    assert res.returncode != 0
    assert "error: --transport nccl moves CUDA tensors only and the run is on the CPU: use " \
        "--transport gloo" in res.stdout + res.stderr
    res = alone.result
    assert res.returncode != 0
    assert "error: --transport gloo needs a torch.distributed job: start the script with torchrun" \
        in res.stderr
    res = run_torchrun(2, [*base, "--transport", "gloo", "--device", "cuda"])
    assert res.returncode != 0
    assert "--transport gloo moves CPU tensors only and the run is on CUDA: use --transport nccl" \
        in res.stdout + res.stderr


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two CUDA devices")
def test_nccl_equals_in_process(tmp_path):
    common = ["experiments/consensus.py", "--topology", "ring", "--dim", "64", "--rounds", "20",
              "--log-every", "10", "--dtype", "float64", "--compressor", "none", "sign",
              "--gamma", "1", "0.3"]
    res = run_torchrun(2, [*common, "--device", "cuda", "--transport", "nccl",
                           "--out", str(tmp_path / "n.jsonl")])
    assert res.returncode == 0, res.stdout + res.stderr
    res2 = run_py([*common, "--device", "cuda", "--nodes", "2", "--out", str(tmp_path / "l.jsonl")])
    assert res2.returncode == 0, res2.stderr
    rounds = lambda p: [{k: v for k, v in r.items() if not k.endswith("_s") and k != "args"}  # noqa: E731
                        for r in read_jsonl(p) if r["type"] == "round"]
    assert [r["consensus_error"] for r in rounds(tmp_path / "n.jsonl")] == \
        [r["consensus_error"] for r in rounds(tmp_path / "l.jsonl")]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
