"""Running sums under lost and late messages together: the table of docs/network.md, "Running
sums" (issue 42).

16 nodes, float64, in this process, on ``exponential`` (undirected, i ~ i ± 2^k) and
``directed-exponential`` (i → i + 2^k), each method's graph weights as it needs them (``push``:
column-stochastic; ``metropolis`` for DIGing, which needs a doubly stochastic W and so runs on
the undirected graph only). Networks: none; ``loss=0.1;stale=geom:0.5;slow=nodes:0x5`` (10 %
of the messages lost, the rest late by a geometric number of rounds of mean 1, node 0 five
times slower: its compute time counts in ``time_virtual_s``, the rounds wait for it). Each
setting runs once per ``--seeds`` seed (it draws the data, the initial vectors, the drops and
the lags); every cell is the median over the seeds of its column.

* Averaging (``--rounds-avg``, default 400): x_i⁰ ~ N(0, I) in d = 20; ``robust-push-sum`` and
  ``push-sum`` (whose lost share stays at its sender: the engine tells it, as an
  acknowledgement would; running sums need no acknowledgement and survive reordering).
  Columns: the worst node's error to the exact average ``max_i ‖x_i − x̄⁰‖ / ‖x̄⁰‖``, the
  first round it is below 1e-12, messages lost, late and superseded, bits per node.
* Least squares (``--rounds-opt``, default 1200): d = 20, 30 samples per node, heterogeneity
  1, x⁰ = 0, step 0.2/L; ``robust-push-tracking`` and ``diging``. Columns: the relative
  distance ``max_i ‖x_i − x*‖ / ‖x⁰ − x*‖`` at the last round, the first round it is below
  1e-8 (the rate), ``time_virtual_s`` at the last round, messages lost, late, superseded.

    python benchmarks/bench_running_sums.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import topologies  # noqa: E402
from gossip import Engine, make_algorithm, make_problem  # noqa: E402
from gossip.errors import DivergenceError  # noqa: E402

NODES = 16
GRAPHS = ("exponential", "directed-exponential")
NETWORKS = ("none", "loss=0.1;stale=geom:0.5;slow=nodes:0x5")
AVERAGING = ("robust-push-sum", "push-sum")
TRACKING = ("robust-push-tracking", "diging")


def _weights(algorithm: str) -> str:
    return "metropolis" if algorithm == "diging" else "push"


def _counts(engine: Engine) -> dict[str, float]:
    rec = engine.record()
    return {"lost": float(rec.get("messages_lost_total", 0)),
            "late": float(rec.get("messages_late_total", 0)),
            "superseded": float(rec.get("superseded", math.nan)),
            "bits": float(rec["bits_per_node"]),
            "time": float(rec.get("time_virtual_s", math.nan))}


def averaging_run(algorithm: str, graph: str, network: str, seed: int, rounds: int) -> dict:
    topo = topologies.build(graph, NODES, weights=_weights(algorithm))
    X0 = torch.randn(NODES, 20, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    mean0 = X0.mean(0)
    engine = Engine(make_algorithm(algorithm), topo, lambda i: X0[i].clone(), compressor="none",
                    seed=seed, network=None if network == "none" else network)
    first = math.nan
    for t in range(1, rounds + 1):
        engine.step()
        err = float((engine.block.x - mean0).norm(dim=1).max() / mean0.norm())
        if math.isnan(first) and err < 1e-12:
            first = t
    return {"error": err, "first": first, **_counts(engine)}


def tracking_run(algorithm: str, graph: str, network: str, seed: int, rounds: int) -> dict:
    problem = make_problem("least-squares", n_nodes=NODES, dim=20, samples_per_node=30,
                           heterogeneity=1.0, seed=seed, dtype=torch.float64)
    x0, xs = problem.initial_point(), problem.solution()
    topo = topologies.build(graph, NODES, weights=_weights(algorithm))
    engine = Engine(make_algorithm(algorithm, eta=0.2 / problem.smoothness().L), topo,
                    lambda i: x0, compressor="none", seed=seed,
                    network=None if network == "none" else network,
                    oracles=lambda i, gen: problem.oracle(i, gen, "full", 2))
    first, dist = math.nan, math.inf
    try:
        for t in range(1, rounds + 1):
            engine.step()
            dist = float((engine.block.x - xs).norm(dim=1).max() / (x0 - xs).norm())
            if math.isnan(first) and dist < 1e-8:
                first = t
    except DivergenceError:
        return {"distance": math.inf, "first": math.nan, "time": math.nan, "lost": math.nan,
                "late": math.nan, "superseded": math.nan, "bits": math.nan}
    return {"distance": dist, "first": first, **_counts(engine)}


def _median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if not math.isnan(r[key])]
    return statistics.median(values) if values else math.nan


def _cell(v: float, form: str = ".3g") -> str:
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "diverged"
    return format(v, form) if form != "int" else str(int(v))


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds-avg", type=int, default=400)
    p.add_argument("--rounds-opt", type=int, default=1200)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tic = time.perf_counter()
    lines = ["| method | graph | network | error to the average (worst node) | first round < 1e-12 "
             "| messages lost | late | superseded | bits/node |", "|" + "---|" * 9]
    for alg in AVERAGING:
        for graph in GRAPHS:
            for net in NETWORKS:
                rows = [averaging_run(alg, graph, net, s, args.rounds_avg) for s in args.seeds]
                med = {k: _median(rows, k) for k in rows[0]}
                lines.append(f"| {alg} | {graph} | {net} | {_cell(med['error'])} | "
                             f"{_cell(med['first'], 'int')} | {_cell(med['lost'], 'int')} | "
                             f"{_cell(med['late'], 'int')} | {_cell(med['superseded'], 'int')} | "
                             f"{_cell(med['bits'], '.4g')} |")
                print(lines[-1], flush=True)
    lines += ["", "| method | graph | network | distance to x* (rel.), last round | first round "
              "< 1e-8 | time_virtual_s | messages lost | late | superseded |", "|" + "---|" * 9]
    for alg in TRACKING:
        for graph in GRAPHS:
            if alg == "diging" and graph.startswith("directed"):
                continue  # needs a doubly stochastic W
            for net in NETWORKS:
                rows = [tracking_run(alg, graph, net, s, args.rounds_opt) for s in args.seeds]
                med = {k: _median(rows, k) for k in rows[0]}
                lines.append(f"| {alg} | {graph} | {net} | {_cell(med['distance'])} | "
                             f"{_cell(med['first'], 'int')} | {_cell(med['time'], '.4g')} | "
                             f"{_cell(med['lost'], 'int')} | {_cell(med['late'], 'int')} | "
                             f"{_cell(med['superseded'], 'int')} |")
                print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(f"\n{table}\n\n({time.perf_counter() - tic:.0f} s)")
    return table


if __name__ == "__main__":
    main()
