"""Asynchronous methods in virtual time: the two tables of docs/asynchronous.md.

**1. Time to a target with a straggler.** 8 nodes on a ring (``--graph``; every method runs on
the same graph: D-PSGD with its Metropolis weights, 1/3 on the ring; AD-PSGD and
gossip-learning with a uniform random neighbor; async-SGP sends to its two neighbors in turn,
as it accepts any graph), heterogeneous least squares (``make_problem("least-squares",
n_nodes=8, dim=50, samples_per_node=50, heterogeneity=1, seed=S)``, x⁰ = 0, full gradients),
float64, the same step size ``--eta`` for every method, for ``--sweeps`` sweeps (a synchronous
round, or n = 8 activations of an asynchronous method: 8 gradients either way). Networks:
``compute=exp:1`` (every step takes an exponential time of mean 1 s, messages arrive at once)
and ``compute=exp:1;slow=nodes:0x5`` (the same, node 0 five times slower). D-PSGD's
``time_virtual_s`` is the SyncClock's (a round ends when the node's step and its
in-neighbors' messages are done, docs/network.md); an asynchronous run's is the time of its
last event. Each setting runs once per ``--seeds`` seed (the data, the clocks and the partner
draws); the table gives medians over the seeds.

A table per ``--targets`` value. Columns: how many seeds reached the target relative
distance (1/n) Σ‖x_i − x*‖² / ‖x*‖² ≤ target (checked after every sweep); the virtual time,
sweeps and bits per node at the first sweep that reached it (median over the seeds; a seed
that never reached it counts as infinitely slow); the speedup, D-PSGD's median time on the same
network over the method's; the slowdown from the straggler, the method's median time with it
over without ("—" where a median is infinite); the distance after the last sweep; the runs
that diverged (the engine stops a run whose consensus error grows 10⁶-fold: what it reached
before counts, its final distance is infinite).

**2. Randomized pairwise gossip on 10⁴ nodes.** ``pairwise-gossip`` (rate-1 Poisson clocks,
``x_i, x_j ← (x_i + x_j)/2`` with a uniform neighbor) on ``--pairwise-nodes`` nodes, graphs
``--pairwise-graphs`` (``topologies.build``), x_i⁰ ~ N(0, I_d) (float64, a fixed seed), for
``--pairwise-sweeps`` sweeps (k · n activations), d in ``--dims``; side by side with a bare
reference doing the same pairwise averages: a ``heapq`` of rate-1 Poisson clocks, a uniform
neighbor from the same topology's neighbor lists, the average of two rows of a numpy array
(numpy's generator draws, in bulk, so its trajectory is another sample of the same process).
Each (graph, d, implementation) runs in a fresh process (``--in-process``: all in this one).
Columns: setup wall time (``Engine(...)`` and its first record; the reference: neighbor lists
and the array), events per second over all k sweeps (the engine's records at sweeps k − 1 and k included),
µs per event in the last sweep alone (the engine's record subtracted: its per-event cost once
the keyed draws of every node are cached), their ratio engine / reference, peak memory: the
growth of ``ru_maxrss`` from after the graph is built to the end of the run (so it counts what
the run allocates beyond that point's peak; in-process runs after the first read 0), the
consensus error (1/n) Σ‖x_i − x̄‖² relative to its value at 0 after k sweeps, and the virtual
time reached.

**3. The same under mpiexec** (``--mpi SCALE``, optional): the methods of table 1 on the same
problem, graph, step size and networks, each under ``mpiexec -n 8`` with
``Engine(free_run=SCALE)``, one node per rank. The asynchronous ones run free
(gossip/network/freerun.py): a node's k-th step sleeps its ``compute=``/``slow=`` draw × SCALE
wall seconds, exchanges happen in wall-clock order, and the run is snapshot every sweep (every
SCALE wall seconds). D-PSGD keeps its rounds (gossip/network/clock.py): each rank sleeps
its node's draw of the round × SCALE before sending and waits for its neighbors' messages, a
record every round giving the round's end in wall time (the records' own time taken out).
Seeds ``--mpi-seeds`` (default: the first of ``--seeds``), ``--mpi-sweeps`` sweeps (default
``--sweeps``), one ``mpiexec`` launch per (method, network, seed). Per target: the virtual time
to it (in process, the event loop or the SyncClock, same seeds), that time × SCALE, the wall
time to it under mpiexec (the first snapshot instant or round whose distance is at or below
the target), their ratio, the speedup over D-PSGD on the same network in virtual and in wall
time (D-PSGD's median time over the method's), the local steps (gradients; a round is 8) taken
by then in both, and the distance at the end of each.

**4. Digits under mpiexec** (``--mpi SCALE --digits``): the issue's second setting, a model
trained by ``experiments/train.py`` instead of least squares. 8 nodes on ``--graph``, node 0
five times slower (``compute=exp:1;slow=nodes:0x5``), scikit-learn's digits split iid, an MLP
with ``--digits-hidden`` hidden units, plain SGD (``--optimizer sgd``; async-SGP takes the
plain gradient anyway) with the same ``--digits-lr`` for every method, batch 32, for
``--digits-epochs`` epochs (6 sweeps each), a record every sweep. Each method runs twice per
seed: in virtual time in this machine's python (a fresh process) and under ``mpiexec -n 8``
with ``--free-run SCALE``. Per target test accuracy of the averaged model (``--digits-targets``)
the table of part 3, with the test error 1 − accuracy in place of the distance: the first
record at or above the target gives the time (``time_virtual_s``; under mpiexec ``wall_s``,
a snapshot instant of the asynchronous methods, a round's end for D-PSGD) and the local steps
then; the last column is the final test error. Its own markers (``bench_async_digits``).

    python benchmarks/bench_async.py                     # the docs' tables, ~70 s on one busy core
    python benchmarks/bench_async.py --sweeps 40 --seeds 0 --targets 0.5 --pairwise-nodes 200 \\
        --pairwise-graphs ring --pairwise-sweeps 2 --dims 1 --in-process   # does it run (seconds)
    python benchmarks/bench_async.py --write docs/asynchronous.md   # and put them in the page
    python benchmarks/bench_async.py --skip straggler pairwise --mpi 0.05 --write docs/asynchronous.md
    python benchmarks/bench_async.py --skip straggler pairwise --mpi 0.1 --digits \
        --write docs/asynchronous.md
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from docpage import markers, write_between_markers  # noqa: E402

import topologies  # noqa: E402
from gossip import Engine, make_algorithm  # noqa: E402
from gossip.comm.launch import launcher_rank  # noqa: E402
from gossip.errors import DivergenceError  # noqa: E402
from gossip.metrics import squared_distance  # noqa: E402
from gossip.problems import make_problem  # noqa: E402

NODES = 8
LSQ_DIM, LSQ_SAMPLES, LSQ_HETEROGENEITY = 50, 50, 1.0
METHODS = ("dpsgd", "ad-psgd", "async-sgp", "gossip-learning")
"""The straggler table's algorithms; the first, synchronous, is the speedups' reference."""
NETWORKS = ("compute=exp:1", "compute=exp:1;slow=nodes:0x5")
"""Without and with the straggler (node 0 five times slower)."""
BEGIN, END = markers("bench_async")
"""The markers around the tables in docs/asynchronous.md (``--write``)."""
MPI_SECTION = "bench_async_mpi"
"""The markers' name around the mpiexec table (``--mpi`` with ``--write``)."""
DIGITS_SECTION = "bench_async_digits"
"""The markers' name around the digits tables (``--mpi --digits`` with ``--write``)."""

Row = dict[str, float]


# -- 1. time to a target with a straggler ---------------------------------------------------
def straggler_run(algorithm: str, network: str, seed: int, sweeps: int, eta: float,
                  graph: str = "ring", free_run: float | None = None) -> dict[str, Any]:
    """One least-squares run: its distance to x* after every sweep (with the virtual time,
    the sweep and the bits per node then), the local steps then, its last distance and
    whether it diverged. ``free_run``: run free under mpiexec (one node per rank, this many
    wall seconds per virtual second); the times are then the snapshots' wall instants."""
    topo = topologies.build(graph, NODES)
    problem = make_problem("least-squares", n_nodes=NODES, dim=LSQ_DIM,
                           samples_per_node=LSQ_SAMPLES, heterogeneity=LSQ_HETEROGENEITY,
                           seed=seed, dtype=torch.float64)
    x_star, x0 = problem.solution(), problem.initial_point()
    engine = Engine(make_algorithm(algorithm, eta=eta), topo, lambda i: x0, seed=seed,
                    network=network, dtype=torch.float64, free_run=free_run,
                    oracles=lambda i, gen: problem.oracle(i, gen))
    records: list[dict[str, Any]] = []
    clock = "time_virtual_s" if free_run is None else "wall_s"
    steps = "activations" if free_run is None else "local_steps"

    def distance(e: Engine, xbar: torch.Tensor) -> dict[str, float]:
        return {"distance": squared_distance(e, x_star)}

    diverged = False
    try:
        engine.run(sweeps, log_every=1, metrics=[distance], on_record=records.append)
    except DivergenceError:
        diverged = True
    records = [r for r in records if r["type"] == "round"]  # a free run's node records aside
    if not engine.algorithm.asynchronous:  # a round: a gradient per node
        steps = "gradients"
        for r in records:
            r[steps] = r["round"] * NODES
    return {"trace": [(r["distance"], r[clock], r["round"], r["bits_per_node"]) for r in records],
            "steps": [r.get(steps, 0) for r in records],
            "final": math.inf if diverged else records[-1]["distance"],
            "diverged": float(diverged)}


def reach(run: dict[str, Any], target: float) -> Row:
    """When ``run`` first reached ``target``: time, sweeps, bits, local steps (infinite if
    never)."""
    hit = next((k for k, t in enumerate(run["trace"]) if t[0] <= target), None)
    if hit is None:
        return {"reached": 0.0, "time": math.inf, "sweeps": math.inf, "bits": math.inf,
                "steps": math.inf}
    t = run["trace"][hit]
    steps = run["steps"][hit] if "steps" in run else math.nan
    return {"reached": 1.0, "time": t[1], "sweeps": float(t[2]), "bits": t[3], "steps": steps}


def measure_straggler(seeds: list[int], sweeps: int, eta: float, graph: str,
                      methods: tuple[str, ...] = METHODS
                      ) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every (method, network) over every seed."""
    results = {}
    for algorithm in methods:
        for network in NETWORKS:
            results[(algorithm, network)] = [
                straggler_run(algorithm, network, s, sweeps, eta, graph) for s in seeds]
        print(f"done: {algorithm}", file=sys.stderr, flush=True)
    return results


def _median(rows: list[Row], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _num(value: float, fmt: str = ".3g") -> str:
    return format(value, fmt) if math.isfinite(value) else "—"


def straggler_table(runs: dict[tuple[str, str], list[dict[str, Any]]], target: float,
                    graph: str, sweeps: int) -> str:
    """The straggler table for ``target`` (medians over the seeds)."""
    lines = ["| method | graph | network | reached (seeds) | virtual time to target (s) | "
             "sweeps to target | bits/node to target | speedup vs dpsgd | slowdown from "
             f"straggler | distance at sweep {sweeps} | diverged |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    hits = {key: [reach(r, target) for r in rows] for key, rows in runs.items()}
    reference = METHODS[0]
    for (algorithm, network), rows in hits.items():
        t = _median(rows, "time")
        ref = hits.get((reference, network))
        speedup = _median(ref, "time") / t if ref is not None and math.isfinite(t) else math.inf
        slowdown = math.inf
        if network != NETWORKS[0] and (algorithm, NETWORKS[0]) in hits:
            without = _median(hits[(algorithm, NETWORKS[0])], "time")
            slowdown = t / without if math.isfinite(without) else math.inf
        reached = sum(int(r["reached"]) for r in rows)
        whole = runs[(algorithm, network)]
        diverged = sum(int(r["diverged"]) for r in whole)
        lines.append(f"| {algorithm} | {graph} | {network} | {reached}/{len(rows)} | {_num(t)} | "
                     f"{_num(_median(rows, 'sweeps'), '.0f')} | {_num(_median(rows, 'bits'))} | "
                     f"{_num(speedup, '.2f')} | {_num(slowdown, '.2f')} | "
                     f"{_num(_median(whole, 'final'))} | {diverged}/{len(rows)} |")
    return "\n".join(lines)


# -- 3. the same under mpiexec ----------------------------------------------------------------
def mpiexec() -> str:
    """mpiexec next to this interpreter (the mpich wheel puts it in the venv), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit("--mpi: no mpiexec next to this python or on PATH; install mpi4py's "
                         "MPICH (pip install mpich) or leave --mpi out")
    return found


def free_run(algorithm: str, network: str, seed: int, sweeps: int, eta: float, graph: str,
             scale: float) -> dict[str, Any]:
    """:func:`straggler_run` under ``mpiexec -n 8`` with ``free_run=scale`` (this script's
    ``--worker``), its result read back from rank 0."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [mpiexec(), "-n", str(NODES), sys.executable, str(Path(__file__).resolve()),
               "--worker", algorithm, network, str(seed), str(out), "--sweeps", str(sweeps),
               "--eta", repr(eta), "--graph", graph, "--mpi", repr(scale)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        res = subprocess.run(cmd, env=env, capture_output=True, text=True,
                             timeout=120 + 3 * sweeps * scale * 5)
        if res.returncode != 0 or not out.exists():
            raise SystemExit(f"--mpi: the free run of {algorithm} on {network} (seed {seed}) "
                             f"failed with exit status {res.returncode}:\n"
                             f"{(res.stdout + res.stderr)[-2000:]}")
        return json.loads(out.read_text())


def measure_mpi(seeds: list[int], sweeps: int, eta: float, graph: str, scale: float
                ) -> dict[tuple[str, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Every (method, network): its runs in virtual time and under mpiexec (module doc, 3)."""
    results = {}
    for algorithm in METHODS:
        for network in NETWORKS:
            virtual = [straggler_run(algorithm, network, s, sweeps, eta, graph) for s in seeds]
            wall = [free_run(algorithm, network, s, sweeps, eta, graph, scale) for s in seeds]
            results[(algorithm, network)] = (virtual, wall)
            print(f"done: {algorithm} {network} under mpiexec", file=sys.stderr, flush=True)
    return results


def mpi_table(results: dict[tuple[str, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
              target: float, scale: float, final: str = "distance") -> str:
    """Virtual time to ``target`` against wall time under mpiexec (medians over the seeds);
    ``final``: what the runs' traces measure (the last column's name)."""
    lines = ["| method | network | reached (seeds, virtual / mpiexec) | virtual time to target (s) "
             f"| × SCALE = {scale:g} (s) | wall time to target, mpiexec -n {NODES} (s) | wall / "
             f"(virtual × SCALE) | speedup vs {METHODS[0]} (virtual / wall) | local steps to target "
             f"(virtual / mpiexec) | {final} at the end (virtual / mpiexec) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    times = {key: (_median([reach(r, target) for r in virtual], "time"),
                   _median([reach(r, target) for r in wall], "time"))
             for key, (virtual, wall) in results.items()}
    for (algorithm, network), (virtual, wall) in results.items():
        v = [reach(r, target) for r in virtual]
        w = [reach(r, target) for r in wall]
        tv, tw = times[(algorithm, network)]
        ratio = tw / (tv * scale) if math.isfinite(tv) and math.isfinite(tw) else math.inf
        ref = times.get((METHODS[0], network), (math.inf, math.inf))
        speedup = " / ".join(_num(r / t, ".2f") if math.isfinite(t) else "—"
                             for r, t in zip(ref, (tv, tw)))
        reached = f"{sum(int(r['reached']) for r in v)}/{sum(int(r['reached']) for r in w)} of {len(v)}"
        lines.append(
            f"| {algorithm} | {network} | {reached} | {_num(tv)} | {_num(tv * scale)} | "
            f"{_num(tw)} | {_num(ratio, '.2f')} | {speedup} | {_num(_median(v, 'steps'), '.0f')} / "
            f"{_num(_median(w, 'steps'), '.0f')} | {_num(_median(virtual, 'final'))} / "
            f"{_num(_median(wall, 'final'))} |")
    return "\n".join(lines)


# -- 4. digits under mpiexec ----------------------------------------------------------------
def digits_flags(algorithm: str, network: str, seed: int, epochs: float, hidden: int,
                 lr: float, graph: str) -> list[str]:
    """experiments/train.py's flags of one digits run (module doc, 4)."""
    from gossip.algorithms import algorithm_class

    optimizer = ["--optimizer", "sgd"] if algorithm_class(algorithm).takes_optimizer else []
    return ["--algorithm", algorithm, "--topology", graph, "--data", "digits", "--hidden",
            str(hidden), "--lr", repr(lr), *optimizer, "--batch-size", "32", "--epochs",
            repr(epochs), "--log-every", "1", "--network", network, "--seed", str(seed),
            "--no-progress"]


def digits_run(algorithm: str, network: str, seed: int, epochs: float, hidden: int, lr: float,
               graph: str, scale: float | None) -> dict[str, Any]:
    """One train.py run on the digits, in virtual time (``scale`` None: a python process with
    the 8 nodes) or under ``mpiexec -n 8 --free-run scale``: its test error 1 − accuracy of
    the averaged model at every record, with the time then (``time_virtual_s`` or
    ``wall_s``), the round and the bits per node, the local steps then and the final error."""
    from gossip.algorithms import algorithm_class
    from gossip.metrics import read_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.jsonl"
        flags = [*digits_flags(algorithm, network, seed, epochs, hidden, lr, graph),
                 "--out", str(out)]
        script = [sys.executable, str(ROOT / "experiments" / "train.py")]
        if scale is None:
            cmd, limit = [*script, *flags, "--nodes", str(NODES)], 900.0
        else:
            cmd = [mpiexec(), "-n", str(NODES), *script, *flags, "--free-run", repr(scale)]
            limit = 180 + 5 * 6 * epochs * scale * 5  # the sweeps, a straggler's rounds and more
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
        if res.returncode != 0 or not out.exists():
            where = "virtual time" if scale is None else f"mpiexec --free-run {scale:g}"
            raise SystemExit(f"--digits: train.py {algorithm} on {network} (seed {seed}, {where}) "
                             f"failed with exit status {res.returncode}:\n"
                             f"{(res.stdout + res.stderr)[-2000:]}")
        records = [r for r in read_jsonl(out) if r.get("type") == "round"]
    clock = "time_virtual_s" if scale is None else "wall_s"
    if not algorithm_class(algorithm).asynchronous:  # a round: a gradient per node
        steps = [r["round"] * NODES for r in records]
    else:
        steps = [r.get("activations" if scale is None else "local_steps", 0) for r in records]
    errors = [1.0 - r["test_accuracy"] for r in records]
    return {"trace": [(e, r[clock], r["round"], r["bits_per_node"])
                      for e, r in zip(errors, records, strict=True)],
            "steps": steps, "final": errors[-1], "diverged": 0.0}


def measure_digits(seeds: list[int], epochs: float, hidden: int, lr: float, graph: str,
                   scale: float, methods: tuple[str, ...] = METHODS
                   ) -> dict[tuple[str, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Every method on the straggler network: its digits runs in virtual time and under
    mpiexec (module doc, 4)."""
    network = NETWORKS[1]
    results = {}
    for algorithm in methods:
        virtual = [digits_run(algorithm, network, s, epochs, hidden, lr, graph, None)
                   for s in seeds]
        wall = [digits_run(algorithm, network, s, epochs, hidden, lr, graph, scale)
                for s in seeds]
        results[(algorithm, network)] = (virtual, wall)
        print(f"done: {algorithm} on the digits under mpiexec", file=sys.stderr, flush=True)
    return results


# -- 2. pairwise gossip on 10^4 nodes -------------------------------------------------------
def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _start(n: int, d: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(1234), dtype=torch.float64)


def _consensus(x: torch.Tensor | np.ndarray) -> float:
    x = torch.as_tensor(x)
    return float(((x - x.mean(0)) ** 2).sum(1).mean())


def pairwise_engine(graph: str, n: int, d: int, sweeps: int) -> Row:
    """``pairwise-gossip`` through the Engine for ``sweeps`` sweeps."""
    torch.set_num_threads(1)
    topo = topologies.build(graph, n)
    x0 = _start(n, d)
    error0 = _consensus(x0)
    rss0 = _maxrss_mib()
    t0 = time.perf_counter()
    engine = Engine(make_algorithm("pairwise-gossip"), topo, lambda i: x0[i], seed=0,
                    dtype=torch.float64)
    engine.run(0)  # set up: the event queue, every node's first clock draw; round 0's record
    t1 = time.perf_counter()
    if sweeps > 1:
        engine.run(sweeps - 1, log_every=sweeps - 1)
    t2 = time.perf_counter()
    engine.run(1, log_every=1)
    t3 = time.perf_counter()
    engine.record()  # what the last sweep's record cost, taken off its per-event time
    t4 = time.perf_counter()
    return {"setup": t1 - t0, "rate": sweeps * n / (t3 - t1),
            "last_us": max(t3 - t2 - (t4 - t3), 0.0) / n * 1e6,
            "rss": _maxrss_mib() - rss0, "consensus": _consensus(engine.block.x) / error0,
            "virtual": engine.network.events.now, "events": float(engine.network.events.activations)}


def pairwise_bare(graph: str, n: int, d: int, sweeps: int) -> Row:
    """The same pairwise averages in plain Python on a numpy array."""
    topo = topologies.build(graph, n)
    x0 = _start(n, d)
    error0 = _consensus(x0)
    rss0 = _maxrss_mib()
    t0 = time.perf_counter()
    neighbors = [topo.view(i).out_neighbors for i in range(n)]
    degree = [len(nb) for nb in neighbors]
    x = x0.numpy().copy()
    rng = np.random.default_rng(0)
    heap = [(float(t), i) for i, t in enumerate(rng.exponential(1.0, n))]
    heapq.heapify(heap)
    t1 = time.perf_counter()
    now = 0.0
    t_last = t1
    for _ in range(sweeps):
        t_last = time.perf_counter()
        intervals = rng.exponential(1.0, n).tolist()
        picks = rng.random(n).tolist()
        for e in range(n):
            now, i = heapq.heappop(heap)
            j = neighbors[i][int(picks[e] * degree[i])]
            mean = (x[i] + x[j]) * 0.5
            x[i] = mean
            x[j] = mean
            heapq.heappush(heap, (now + intervals[e], i))
    t3 = time.perf_counter()
    return {"setup": t1 - t0, "rate": sweeps * n / (t3 - t1), "last_us": (t3 - t_last) / n * 1e6,
            "rss": _maxrss_mib() - rss0, "consensus": _consensus(x) / error0, "virtual": now,
            "events": float(sweeps * n)}


IMPLEMENTATIONS: dict[str, Callable[[str, int, int, int], Row]] = {
    "engine": pairwise_engine, "bare": pairwise_bare}


def measure_pairwise(graphs: list[str], dims: list[int], n: int, sweeps: int,
                     in_process: bool) -> dict[tuple[str, int, str], Row]:
    """Every (graph, d, implementation), each in a fresh process unless ``in_process``."""
    results = {}
    for graph in graphs:
        for d in dims:
            for name, run in IMPLEMENTATIONS.items():
                if in_process:
                    results[(graph, d, name)] = run(graph, n, d, sweeps)
                else:
                    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
                        results[(graph, d, name)] = pool.submit(run, graph, n, d, sweeps).result()
                print(f"done: {graph} d={d} {name}", file=sys.stderr, flush=True)
    return results


def pairwise_table(results: dict[tuple[str, int, str], Row], n: int, sweeps: int) -> str:
    """The pairwise-gossip table: engine and reference rows side by side."""
    lines = [f"| graph | d | implementation | setup (s) | events/s ({sweeps} sweeps) | "
             "µs/event, last sweep | engine / bare (µs/event) | peak RSS growth (MiB) | "
             f"consensus error after {sweeps} sweeps (rel.) | virtual time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (graph, d, name), row in results.items():
        bare = results.get((graph, d, "bare"))
        ratio = (f"{row['last_us'] / bare['last_us']:.1f}" if name == "engine" and bare
                 and bare["last_us"] > 0 else "—")
        lines.append(f"| {graph} (n = {n}) | {d} | {name} | {row['setup']:.2f} | "
                     f"{row['rate']:.3g} | {row['last_us']:.3g} | {ratio} | {row['rss']:.0f} | "
                     f"{row['consensus']:.3g} | {row['virtual']:.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", type=int, default=400, help="sweeps (rounds) per straggler run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds (median)")
    p.add_argument("--eta", type=float, default=0.01, help="the step size of every method")
    p.add_argument("--targets", type=float, nargs="+", default=[0.1, 0.01],
                   help="target relative distances (1/n) Σ‖x_i − x*‖² / ‖x*‖²: a table each")
    p.add_argument("--graph", default="ring", help="the straggler runs' graph (8 nodes)")
    p.add_argument("--pairwise-nodes", type=int, default=10_000)
    p.add_argument("--pairwise-graphs", nargs="+", default=["ring", "geometric:r=0.03"])
    p.add_argument("--pairwise-sweeps", type=int, default=10)
    p.add_argument("--dims", type=int, nargs="+", default=[1, 100])
    p.add_argument("--in-process", action="store_true",
                   help="run the pairwise measurements in this process (no fresh processes)")
    p.add_argument("--skip", nargs="+", choices=("straggler", "pairwise"), default=[],
                   help="leave these tables out")
    p.add_argument("--mpi", type=float, metavar="SCALE",
                   help="also run every method under mpiexec -n 8 with --free-run SCALE (wall "
                        "seconds per virtual second; the asynchronous ones free, D-PSGD in "
                        "paced rounds): wall time to each target next to virtual time x SCALE")
    p.add_argument("--mpi-seeds", type=int, nargs="+", help="the mpiexec runs' seeds (default: "
                   "the first of --seeds)")
    p.add_argument("--mpi-sweeps", type=int, help="sweeps of the mpiexec runs (default --sweeps)")
    p.add_argument("--digits", action="store_true",
                   help="with --mpi: train the digits (experiments/train.py) instead of least "
                        "squares, every method with node 0 five times slower, in virtual time "
                        "and under mpiexec -n 8 --free-run SCALE: wall time to each "
                        "--digits-targets test accuracy next to virtual time x SCALE")
    p.add_argument("--digits-targets", type=float, nargs="+", default=[0.6, 0.8],
                   help="target test accuracies of the averaged model (--digits): a table each")
    p.add_argument("--digits-epochs", type=float, default=15.0, help="epochs of a --digits run")
    p.add_argument("--digits-hidden", type=int, default=32, help="the MLP's hidden units")
    p.add_argument("--digits-lr", type=float, default=0.2,
                   help="the plain SGD step of every method (--digits)")
    p.add_argument("--worker", nargs=4, metavar=("ALGORITHM", "NETWORK", "SEED", "OUT"),
                   help=argparse.SUPPRESS)  # one rank of a --mpi run
    p.add_argument("--write", type=Path, metavar="PAGE",
                   help=f"also write the output into PAGE between {BEGIN} and {END} (the "
                        f"mpiexec table between the {MPI_SECTION} markers)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.mpi is not None and not args.mpi > 0:
        raise SystemExit(f"--mpi {args.mpi!r}: give the wall seconds per virtual second (> 0)")
    if args.digits and args.mpi is None:
        raise SystemExit("--digits compares wall time under mpiexec with virtual time: give "
                         "--mpi SCALE with it")
    bad = [t for t in args.digits_targets if not 0 < t <= 1]
    if bad:
        raise SystemExit(f"--digits-targets {bad[0]!r}: give test accuracies in (0, 1]")
    if args.worker is not None:
        algorithm, network, seed, out = args.worker
        run = straggler_run(algorithm, network, int(seed), args.sweeps, args.eta, args.graph,
                            free_run=args.mpi)
        if launcher_rank() == 0:
            Path(out).write_text(json.dumps(run))
        return ""
    start = time.perf_counter()
    parts = []
    if "straggler" not in args.skip:
        t = time.perf_counter()
        runs = measure_straggler(args.seeds, args.sweeps, args.eta, args.graph)
        seeds = " ".join(map(str, args.seeds))
        took = time.perf_counter() - t
        for target in args.targets:
            parts.append(f"Time to (1/n) Σ‖x_i − x*‖² / ‖x*‖² ≤ {target:g}: {NODES} nodes on "
                         f"a {args.graph}, least squares (d = {LSQ_DIM}, {LSQ_SAMPLES} samples "
                         f"per node, heterogeneity {LSQ_HETEROGENEITY:g}), η = {args.eta:g} for "
                         f"every method, {args.sweeps} sweeps, median over seeds {seeds} "
                         f"({took:.0f} s for the runs of every target)\n\n"
                         + straggler_table(runs, target, args.graph, args.sweeps))
    if "pairwise" not in args.skip:
        t = time.perf_counter()
        results = measure_pairwise(args.pairwise_graphs, args.dims, args.pairwise_nodes,
                                   args.pairwise_sweeps, args.in_process)
        parts.append(f"pairwise-gossip on {args.pairwise_nodes} nodes, {args.pairwise_sweeps} "
                     f"sweeps ({args.pairwise_sweeps * args.pairwise_nodes} events), "
                     f"{'in this process' if args.in_process else 'a fresh process per row'} "
                     f"({time.perf_counter() - t:.0f} s)\n\n"
                     + pairwise_table(results, args.pairwise_nodes, args.pairwise_sweeps))
    out = "\n\n".join(parts)
    if out:
        print(out)
    if args.write is not None and out:
        write_between_markers(args.write, out, "bench_async")
    if args.mpi is not None and args.digits:
        t = time.perf_counter()
        seeds = args.mpi_seeds or args.seeds[:1]
        results = measure_digits(seeds, args.digits_epochs, args.digits_hidden, args.digits_lr,
                                 args.graph, args.mpi)
        took = time.perf_counter() - t
        tables = "\n\n".join(
            f"Time to a test accuracy of {target:g} (test error ≤ {1 - target:.2g}) on the digits "
            f"in virtual time and under `mpiexec -n {NODES}` (`--free-run` SCALE = {args.mpi:g} "
            f"wall s per virtual s): {NODES} nodes on a {args.graph}, node 0 five times slower, "
            f"an MLP of {args.digits_hidden} hidden units, SGD with step {args.digits_lr:g} for "
            f"every method, batch 32, {args.digits_epochs:g} epochs, median over seeds "
            f"{' '.join(map(str, seeds))}, {os.cpu_count()} CPU core(s) for the {NODES} ranks "
            f"({took:.0f} s)\n\n" + mpi_table(results, 1 - target, args.mpi, "test error")
            for target in args.digits_targets)
        print(("\n\n" if out else "") + tables)
        if args.write is not None:
            write_between_markers(args.write, tables, DIGITS_SECTION)
        out = f"{out}\n\n{tables}" if out else tables
    elif args.mpi is not None:
        t = time.perf_counter()
        seeds = args.mpi_seeds or args.seeds[:1]
        sweeps = args.mpi_sweeps or args.sweeps
        results = measure_mpi(seeds, sweeps, args.eta, args.graph, args.mpi)
        took = time.perf_counter() - t
        tables = "\n\n".join(
            f"Time to (1/n) Σ‖x_i − x*‖² / ‖x*‖² ≤ {target:g} in virtual time and under "
            f"`mpiexec -n {NODES}` (`--free-run` SCALE = {args.mpi:g} wall s per virtual s: "
            "the asynchronous methods free, D-PSGD in paced rounds): the setting of "
            f"the tables above, {sweeps} sweeps, median over seeds "
            f"{' '.join(map(str, seeds))}, {os.cpu_count()} CPU core(s) for the {NODES} ranks "
            f"({took:.0f} s)\n\n" + mpi_table(results, target, args.mpi)
            for target in args.targets)
        print(("\n\n" if out else "") + tables)
        if args.write is not None:
            write_between_markers(args.write, tables, MPI_SECTION)
        out = f"{out}\n\n{tables}" if out else tables
    print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
