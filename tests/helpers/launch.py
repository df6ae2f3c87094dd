"""Shared test helpers: the repository root, the venv's python and mpiexec, the experiment scripts."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def mpiexec() -> str | None:
    """mpiexec next to this interpreter (the mpich wheel puts it in the venv), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def run_mpi(n: int, args: list[str], timeout: float = 180, env_extra: dict | None = None):
    """Run ``mpiexec -n n python ARGS`` from the repository root; returns the CompletedProcess."""
    exe = mpiexec()
    if exe is None:
        pytest.skip("no mpiexec available")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run(
        [exe, "-n", str(n), sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=timeout,
    )


def torchrun() -> str | None:
    """torchrun next to this interpreter (torch's wheel puts it in the venv), else on PATH."""
    here = Path(sys.executable).parent / "torchrun"
    return str(here) if here.exists() else shutil.which("torchrun")


def run_torchrun(n: int, args: list[str], timeout: float = 180, env_extra: dict | None = None):
    """Run ``torchrun --standalone --nproc-per-node n ARGS`` (a python script and its flags)
    from the repository root; returns the CompletedProcess."""
    exe = torchrun()
    if exe is None:
        pytest.skip("no torchrun available")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run(
        [exe, "--standalone", "--nproc-per-node", str(n), *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=timeout,
    )


def run_py(args: list[str], timeout: float = 180):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def scenario_records(script: str, tmp_path: Path, ranks: int, nodes: int,
                     launch=run_mpi) -> tuple[list, list]:
    """Records of a scenario script (``OUT.jsonl NODES``) run in process and under
    ``launch(ranks, ...)`` (mpiexec, or :func:`run_torchrun`), after checking both exited 0."""
    from gossip.metrics import read_jsonl

    local, remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    res = run_py([script, str(local), str(nodes)])
    assert res.returncode == 0, res.stderr
    res = launch(ranks, [script, str(remote), str(nodes)])
    assert res.returncode == 0, res.stdout + res.stderr
    return read_jsonl(local), read_jsonl(remote)


def script(name: str):
    """An experiment script as a module (they are files, not a package)."""
    mod_name = f"_gossip_experiment_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module
