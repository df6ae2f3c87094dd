"""gossip.wrap's D-PSGD step against a bare loop that does the same exchange and mix by hand.

The issue's comparison (not a test): n ranks under ``torchrun`` (gloo) or ``mpiexec`` (mpi4py),
one torch thread each, the digits MLP (64-64-10, 4810 parameters) or a synthetic model of
``--params`` parameters, plain SGD, batch 32. Each process times, alternately and on the same
batches, ``--steps`` steps of

- **bare**: the loop a user writes by hand: the model's parameters are views into one flat
  vector; after ``loss.backward()`` it posts a send of the vector to each out-neighbour and a
  receive from each in-neighbour (``torch.distributed.isend/irecv`` under torchrun,
  ``Isend/Irecv`` of numpy views under mpiexec), waits, mixes ``x <- w_ii x + sum_j w_ij x_j``
  and steps the optimizer: D-PSGD, ``x <- W x - lr * grad f(x)``;
- **wrap**: the same model through ``gossip.wrap(model, SGD, algorithm="dpsgd")``;
- **wrap overlap**: the same with ``overlap=True`` (the model's send is posted when it is final,
  at the end of ``opt.step()``, and travels during the next forward and backward);
- **compute**: forward, backward and the optimizer step without any exchange;

and checks that the three runs end at the same model (to rounding). The median ms per step over
``--repeats`` alternations goes to stdout as one JSON line from rank 0 (``--json``), and the
driver (run without a launcher) launches every configuration and prints the table:

    python benchmarks/bench_wrap_loop.py                         # the whole table
    python benchmarks/bench_wrap_loop.py --write docs/performance.md
    torchrun --nproc-per-node 4 benchmarks/bench_wrap_loop.py --worker --graph ring
    mpiexec -n 4 python benchmarks/bench_wrap_loop.py --worker --graph ring
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

BATCH, LR = 32, 0.05
GRAPHS = ("complete", "ring", "one-peer-exponential")


# ---------------------------------------------------------------------------------------------
# the worker: one process of the launched run
# ---------------------------------------------------------------------------------------------
def build_model(params: int):
    """The digits MLP (``params`` 0) or an MLP of about ``params`` parameters on 64 inputs."""
    import torch
    from torch import nn

    from gossip.training import MLP

    torch.manual_seed(0)
    if not params:
        return MLP(64, 10, (64,))
    width = max(16, int((params / 2) ** 0.5))  # two width x width layers carry the parameters
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def batches(rank: int, count: int, params: int):
    """``count`` mini-batches of this rank's data: the digits (a rank's own shuffle), or
    synthetic inputs for the large model."""
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    if params:
        return [(torch.randn(BATCH, 64, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen))
                for _ in range(count)]
    from gossip.training import digits

    train, _ = digits()
    xs, ys = train.tensors
    order = torch.randperm(len(ys), generator=gen)
    return [(xs[order[k * BATCH:(k + 1) * BATCH]], ys[order[k * BATCH:(k + 1) * BATCH]])
            for k in range(count)]


def graph_at(topology, t: int):
    """The round-t graph of a topology (a time-varying one changes per round; rounds count
    from 1, as the engine's)."""
    return topology.at_round(t)


def neighbours(topology, rank: int, t: int):
    """(w_ii, [(j, w_ij) received], [k sent to]) of ``rank`` in round ``t``."""
    topo = graph_at(topology, t)
    w = topo.W
    ins = [(int(j), float(w[rank, j])) for j in range(topo.n) if j != rank and w[rank, j] != 0]
    outs = [int(k) for k in range(topo.n) if k != rank and w[k, rank] != 0]
    return float(w[rank, rank]), ins, outs


class Bare:
    """The hand-written D-PSGD loop (module of views into one flat vector)."""

    def __init__(self, model, topology, rank: int, backend: str):
        import torch

        self.model, self.topology, self.rank, self.backend = model, topology, rank, backend
        params = list(model.parameters())
        self.flat = torch.cat([p.detach().reshape(-1) for p in params])
        offset = 0
        for p in params:
            p.data = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.opt = torch.optim.SGD(params, lr=LR)
        self.t = 0
        self.plans = {}
        self.bufs = {}
        if backend == "mpi":
            from mpi4py import MPI

            self.MPI = MPI
            self.comm = MPI.COMM_WORLD
            self.flat_np = self.flat.numpy()

    def plan(self):
        period = getattr(self.topology, "period", None) or 1
        key = self.t % period
        if key not in self.plans:
            self.plans[key] = neighbours(self.topology, self.rank, self.t)
        return self.plans[key]

    def buffer(self, j):
        import torch

        if j not in self.bufs:
            self.bufs[j] = torch.empty_like(self.flat)
        return self.bufs[j]

    def step(self, x, y, exchange: bool = True):
        from torch import nn

        self.opt.zero_grad()
        nn.functional.cross_entropy(self.model(x), y).backward()
        self.t += 1
        if exchange:
            self.mix()
        self.opt.step()

    def mix(self):
        w_ii, ins, outs = self.plan()
        if self.backend == "mpi":
            MPI = self.MPI
            reqs = [self.comm.Irecv([self.buffer(j).numpy(), MPI.FLOAT], source=j, tag=7) for j, _ in ins]
            reqs += [self.comm.Isend([self.flat_np, MPI.FLOAT], dest=k, tag=7) for k in outs]
            MPI.Request.Waitall(reqs)
        else:
            import torch.distributed as dist

            reqs = [dist.irecv(self.buffer(j), src=j) for j, _ in ins]
            reqs += [dist.isend(self.flat, dst=k) for k in outs]
            for req in reqs:
                req.wait()
        self.flat.mul_(w_ii)
        for j, w in ins:
            self.flat.add_(self.bufs[j], alpha=w)


def run_worker(args) -> None:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    import topologies
    from gossip.comm.world import World
    from gossip.wrap import wrap

    world = World.detect()
    rank, n = world.rank, world.size
    backend = "mpi" if world.kind == "MPI world" else "torch"
    topology = topologies.build(args.graph, n)
    data = batches(rank, args.steps, args.params)

    def loop(step_fn, steps):
        tic = time.perf_counter()
        for k in range(steps):
            step_fn(*data[k % len(data)])
        return (time.perf_counter() - tic) / steps

    runs = {}
    bare = Bare(build_model(args.params), topology, rank, backend)
    runs["bare"] = bare.step
    compute = Bare(build_model(args.params), topology, rank, backend)
    runs["compute"] = lambda x, y: compute.step(x, y, exchange=False)
    for name, overlap in (("wrap", False), ("wrap overlap", True)):
        net = build_model(args.params)
        net, opt = wrap(net, torch.optim.SGD(net.parameters(), lr=LR), algorithm="dpsgd",
                        topology=topology, world=world, overlap=overlap)

        def wrapped(x, y, net=net, opt=opt):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

        runs[name] = wrapped
        runs[name].opt = opt  # type: ignore[attr-defined]
        runs[name].net = net  # type: ignore[attr-defined]

    # the same steps from the same start: the models must agree before anything is timed
    for fn in runs.values():
        loop(fn, args.check)
    for name in runs:
        if name.startswith("wrap"):
            runs[name].opt.synchronize()
    ref = bare.flat
    for name in ("wrap", "wrap overlap"):
        if name in runs:
            got = torch.cat([p.detach().reshape(-1) for p in runs[name].net.parameters()])
            gap = float((got - ref).abs().max())
            if gap > 1e-5 * float(ref.abs().max()):
                raise SystemExit(f"rank {rank}: {name} left a model {gap:.3g} away from the bare loop's")

    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            world.barrier()
            times[name].append(loop(fn, args.steps))
    for name in runs:
        if name.startswith("wrap"):
            runs[name].opt.synchronize()
    med = {name: statistics.median(ts) for name, ts in times.items()}
    d = sum(p.numel() for p in bare.model.parameters())
    line = json.dumps({"graph": args.graph, "ranks": n, "rank": rank, "backend": backend, "params": d,
                       **{f"{k} ms": 1e3 * v for k, v in med.items()}})
    if args.out is not None:  # one file per rank: lines of several ranks on one stdout interleave
        (args.out / f"rank{rank}.json").write_text(line)
    else:
        print(line, flush=True)


# ---------------------------------------------------------------------------------------------
# the driver: launches the configurations and prints the table
# ---------------------------------------------------------------------------------------------
def launch(launcher: str, ranks: int, graph: str, extra: list[str], load: int) -> dict:
    """One launched run's row: the slowest rank's median of each loop."""
    import tempfile

    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as out:
        me = [str(Path(__file__).resolve()), "--worker", "--graph", graph, "--out", out, *extra]
        if launcher == "torchrun":
            cmd = [str(bin_dir / "torchrun"), "--nproc-per-node", str(ranks), "--master-port",
                   str(29500 + os.getpid() % 1000), *me]
        else:
            cmd = [str(bin_dir / "mpiexec"), "-n", str(ranks), sys.executable, *me]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        finally:
            for b in burners:
                b.kill()
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        rows = [json.loads(path.read_text()) for path in sorted(Path(out).glob("rank*.json"))]
    if len(rows) != ranks:
        raise SystemExit(f"{' '.join(cmd)}: {len(rows)} of {ranks} ranks reported")
    worst = dict(rows[0])
    for key in worst:
        if key.endswith(" ms"):
            worst[key] = max(row[key] for row in rows)
    return worst


CONFIGS = [  # (launcher, ranks, graph, burners, model parameters)
    *[(launcher, 4, graph, 0, 0) for launcher in ("torchrun", "mpiexec") for graph in GRAPHS],
    *[(launcher, 4, graph, 2, 0) for launcher in ("torchrun", "mpiexec") for graph in GRAPHS],
    *[(launcher, 8, "ring", 0, 0) for launcher in ("torchrun", "mpiexec")],
    *[(launcher, 2, "ring", 0, 10**7) for launcher in ("torchrun", "mpiexec")],  # a core per rank
]


def table(rows: list[dict]) -> str:
    head = ("| launcher | graph | ranks | other jobs | parameters | compute | bare loop | wrap | "
            "**wrap / bare** | wrap overlap | **overlap / bare** | overlap / max(compute, exchange) |\n"
            + "|---" * 12 + "|\n")
    lines = []
    for r in rows:
        exchange = max(r["bare ms"] - r["compute ms"], 0.0)
        lines.append(
            f"| {r['launcher']} | {r['graph']} | {r['ranks']} | {r['burners']} CPU-bound | {r['params']:,} "
            f"| {r['compute ms']:.2f} ms | {r['bare ms']:.2f} ms | {r['wrap ms']:.2f} ms "
            f"| **{r['wrap ms'] / r['bare ms']:.2f}** | {r['wrap overlap ms']:.2f} ms "
            f"| **{r['wrap overlap ms'] / r['bare ms']:.2f}** "
            f"| {r['wrap overlap ms'] / max(r['compute ms'], exchange):.2f} |")
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true",
                        help="be one process of a launched run (torchrun or mpiexec starts it)")
    parser.add_argument("--graph", default="ring", help="topology spec of the worker's run (default ring)")
    parser.add_argument("--params", type=int, default=0,
                        help="0: the digits MLP (4810 parameters); N: a synthetic MLP of about N")
    parser.add_argument("--steps", type=int, default=200,
                        help="steps per timed run (default 200; the driver runs 10 for 10^7 parameters)")
    parser.add_argument("--repeats", type=int, default=5, help="alternations, median taken (default 5)")
    parser.add_argument("--check", type=int, default=10,
                        help="steps run first by every loop, whose models must agree (default 10)")
    parser.add_argument("--out", type=Path, help="worker: write this rank's result to OUT/rankR.json")
    parser.add_argument("--only", nargs="+", choices=["torchrun", "mpiexec"],
                        help="driver: only these launchers (default both)")
    parser.add_argument("--quick", action="store_true",
                        help="driver: the quiet 4-rank rows only")
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS),
                        help=f"driver: the graphs of the rows (default {' '.join(GRAPHS)})")
    parser.add_argument("--write", type=Path, help="driver: also write the table into this docs page")
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return
    import torch

    rows = []
    load_start = os.getloadavg()[0]  # other work on the machine (the burners come on top)
    configs = [c for c in CONFIGS if (not args.only or c[0] in args.only) and c[2] in args.graphs
               and (not args.quick or (c[1] == 4 and c[3] == 0 and c[4] == 0))]
    for launcher, ranks, graph, burners, params in configs:
        extra = ["--params", str(params), "--repeats", str(args.repeats), "--check", str(args.check),
                 "--steps", str(10 if params else args.steps)]
        row = launch(launcher, ranks, graph, extra, burners)
        row.update(launcher=launcher, burners=burners)
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    text = (f"torch {torch.__version__}, {os.cpu_count()} cores, one torch thread per rank; D-PSGD, "
            f"plain SGD, batch {BATCH}; median ms per step of the slowest rank over "
            f"{args.repeats} alternations; load average {load_start:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end (`benchmarks/bench_wrap_loop.py`)\n\n" + table(rows))
    print("\n" + text)
    if args.write:
        from docpage import write_between_markers  # benchmarks/docpage.py

        write_between_markers(args.write, text, "bench_wrap_loop")


if __name__ == "__main__":
    main()
