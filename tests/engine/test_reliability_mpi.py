"""A rank that stops inside a metric reduction ends the job with an error naming it, never a hang."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.launch import ROOT, mpiexec

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


@pytest.mark.alone  # a rank stopped or killed on purpose (tests/conftest.py)
@pytest.mark.parametrize("where", ["values", "sum", "chain"])
def test_rank_stopped_inside_a_reduction_stops_the_job(tmp_path, where):
    """Rank 2 SIGSTOPs itself inside the gather of per-node values / the ordered sum of x̄ /
    that sum's chain of ranks (named by the roll call the waiting ranks then hold).

    Before, the other ranks waited in blocking MPI collectives forever (100% CPU); now their
    deadline (5 s) fires, the error names rank 2 and the job is aborted.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    pidfile = tmp_path / "pids"
    cmd = [mpiexec(), "-n", "4", sys.executable, "tests/helpers/mpi_victim.py", str(pidfile), where]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    start = time.time()
    try:
        out, _ = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail("the job hung after rank 2 stopped inside a metric reduction")
    finally:
        for line in pidfile.read_text().split() if pidfile.exists() else []:
            try:
                os.kill(int(line.split(":")[1]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    assert time.time() - start < 45
    assert "rank(s) [2] stopped answering" in out, out[-3000:]
    assert "metrics: rank" in out, out[-3000:]
    assert ("answered a roll call" in out) == (where == "chain"), out[-3000:]


def test_configuration_errors_under_mpi_are_printed_once():
    from tests.helpers.launch import run_mpi

    res = run_mpi(2, ["experiments/consensus.py", "--log-every", "0"], timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert out.count("expected a positive integer") == 1 and out.count("usage:") == 1, out
    res = run_mpi(2, ["experiments/consensus.py", "--dim", "8", "--device", "bogus"], timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert out.count("is not a torch device") == 1 and "Traceback" not in out, out
    assert "Abort(" not in out and res.returncode == 2, out  # all ranks exit: no MPI_Abort


def test_an_error_one_rank_meets_ends_the_job_with_its_line_alone():
    """Only rank 0 writes the log, so only it meets a full disk: it aborts the job, and its
    one error: line is the last word (no MPICH "Abort(1) on node 0 ..." report after it)."""
    from tests.helpers.launch import run_mpi

    res = run_mpi(2, ["experiments/consensus.py", "--dim", "8", "--rounds", "3", "--out",
                      "/dev/full"], timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert res.stderr.strip().splitlines() == [
        "[rank 0] error: cannot write the log /dev/full (--out): No space left on device "
        "[ENOSPC]; free disk space (or quota) where it is written, or give --out another file"], out
    assert "Abort(" not in out and "MPI_Abort" not in out, out


def test_transport_local_under_mpiexec_is_refused_before_any_file_is_written(tmp_path):
    """Two processes each running the whole job in process would write one log at once."""
    from tests.helpers.launch import run_mpi

    res = run_mpi(2, ["experiments/consensus.py", "--transport", "local", "--dim", "8",
                      "--rounds", "3", "--out", str(tmp_path / "r.jsonl")], timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert out.count("error: --transport local runs every node in this process, but mpiexec "
                     "started 2 processes") == 1, out
    assert not (tmp_path / "r.jsonl").exists() and "Abort(" not in out


@pytest.mark.parametrize("first", ["record", "step"])
def test_an_oversized_message_names_its_sender(first):
    """Rank 1 sends 1 MB more than rank 0's settings announce, in a metric reduction or in a
    round: rank 0 names rank 1 at once (no deadline waited out, no MPI error stack). In the
    record's running sum rank 0 sends first, and rank 1 may be the one to stop, naming rank 0's
    message as 1 MB short of what its settings announce."""
    from tests.helpers.launch import run_mpi

    start = time.time()
    res = run_mpi(2, ["tests/helpers/mpi_rogue.py", first], timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert time.time() - start < 30, out
    found = re.search(r"rank 0: (node 1 \()?rank 1\)? sent a message larger than the receive "
                      r"buffer its settings announce|rank 1: rank 0 sent a message of 408 bytes, "
                      r"expected 1000408", out)
    assert found and (first == "record" or "larger" in found.group()), out[-3000:]
    assert "waited" not in out[:found.end()].splitlines()[-1], out[-3000:]
    assert "error stack" not in out and "MPI_ERROR" not in out, out[-3000:]
