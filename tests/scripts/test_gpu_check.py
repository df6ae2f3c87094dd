"""benchmarks/gpu_check.py on the CPU (--device cpu --quick): it runs, prints both tables and
exits 0; a byte difference where bytes must be equal exits 1."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from gossip.compress import dispatch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_cpu_quick_exits_0_and_prints_tables():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "| spec | dtype | call | expect | bytes equal | decode max abs diff |" in out
    for spec in ("none", "topk:0.1", "randk:0.1", "sign", "qsgd:4", "lead:4", "natural", "lowrank:2"):
        for dtype in ("float32", "float64"):
            assert f"| {spec} | {dtype} | encode |" in out
            assert f"| {spec} | {dtype} | encode_rows m=8 |" in out
    assert "MISMATCH" not in out and "ERROR" not in out
    assert "| choco | topk:0.01 | cpu |" in out and "| gossip | none | cpu |" in out
    assert "all required equalities hold" in out


def test_gpu_check_mismatch_exits_1(monkeypatch, capsys):
    gc = load_script()
    # the "device" side (torch path) draws from another seed: rand-k bytes must then differ
    monkeypatch.setattr(gc, "specs", lambda: ["randk:0.1", "topk:0.1"])
    original = gc.single_rng
    monkeypatch.setattr(gc, "single_rng", lambda seed, device: original(
        seed + (0 if dispatch.NUMPY else 1), device))
    assert gc.main(["--device", "cpu", "--quick", "--skip-timing"]) == 1
    out = capsys.readouterr().out
    assert "| randk:0.1 | float32 | encode | rng | no |" in out and "MISMATCH" in out
    assert "| topk:0.1 | float32 | encode | exact | yes |" in out


def test_gpu_check_specs_cover_the_registry():
    gc = load_script()
    names = {s.split(":")[0] for s in gc.specs()}
    assert {"none", "topk", "randk", "sign", "qsgd", "lead", "natural", "lowrank"} <= names
    assert all(not any(c.isupper() for c in s) for s in gc.specs())  # placeholders filled in
    assert gc.expectation("topk:0.1") == "exact" and gc.expectation("qsgd:4") == "reduction"


def test_gpu_sh_runs_the_check():
    """benchmarks/gpu.sh, the command the docs give, runs the check with its flags."""
    import subprocess
    import sys

    res = subprocess.run([str(ROOT / "benchmarks" / "gpu.sh"), "--device", "cpu", "--quick",
                          "--skip-timing"], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert res.returncode == 0, res.stderr
    assert "all required equalities hold" in res.stdout
