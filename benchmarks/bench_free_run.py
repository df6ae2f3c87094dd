"""Free-running under mpiexec with lost and late messages and a straggler: wall time to a relative
distance of 1e-6 and 1e-10, robust-push-tracking against AD-PSGD and D-PSGD (issue 42's targets; the
table of docs/network.md, "Running sums", between the ``bench_free_run`` markers).

8 nodes, one per rank of ``mpiexec -n 8`` (the issue's tables have 16 nodes: a free run takes
one node per rank, and 8 ranks are what this machine's cores can pace), on ``exponential``
(i ~ i ± 2^k) for every method, each with the weights it needs (``push`` for
robust-push-tracking, ``metropolis`` for D-PSGD; AD-PSGD averages with a uniform random
neighbor). Heterogeneous least squares as in ``bench_running_sums.py`` (d = 20, 30 samples per
node, heterogeneity 1, x⁰ = 0, full gradients, float64), the same step η = ``--eta-l``/L for
every method. Networks, the issue's faults as far as each kind of run takes them:

* robust-push-tracking and D-PSGD (synchronous rounds paced on wall clocks,
  docs/network.md "Synchronous rounds in wall-clock time"): ``loss=0.1;stale=geom:0.5;
  slow=nodes:0x5`` — 10 % of the messages lost, the rest late by a geometric number of rounds of
  mean 1, node 0's steps 5 s instead of 1 s (× SCALE wall seconds): every round waits for it;
* AD-PSGD (free, docs/asynchronous.md "Free-running under mpiexec"): ``loss=0.1;slow=nodes:0x5``
  (a free run refuses ``stale=``, which counts whole synchronous rounds; AD-PSGD's own
  asynchrony already makes its gradients stale), nobody waits for the straggler.

Each method runs for the same virtual time ``--virtual-s`` (rounds of 5 s for the synchronous
ones; the sweeps of mean compute time for AD-PSGD), ``Engine(free_run=SCALE)`` under
``mpiexec -n 8`` (one launch per method and seed, this script's ``--worker``), and once in
virtual time in this process (the same seeds: its drops and lags and, for the rounds, its
numbers are the free run's). The distance is the worst node's ``max_i ‖x_i − x*‖ / ‖x⁰ − x*‖``
at every record (every ``--log-virtual-s`` virtual seconds: a round record of the paced runs,
a snapshot instant of AD-PSGD's). Columns per target (``--targets``): how many seeds reached
it, the virtual time to it, the wall time to it under mpiexec (``wall_s`` of the first record at
or below it), their ratio over SCALE (what the machine adds to the slept compute times: the
real computation and transfers of 8 ranks on a loaded machine), the speedup over D-PSGD in wall
time; then the distance at the end in virtual time and under mpiexec (with a constant step
D-PSGD and AD-PSGD stop at a floor set by the data's heterogeneity: this column shows it) and
the machine's 1-minute load average before and after each method's runs.
Medians over ``--seeds``; a seed that never reached a target counts as infinitely slow.

    python benchmarks/bench_free_run.py              # ~25 min on two cores at load 12-15
    python benchmarks/bench_free_run.py --write docs/network.md
    python benchmarks/bench_free_run.py --seeds 0 --virtual-s 200 --scale 0.002  # does it run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_async import mpiexec  # noqa: E402
from docpage import write_between_markers  # noqa: E402

import topologies  # noqa: E402
from gossip import Engine, make_algorithm, make_problem  # noqa: E402
from gossip.comm.launch import launcher_rank  # noqa: E402
from gossip.errors import DivergenceError  # noqa: E402
from gossip.metrics import squared_distances  # noqa: E402

NODES = 8
GRAPH = "exponential"
SLOW = 5.0
"""Node 0's factor: a synchronous round lasts SLOW virtual seconds."""
FAULTS = "loss=0.1;stale=geom:0.5;slow=nodes:0x5"
METHODS = {  # name: (weights, network)
    "robust-push-tracking": ("push", FAULTS),
    "dpsgd": ("metropolis", FAULTS),
    "ad-psgd": ("uniform", "loss=0.1;slow=nodes:0x5"),
}
REFERENCE = "dpsgd"
"""The speedups' reference: synchronous, it waits for the straggler every round."""
SECTION = "bench_free_run"


def run(algorithm: str, seed: int, virtual_s: float, log_virtual_s: float, eta_l: float,
        scale: float | None = None) -> dict[str, Any]:
    """One run: ``[(distance, time, round)]`` at every record (``time``: ``time_virtual_s``, or
    ``wall_s`` under ``scale``), its last distance, whether it diverged."""
    weights, network = METHODS[algorithm]
    problem = make_problem("least-squares", n_nodes=NODES, dim=20, samples_per_node=30,
                           heterogeneity=1.0, seed=seed, dtype=torch.float64)
    x0, xs = problem.initial_point(), problem.solution()
    norm = float((x0 - xs).norm())
    engine = Engine(make_algorithm(algorithm, eta=eta_l / problem.smoothness().L),
                    topologies.build(GRAPH, NODES, weights=weights), lambda i: x0,
                    compressor="none", seed=seed, network=network, dtype=torch.float64,
                    free_run=scale, oracles=lambda i, gen: problem.oracle(i, gen, "full", 2))
    asynchronous = engine.algorithm.asynchronous
    per = 1.0 if asynchronous else SLOW  # virtual seconds of a sweep, of a round
    budget = max(1, round(virtual_s / per))
    every = max(1, round(log_virtual_s / per))

    def distance(e: Engine, xbar: torch.Tensor) -> dict[str, float]:
        worst = max(e.node_values(squared_distances(e, xs)).tolist())
        return {"distance": math.sqrt(worst) / norm}

    records: list[dict[str, Any]] = []
    diverged = False
    try:
        engine.run(budget, log_every=every, metrics=[distance], on_record=records.append)
    except DivergenceError:
        diverged = True
    clock = "time_virtual_s" if scale is None else "wall_s"
    records = [r for r in records if r["type"] == "round" and clock in r]
    return {"trace": [(r["distance"], r[clock], r["round"]) for r in records],
            "final": math.inf if diverged else records[-1]["distance"],
            "lost": records[-1].get("messages_lost_total", 0) if records else 0}


def free_run(algorithm: str, seed: int, virtual_s: float, log_virtual_s: float, eta_l: float,
             scale: float) -> dict[str, Any]:
    """:func:`run` under ``mpiexec -n 8`` with ``free_run=scale``, read back from rank 0."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [mpiexec(), "-n", str(NODES), sys.executable, str(Path(__file__).resolve()),
               "--worker", algorithm, str(seed), str(out), "--virtual-s", repr(virtual_s),
               "--log-virtual-s", repr(log_virtual_s), "--eta-l", repr(eta_l),
               "--scale", repr(scale)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True,
                             timeout=300 + 10 * virtual_s * scale)
        if res.returncode != 0 or not out.exists():
            raise SystemExit(f"the free run of {algorithm} (seed {seed}) failed with exit status "
                             f"{res.returncode}:\n{(res.stdout + res.stderr)[-2000:]}")
        return json.loads(out.read_text())


def reach(result: dict[str, Any], target: float) -> float:
    """The time of the first record at or below ``target`` (infinite if none)."""
    return next((t for d, t, _ in result["trace"] if d <= target), math.inf)


def _num(value: float, fmt: str = ".3g") -> str:
    return format(value, fmt) if math.isfinite(value) else "—"


def table(results: dict[str, tuple[list[dict], list[dict]]], targets: list[float],
          scale: float, loads: dict[str, str]) -> str:
    """One row per method (module doc); medians over the seeds."""
    heads = []
    for target in targets:
        heads += [f"reached {target:g} (seeds, virtual / mpiexec)",
                  f"virtual time to {target:g} (s)", f"wall time to {target:g}, mpiexec (s)",
                  f"wall / (virtual × {scale:g})", f"wall speedup vs {REFERENCE} to {target:g}"]
    lines = ["| method | network | " + " | ".join(heads) + " | distance at the end (virtual / "
             "mpiexec) | load average (1 min, before / after) |",
             "|---|---|" + "---|" * (len(heads) + 2)]
    for algorithm, (virtual, wall) in results.items():
        cells = []
        for target in targets:
            tv = [reach(r, target) for r in virtual]
            tw = [reach(r, target) for r in wall]
            ref = statistics.median(reach(r, target) for r in results[REFERENCE][1])
            mv, mw = statistics.median(tv), statistics.median(tw)
            speedup = ref / mw if math.isfinite(mw) else math.nan
            cells += [f"{sum(map(math.isfinite, tv))}/{sum(map(math.isfinite, tw))} of {len(tv)}",
                      _num(mv), _num(mw), _num(mw / (mv * scale) if mv > 0 else math.nan, ".2f"),
                      f"∞ ({REFERENCE} never)" if math.isfinite(mw) and not math.isfinite(ref)
                      else _num(speedup, ".2f")]
        final = " / ".join(_num(statistics.median(r["final"] for r in rows), ".2g")
                           for rows in (virtual, wall))
        lines.append(f"| {algorithm} | {METHODS[algorithm][1]} | " + " | ".join(cells)
                     + f" | {final} | {loads[algorithm]} |")
    return "\n".join(lines)


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--virtual-s", type=float, default=6000.0,
                   help="virtual seconds of every run (1200 rounds of the straggler's 5 s)")
    p.add_argument("--log-virtual-s", type=float, default=25.0,
                   help="virtual seconds between records")
    p.add_argument("--scale", type=float, default=0.01, help="wall seconds per virtual second")
    p.add_argument("--eta-l", type=float, default=0.2, help="every method's step, times L")
    p.add_argument("--targets", type=float, nargs="+", default=[0.3, 1e-6, 1e-10],
                   help="relative distances max_i ‖x_i − x*‖ / ‖x⁰ − x*‖")
    p.add_argument("--methods", nargs="+", choices=tuple(METHODS), default=list(METHODS))
    p.add_argument("--worker", nargs=3, metavar=("ALGORITHM", "SEED", "OUT"),
                   help=argparse.SUPPRESS)  # one rank of an mpiexec run
    p.add_argument("--write", type=Path, metavar="PAGE",
                   help=f"also write the table into PAGE between the {SECTION} markers")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if not args.scale > 0:
        raise SystemExit(f"--scale {args.scale!r}: give the wall seconds per virtual second (> 0)")
    if args.worker is not None:
        algorithm, seed, out = args.worker
        result = run(algorithm, int(seed), args.virtual_s, args.log_virtual_s, args.eta_l,
                     args.scale)
        if launcher_rank() == 0:
            Path(out).write_text(json.dumps(result))
        return ""
    if REFERENCE not in args.methods:
        raise SystemExit(f"--methods: keep {REFERENCE}, the speedups' reference")
    tic = time.perf_counter()
    results, loads = {}, {}
    for algorithm in args.methods:
        before = _load()
        virtual = [run(algorithm, s, args.virtual_s, args.log_virtual_s, args.eta_l)
                   for s in args.seeds]
        wall = [free_run(algorithm, s, args.virtual_s, args.log_virtual_s, args.eta_l,
                         args.scale) for s in args.seeds]
        results[algorithm], loads[algorithm] = (virtual, wall), f"{before} / {_load()}"
        print(f"done: {algorithm}", file=sys.stderr, flush=True)
    seeds = " ".join(map(str, args.seeds))
    out = (f"Wall time to the worst node's relative distance under `mpiexec -n {NODES}` "
           f"(`--free-run` SCALE = {args.scale:g} wall s per virtual s), {NODES} nodes on "
           f"`{GRAPH}`, η = {args.eta_l:g}/L for every method, {args.virtual_s:g} virtual "
           f"seconds each, median over seeds {seeds}; {os.cpu_count()} CPU cores shared by the "
           f"{NODES} ranks and other jobs ({time.perf_counter() - tic:.0f} s)\n\n"
           + table(results, args.targets, args.scale, loads))
    print(out)
    if args.write is not None:
        write_between_markers(args.write, out, SECTION)
    return out


if __name__ == "__main__":
    main()
