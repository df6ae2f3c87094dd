"""Scale benchmark: in-process runs of 10⁴ to 10⁶ nodes on a ring, their setup, first round and
steady rounds apart (not a test; ``make bench``).

Each row is one fresh interpreter (so its max RSS is its own): the ring is built (``graph s``),
then the engine (``setup s``: nodes, block, routing and the algorithm's setup, from a tensor
of every node's initial vector, drawn before), then ``--rounds`` rounds without metrics
records; ``first round s`` pays numba's compilation and the kernels' first touch of their
buffers, ``steady s/round`` is the mean of the rounds after it. ``linear`` is
steady(n) / (n/10⁴ × steady(10⁴)) for the same method and d: 1 when a round scales linearly in
the nodes (issue 43's target: within 1.5). ``estimate`` is gossip.memory's estimate printed
before anything is allocated (what the scripts refuse a run by) plus what the interpreter held
at that moment (imports and the graph: ~0.3 GiB), next to the measured peak RSS (``VmHWM``).

Methods: CHOCO-Gossip with top-1 % (``choco``, consensus), D-PSGD (``dpsgd``) on the consensus
problem ``f_i(x) = ‖x − c_i‖²/2`` (full gradients: ``problem.oracles("full")``, every node's
oracle in one object of arrays, no per-node object), and asynchronous
pairwise gossip (``pairwise-gossip``, one "round" a sweep of n activations in virtual time).
An asynchronous sweep is n events whose trace (clocks, peers, fates) is walked in Python; runs of
consecutive exchanges between disjoint pairs are applied as one vectorized update. Rows past
``--async-max`` nodes are not run; the table gives the time per event measured at the largest
one run.

    python benchmarks/bench_scale.py                                # prints the table
    python benchmarks/bench_scale.py --write docs/performance.md   # and puts it in the page
    python benchmarks/bench_scale.py --max-nodes 100000            # without the 10⁶ rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

METHODS = {
    "choco": ("choco", "topk:0.01", {"gamma": 0.05}, "CHOCO top-1%"),
    "dpsgd": ("dpsgd", "none", {"eta": 0.1}, "D-PSGD"),
    "pairwise-gossip": ("pairwise-gossip", "none", {}, "pairwise gossip (async)"),
}
"""Name -> (algorithm, compressor, hyper-parameters, label in the table)."""

ROWS = ((10_000, 1000), (100_000, 1000), (10_000, 100), (100_000, 100), (1_000_000, 100))
"""(nodes, d) of the table, for every method."""

HEADER = ("| method | nodes | d | graph s | setup s | first round s | steady s/round | linear "
          "| max RSS | estimate |\n|---|---|---|---|---|---|---|---|---|---|")
"""The table's header (a docs test finds it in docs/performance.md)."""


def one(method: str, n: int, d: int, rounds: int) -> dict:
    """One row, in this interpreter: build, time, measure (called in a fresh one by :func:`main`)."""
    import time

    import torch

    sys.path.insert(0, str(ROOT))
    import topologies
    from gossip import memory
    from gossip.algorithms import algorithm_class, make_algorithm
    from gossip.cli.checks import run_footprint
    from gossip.engine import Engine
    from gossip.problems.consensus import Consensus

    torch.set_num_threads(1)
    name, spec, hparams, _ = METHODS[method]
    cls = algorithm_class(name)
    tic = time.perf_counter()
    topo = topologies.build("ring", n)
    graph_s = time.perf_counter() - tic
    extra = {"problem": n * d * 4.0} if cls.requires.gradients else {}
    fp = run_footprint(nodes=n, numel=d, itemsize=4, algorithms=[cls], compressors=[spec],
                       degree=int(topo.degrees().max()), extra=extra,
                       per_node_init=False)  # x0: one tensor of every row
    resident = memory.peak_rss()  # the interpreter, its imports and the graph, before the run
    print(f"memory estimate: {memory.format_size(fp.total)} ({fp.describe()}), on top of "
          f"{memory.format_size(resident)} resident", file=sys.stderr)
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(0))  # every row at once
    oracles = None
    if cls.requires.gradients:
        targets = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
        problem = Consensus(targets, dtype=torch.float32)
        oracles = problem.oracles("full")  # a block's at once (FullGradientRows)
    tic = time.perf_counter()
    eng = Engine(make_algorithm(name, **hparams), topo, x0, compressor=spec, oracles=oracles,
                 dtype=torch.float32)
    built_s = time.perf_counter() - tic
    for _ in range(rounds):
        eng.step()
    summary = eng.summary()
    return {"method": method, "nodes": n, "d": d, "rounds": rounds, "graph_s": graph_s,
            "setup_s": summary["setup_s"], "engine_s": built_s,
            "first_round_s": summary["first_round_s"],
            "steady_s_per_round": summary["steady_s_per_round"],
            "max_rss": memory.peak_rss(),
            "estimate": resident + fp.total, "estimate_run": fp.total}


def run_row(method: str, n: int, d: int, rounds: int, timeout: float) -> dict:
    """:func:`one` in a fresh interpreter (its RSS its own); a failure or timeout is a row saying so."""
    cmd = [sys.executable, __file__, "--one", method, str(n), str(d), str(rounds)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"method": method, "nodes": n, "d": d, "error": f"over {timeout:g} s"}
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return {"method": method, "nodes": n, "d": d, "error": tail[:120]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def format_row(row: dict, base: dict | None) -> str:
    label = METHODS[row["method"]][3]
    head = f"| {label} | {row['nodes']:,} | {row['d']} |"
    if "error" in row or "skipped" in row:
        why = row.get("error") or row["skipped"]
        return head + f" {why} |" + " |" * 6
    steady = row["steady_s_per_round"]
    linear = "—"
    if base is not None and base.get("steady_s_per_round") and steady:
        linear = f"{steady / (row['nodes'] / base['nodes'] * base['steady_s_per_round']):.2f}"
    return (head + f" {row['graph_s']:.2f} | {row['setup_s']:.2f} | {row['first_round_s']:.3f} "
            f"| {steady:.4f} | {linear} | {_size(row['max_rss'])} | {_size(row['estimate'])} |")


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--max-nodes", type=int, default=1_000_000,
                   help="leave out the rows of more nodes (default 10^6)")
    p.add_argument("--async-max", type=int, default=1_000_000,
                   help="largest asynchronous row run (a sweep is n events; default 10^6)")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds per row (the first is timed apart; default 5, at most 3 from 10^5 nodes)")
    p.add_argument("--rows", default=None,
                   help="only these rows, e.g. 10000x100,100000x100 (default: the table's)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a row may take")
    p.add_argument("--write", type=Path, metavar="PAGE",
                   help="also write the table into PAGE between its bench_scale markers "
                        "(make bench: docs/performance.md)")
    p.add_argument("--one", nargs=4, metavar=("METHOD", "N", "D", "ROUNDS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        method, n, d, rounds = args.one
        print(json.dumps(one(method, int(n), int(d), int(rounds))), flush=True)
        return ""
    rows = ROWS if args.rows is None else tuple(
        tuple(int(v) for v in item.split("x")) for item in args.rows.split(","))
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    emit(f"ring, float32, in process, one torch thread, load average {load:.1f} at the start; "
         f"rounds without metrics records (`benchmarks/bench_scale.py`)\n")
    emit(HEADER)
    per_event = None
    for method in args.methods:
        bases: dict[int, dict] = {}
        for n, d in rows:
            if n > args.max_nodes:
                continue
            if METHODS[method][0] == "pairwise-gossip" and n > args.async_max:
                est = "" if per_event is None else f"; est. {per_event * n:.0f} s a sweep"
                row = {"method": method, "nodes": n, "d": d,
                       "skipped": f"not run: a sweep is {n:,} events{est}"}
            else:
                rounds = args.rounds if n < 100_000 else min(args.rounds, 3)
                row = run_row(method, n, d, rounds, args.timeout)
            if n == 10_000 and "error" not in row and "skipped" not in row:
                bases[d] = row
            emit(format_row(row, bases.get(d)))
            if (METHODS[method][0] == "pairwise-gossip" and row.get("steady_s_per_round")):
                per_event = row["steady_s_per_round"] / n
    out = "\n".join(lines)
    if args.write is not None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from docpage import write_between_markers

        write_between_markers(args.write, out, "bench_scale")
    return out


if __name__ == "__main__":
    main()
