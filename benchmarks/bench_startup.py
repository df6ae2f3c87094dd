"""Start-up times: each script's ``--help`` and ``import gossip`` (run by ``make bench``; not a test).

Every measurement is a fresh interpreter (``sys.executable``, ``OMP_NUM_THREADS=1``), run
``--repeat`` times; the table gives the median, the fastest and the slowest wall time. Targets
(issue 22): ``--help`` of every script in ``experiments/`` < 1.5 s, and ``import gossip`` with its
whole public API (every name of ``gossip.__all__`` read) < 0.5 s beyond torch's own import,
timed inside the interpreter after ``import torch``. The last column says whether the
``--help`` run imported torch (``python -X importtime``); it should not.

    python benchmarks/bench_startup.py --repeat 5

This script imports nothing of gossip or torch itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP_TARGET_S = 1.5
IMPORT_TARGET_S = 0.5

HEADER = ("| start-up | median | min | max | target | status | imports torch |\n"
          "|---|---|---|---|---|---|---|")
"""The table's header (a docs test finds it in docs/performance.md)."""

IMPORT_GOSSIP = """
import time
import torch
start = time.perf_counter()
import gossip
for name in gossip.__all__:
    getattr(gossip, name)
print(time.perf_counter() - start)
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


def wall(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    """Seconds one ``python ARGS`` takes from start to exit, and its result."""
    start = time.perf_counter()
    res = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"bench_startup: python {' '.join(args)} failed:\n{res.stderr}")
    return seconds, res


def imports_torch(args: list[str]) -> bool:
    """Whether ``python ARGS`` imports torch (read from ``-X importtime``)."""
    _, res = wall(["-X", "importtime", *args])
    return any(line.rsplit("|", 1)[-1].strip().split(".")[0] == "torch"
               for line in res.stderr.splitlines() if line.startswith("import time:"))


def row(name: str, times: list[float], target: float | None, torch_note: str = "") -> str:
    med = statistics.median(times)
    verdict = "—" if target is None else ("ok" if med < target else "over")
    shown = "—" if target is None else f"< {target:g} s"
    return (f"| {name} | {med:.3f} | {min(times):.3f} | {max(times):.3f} | {shown} | {verdict} "
            f"| {torch_note} |")


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="fresh interpreters per measurement (default 5)")
    p.add_argument("--write", type=Path, metavar="PAGE",
                   help="also write the table into PAGE between its bench_startup markers "
                        "(make bench: docs/performance.md)")
    args = p.parse_args(argv)
    scripts = sorted((ROOT / "experiments").glob("*.py"))
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    emit(f"python {sys.version.split()[0]}, median / min / max of {args.repeat} fresh interpreters "
         "(seconds)\n")
    emit(HEADER)
    emit(row("python -c pass (interpreter)", [wall(["-c", "pass"])[0] for _ in range(args.repeat)],
             None))
    emit(row("import torch", [wall(["-c", "import torch"])[0] for _ in range(args.repeat)], None,
             "yes"))
    emit(row("import gossip", [wall(["-c", "import gossip"])[0] for _ in range(args.repeat)], None,
             "yes" if imports_torch(["-c", "import gossip"]) else "no"))
    beyond = [float(wall(["-c", IMPORT_GOSSIP])[1].stdout) for _ in range(args.repeat)]
    emit(row("import gossip + every public name, beyond torch's import", beyond, IMPORT_TARGET_S,
             "yes (the engine needs it)"))
    for path in scripts:
        rel = str(path.relative_to(ROOT))
        times = [wall([rel, "--help"])[0] for _ in range(args.repeat)]
        emit(row(f"{rel} --help", times, HELP_TARGET_S,
                 "yes" if imports_torch([rel, "--help"]) else "no"))
    out = "\n".join(lines)
    if args.write is not None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from docpage import write_between_markers

        write_between_markers(args.write, out, "bench_startup")
    return out


if __name__ == "__main__":
    main()
