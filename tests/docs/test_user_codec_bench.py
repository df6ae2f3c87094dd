"""benchmarks/bench_user_codec.py runs, its UserSign sends the built-in sign's message sizes and
decodes to ±mean|x|, and docs/performance.md shows the table it prints."""

from __future__ import annotations

import subprocess
import sys

import torch

from gossip.compress import make
from tests.helpers.launch import ROOT, script

SCRIPT = ROOT / "benchmarks" / "bench_user_codec.py"


def test_the_benchmark_runs_and_the_docs_show_its_table():
    """In a process of its own: it registers its compressor, which this one must not see."""
    res = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "4x300", "--rounds", "1",
                          "--repeat", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] in (ROOT / "docs" / "performance.md").read_text()
    assert lines[2].startswith("| 4 | 300 |")


def test_the_user_sign_is_sign():
    user, builtin = script("bench_user_codec", "benchmarks").UserSign("usersign"), make("sign")
    x = torch.randn(300)
    assert user.encode(x).nbytes == builtin.encode(x).nbytes
    y = user.decode(user.from_bytes(user.encode(x).to_bytes(), like=x))
    assert torch.allclose(y.abs(), x.abs().mean().expand(300))
    assert torch.equal(y < 0, x < 0)
