"""Shared test helpers: the repository root, the venv's python and mpiexec, the experiment scripts."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAUNCHES_ALLOWED = True
"""Whether the running test may start several processes: tests/conftest.py sets it for each
test from its ``launches`` mark (outside pytest's run, always)."""


def mpiexec() -> str | None:
    """mpiexec next to this interpreter (the mpich wheel puts it in the venv), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def launch_command(launcher: str, n: int) -> list[str]:
    """The command that starts ``n`` processes of a python script: ``mpiexec -n n python`` or
    ``torchrun --standalone --nproc-per-node n`` (skips the test when the launcher is missing)."""
    if not LAUNCHES_ALLOWED:
        pytest.fail(f"this test starts {n} processes ({launcher}) but is not marked launches: "
                    "mark it @pytest.mark.launches (tests/conftest.py), so that make test runs "
                    "it with the other launches, apart from the in-process tests", pytrace=False)
    exe = mpiexec() if launcher == "mpiexec" else torchrun()
    if exe is None:
        pytest.skip(f"no {launcher} available")
    if launcher == "mpiexec":
        return [exe, "-n", str(n), sys.executable]
    return [exe, "--standalone", "--nproc-per-node", str(n)]


def _launch(launcher: str, n: int, args: list[str], timeout: float, env_extra: dict | None):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run([*launch_command(launcher, n), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_mpi(n: int, args: list[str], timeout: float = 180, env_extra: dict | None = None):
    """Run ``mpiexec -n n python ARGS`` from the repository root; returns the CompletedProcess."""
    return _launch("mpiexec", n, args, timeout, env_extra)


def torchrun() -> str | None:
    """torchrun next to this interpreter (torch's wheel puts it in the venv), else on PATH."""
    here = Path(sys.executable).parent / "torchrun"
    return str(here) if here.exists() else shutil.which("torchrun")


def run_torchrun(n: int, args: list[str], timeout: float = 180, env_extra: dict | None = None):
    """Run ``torchrun --standalone --nproc-per-node n ARGS`` (a python script and its flags)
    from the repository root; returns the CompletedProcess."""
    return _launch("torchrun", n, args, timeout, env_extra)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (an exited one not yet reaped by its launcher counts
    as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the process itself
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def stop_a_rank(launcher: str, n: int, script: list[str], tmp_path: Path, sig: int,
                rank: int = 2, settle: float = 1.0, timeout: float = 40,
                script_args: list[str] = (), release: bool = False) -> tuple[int, str, float]:
    """Start ``script PIDFILE [script_args]`` on ``n`` processes (each writes ``rank:pid`` to PIDFILE), send
    ``sig`` to ``rank`` once all are up (after ``settle`` seconds) and return the job's exit
    status, output and seconds from the signal to its end; fails the test when the job hangs
    past ``timeout`` seconds.

    ``release``: once every other rank has ended, kill the signalled one (SIGKILL), and return
    the seconds from the signal to the others' end. For a rank stopped with SIGSTOP under
    torchrun, which otherwise waits 30 s for the stopped process to take its SIGTERM; the job
    must still end by itself, by the other ranks' own errors or torchrun's stop."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen([*launch_command(launcher, n), *script, str(pidfile), *script_args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        if pidfile.exists() and len(pidfile.read_text().split()) >= n:
            break
        time.sleep(0.2)
    pids = dict(line.split(":") for line in pidfile.read_text().split())
    time.sleep(settle)
    os.kill(int(pids[str(rank)]), sig)
    start = time.time()
    ended = None
    try:
        if release:
            others = [int(pid) for r, pid in pids.items() if r != str(rank)]
            while any(_alive(pid) for pid in others) and time.time() < start + timeout:
                time.sleep(0.05)
            ended = time.time() - start
            os.kill(int(pids[str(rank)]), signal.SIGKILL)
        out, _ = proc.communicate(timeout=max(start + timeout - time.time(), 10))
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the {launcher} job hung after rank {rank} was stopped")
    finally:
        try:
            os.kill(int(pids[str(rank)]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    if ended is not None and ended >= timeout:
        pytest.fail(f"the other ranks of the {launcher} job were still running {timeout:.0f} s "
                    f"after rank {rank} was stopped")
    return proc.returncode, out, time.time() - start if ended is None else ended


def run_py(args: list[str], timeout: float = 180):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


class Beside:
    """``with Beside(ARGS) as ref: ...`` runs ``python ARGS`` from the repository root (as
    :func:`run_py`) while the block runs, e.g. an in-process reference beside the launch it is
    compared with: the cores its ranks leave idle while they wait on each other run it. After
    the block, ``ref.result`` is its CompletedProcess (the process is killed when the block
    raises, and fails the test when it outlives ``timeout`` seconds)."""

    def __init__(self, args: list[str], timeout: float = 180):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        self.args, self.timeout = args, timeout
        self.proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.result: subprocess.CompletedProcess | None = None

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.proc.kill()
            self.proc.communicate()
            return
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            pytest.fail(f"python {' '.join(self.args)} ran past {self.timeout:.0f} s")
        self.result = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


_IN_PROCESS_RECORDS: dict[tuple[str, int], list] = {}
"""A scenario script's in-process records by (script, nodes): deterministic, so the tests that
launch the same script for the same nodes (mpiexec and torchrun, several rank counts) compare
with one in-process run rather than each starting its own interpreter."""


def scenario_records(script: str, tmp_path: Path, ranks: int, nodes: int,
                     launch=run_mpi) -> tuple[list, list]:
    """Records of a scenario script (``OUT.jsonl NODES``) run in process and under
    ``launch(ranks, ...)`` (mpiexec, or :func:`run_torchrun`), after checking both exited 0.

    The in-process run starts beside the launch (its one process uses what the ranks leave of
    the cores) and is run once per (script, nodes) in a pytest process
    (:data:`_IN_PROCESS_RECORDS`); each caller gets its own copy of the records."""
    from gossip.metrics import read_jsonl

    local, remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    key = (script, nodes)
    if key in _IN_PROCESS_RECORDS:
        res = launch(ranks, [script, str(remote), str(nodes)])
    else:
        with Beside([script, str(local), str(nodes)]) as ref:
            res = launch(ranks, [script, str(remote), str(nodes)])
        assert ref.result.returncode == 0, ref.result.stderr
        _IN_PROCESS_RECORDS[key] = read_jsonl(local)
    assert res.returncode == 0, res.stdout + res.stderr
    return copy.deepcopy(_IN_PROCESS_RECORDS[key]), read_jsonl(remote)


def script(name: str, folder: str = "experiments"):
    """An experiment script (or, with ``folder="benchmarks"``, a benchmark) as a module: they
    are files, not a package."""
    mod_name = f"_gossip_{folder}_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module
