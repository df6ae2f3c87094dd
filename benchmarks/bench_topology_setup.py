"""Setup of large topologies: ``topologies.build`` and the spectrum, per family and n (not a test).

Each case runs in a fresh interpreter (so one case's memory does not pile onto the next, and a
case that runs past ``--timeout`` is stopped and reported as such). A case times

* ``build``: ``topologies.build(spec, n)`` (graph, mixing matrix, validation); for a
  time-varying spec also its first round, ``at_round(1)``, which is what a run builds first;
* ``spectrum``: the first read of ``.spectrum`` (round 1's for a time-varying spec), with the
  method that gave it (``closed form``, ``lanczos``, ``sparse-lu``, ``estimated``, ...);
* the process's peak RSS.

Issue 43's target: build + spectrum <= 10 s at n = 10^6 for the ring, the torus, the random
4-regular graph and the one-peer exponential graph.

    python benchmarks/bench_topology_setup.py                       # 10^4, 10^5, 10^6
    python benchmarks/bench_topology_setup.py --nodes 10000 100000 --timeout 120
    python benchmarks/bench_topology_setup.py --root /path/to/older/checkout  # its topologies/

Imports are done before the clock starts (``import topologies`` loads networkx and scipy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("ring", "torus", "regular:k=4", "one-peer-exponential")

CASE = r"""
import json, sys, time
import networkx, numpy, scipy.sparse, scipy.sparse.linalg  # imported before the clock starts
import topologies
from topologies import factory, spectral, topology, timevarying  # noqa: F401

spec, n = sys.argv[1], int(sys.argv[2])
out = {}
start = time.perf_counter()
topo = topologies.build(spec, n)
static = topo.at_round(1) if topo.time_varying else topo
out["build_s"] = time.perf_counter() - start
print(json.dumps(out), flush=True)
start = time.perf_counter()
spec_ = static.spectrum
out["spectrum_s"] = time.perf_counter() - start
out["method"] = spec_.method
out["gap"] = spec_.gap
out["rss_mb"] = next(int(line.split()[1]) / 1024 for line in open("/proc/self/status")
                    if line.startswith("VmHWM:"))  # the peak of this map (ru_maxrss: the parent's)
print(json.dumps(out), flush=True)
"""


def run_case(spec: str, n: int, root: Path, timeout: float) -> dict:
    """One case in a fresh interpreter; the last JSON line it printed (partial on a timeout)."""
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run([sys.executable, "-c", CASE, spec, str(n)], env=env, cwd=root,
                              capture_output=True, text=True, timeout=timeout)
        stdout, failed = proc.stdout, proc.returncode != 0
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        failed = False
        result = _last(stdout)
        result["timeout"] = True
        return result
    result = _last(stdout)
    if failed:
        result["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
    return result


def _last(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _cell(result: dict, key: str, timeout: float) -> str:
    if key in result:
        return f"{result[key]:.2f}"
    if result.get("timeout"):
        return f"> {timeout:g}"
    return "error" if "error" in result else "—"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10**4, 10**5, 10**6])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="checkout whose topologies/ to time (default: this one)")
    args = parser.parse_args(argv)
    print(f"topologies from {args.root}; load average {os.getloadavg()[0]:.2f} at the start")
    print("| family | n | build s | spectrum s | spectrum method | build + spectrum s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.families:
        for n in args.nodes:
            start = time.perf_counter()
            r = run_case(spec, n, args.root, args.timeout)
            total = (f"{r['build_s'] + r['spectrum_s']:.2f}" if "spectrum_s" in r
                     else f"> {time.perf_counter() - start:.0f}" if r.get("timeout") else "—")
            method = r.get("method", r.get("error", "—"))
            rss = f"{r['rss_mb']:.0f}" if "rss_mb" in r else "—"
            print(f"| {spec} | {n:.0e} | {_cell(r, 'build_s', args.timeout)} | "
                  f"{_cell(r, 'spectrum_s', args.timeout)} | {method} | {total} | {rss} |",
                  flush=True)


if __name__ == "__main__":
    main()
