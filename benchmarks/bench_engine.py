"""Engine benchmark: ratios measured side by side in one run (not a test).

(a) An MPI gossip round over a bare mpi4py Isend/Irecv exchange of the same bytes on the same
    graph (target <= 1.2), for the whole round (compression and mixing included) and for its
    transport part alone. Started by this script under ``mpiexec -n RANKS``.
(b) In-process CHOCO top-1% on a ring of 25, d = 2000: ms per round (target <= 2 ms on the
    2-core machine) and its ratio over a vectorized numpy version of the same update.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.seeding import generator, init_seed  # noqa: E402


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# -- (a) MPI ----------------------------------------------------------------------------------
def mpi_part(dim: int, rounds: int, spec: str) -> None:
    from mpi4py import MPI

    from gossip.comm.world import World

    torch.set_num_threads(1)
    world = World.detect()
    comm = MPI.COMM_WORLD
    topo = topologies.build("ring", world.size)
    eng = Engine(make_algorithm("gossip"), topo, lambda i: torch.randn(dim), compressor=spec,
                 world=world, dtype=torch.float32)
    eng.step()  # warm up buffers
    comm.Barrier()
    comm0 = eng.comm_s
    t_engine = _median_time(eng.step, rounds)
    t_comm = (eng.comm_s - comm0) / rounds  # the transport's share of a round (mean)
    nbytes = eng.nodes[world.rank].compressor.encode(torch.randn(dim)).nbytes
    view = topo.view(world.rank)
    send = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    recv = {j: np.empty(nbytes, dtype=np.uint8) for j in view.in_neighbors}

    def bare() -> None:
        reqs = [comm.Irecv([recv[j], MPI.BYTE], source=j, tag=1) for j in view.in_neighbors]
        reqs += [comm.Isend([send, MPI.BYTE], dest=j, tag=1) for j in view.out_neighbors]
        MPI.Request.Waitall(reqs)

    bare()
    comm.Barrier()
    t_bare = _median_time(bare, rounds)
    t_engine = comm.allreduce(t_engine, op=MPI.MAX)
    t_comm = comm.allreduce(t_comm, op=MPI.MAX)
    t_bare = comm.allreduce(t_bare, op=MPI.MAX)
    if world.rank == 0:
        print(f"| gossip {spec}, d={dim}, {world.size} ranks | {nbytes} B "
              f"| {1e3 * t_engine:.3f} ms | {1e3 * t_comm:.3f} ms | {1e3 * t_bare:.3f} ms "
              f"| {t_engine / t_bare:.2f} | {t_comm / t_bare:.2f} |")


# -- (b) in process ---------------------------------------------------------------------------
def numpy_choco(X0: np.ndarray, W: np.ndarray, gamma: float, k: int, rounds: int) -> float:
    """The same CHOCO update, vectorized over nodes (top-k per row by argpartition)."""
    X, Xh, S = X0.copy(), np.zeros_like(X0), np.zeros_like(X0)
    rows = np.arange(X.shape[0])[:, None]

    def one() -> None:
        nonlocal X, Xh, S
        X += gamma * (S - Xh)
        D = X - Xh
        idx = np.argpartition(-np.abs(D), k - 1, axis=1)[:, :k]
        Q = np.zeros_like(D)
        Q[rows, idx] = D[rows, idx]
        Xh += Q
        S += W @ Q

    one()
    return _median_time(one, rounds)


def in_process_part(rounds: int) -> None:
    torch.set_num_threads(1)
    n, d = 25, 2000
    topo = topologies.build("ring", n)
    x0 = lambda i: torch.randn(d, generator=generator(init_seed(0, i)))  # noqa: E731
    eng = Engine(make_algorithm("choco", gamma=0.05), topo, x0, compressor="topk:0.01",
                 dtype=torch.float32)
    eng.step()
    t_engine = _median_time(eng.step, rounds)
    X0 = np.stack([x0(i).numpy() for i in range(n)])
    t_numpy = numpy_choco(X0, topo.dense().astype(np.float32), 0.05, 20, rounds)
    print(f"| CHOCO top-1%, ring 25, d=2000, in process | {1e3 * t_engine:.3f} ms/round "
          f"| numpy vectorized {1e3 * t_numpy:.3f} ms/round | ratio {t_engine / t_numpy:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2,
                   help="MPI ranks for part (a) (default 2: one per core here)")
    p.add_argument("--dims", type=int, nargs="+", default=[10_000, 1_000_000],
                   help="vector sizes for part (a)")
    p.add_argument("--compressors", nargs="+", default=["none", "topk:0.01", "sign"],
                   help="compressors for part (a)")
    p.add_argument("--rounds", type=int, default=200, help="timed rounds per measurement")
    p.add_argument("--mpi-part", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dim", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--spec", default="none", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mpi_part:
        mpi_part(args.dim, args.rounds, args.spec)
        return
    print("## (b) in-process round")
    in_process_part(args.rounds)
    print("\n## (a) MPI round vs bare mpi4py exchange of the same bytes (max over ranks, median)")
    print("| run | message | engine round | its transport part | bare exchange | round / bare "
          "| transport / bare |\n|---|---|---|---|---|---|---|")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for dim in args.dims:
        for spec in args.compressors:
            rounds = max(20, args.rounds // (10 if dim >= 1_000_000 else 1))
            subprocess.run([str(mpiexec), "-n", str(args.ranks), sys.executable, __file__,
                            "--mpi-part", "--dim", str(dim), "--spec", spec,
                            "--rounds", str(rounds)], env=env, check=True)


if __name__ == "__main__":
    main()
