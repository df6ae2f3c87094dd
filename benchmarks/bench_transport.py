"""Transport benchmark: an engine gossip round under each launcher over a bare exchange of the
same bytes with the same library, measured side by side in one run (not a test).

For each of mpiexec (mpi4py ``Isend``/``Irecv``) and torchrun (gloo ``batch_isend_irecv``) on a
ring of RANKS ranks, one node per rank: the engine's round (exact gossip or a compressor), the
bare exchange of the round's message bytes with the library alone, and their ratio, timed
alternately (median, max over ranks). Started by this script under each launcher.
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
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402


def bare_exchange(world: World, view, nbytes: int):
    """The round's messages moved by the library alone, into buffers allocated once."""
    send = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    recv = {j: torch.empty(nbytes, dtype=torch.uint8) for j in view.in_neighbors}
    if world.kind == "MPI world":
        from mpi4py import MPI

        comm, sn, rn = MPI.COMM_WORLD, send.numpy(), {j: b.numpy() for j, b in recv.items()}

        def mpi() -> None:
            reqs = [comm.Irecv([rn[j], MPI.BYTE], source=j, tag=1) for j in view.in_neighbors]
            reqs += [comm.Isend([sn, MPI.BYTE], dest=j, tag=1) for j in view.out_neighbors]
            MPI.Request.Waitall(reqs)
        return mpi
    import torch.distributed as dist

    def gloo() -> None:
        ops = [dist.P2POp(dist.irecv, recv[j], j, tag=1) for j in view.in_neighbors]
        ops += [dist.P2POp(dist.isend, send, j, tag=1) for j in view.out_neighbors]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return gloo


def part(dim: int, rounds: int, spec: str) -> None:
    torch.set_num_threads(1)
    world = World.detect()
    topo = topologies.build("ring", world.size)
    eng = Engine(make_algorithm("gossip"), topo, lambda i: torch.randn(dim), compressor=spec,
                 world=world, dtype=torch.float32)
    nbytes = eng.block.compressor.nbytes_rows(eng.block.x[0])
    bare = bare_exchange(world, topo.view(world.rank), nbytes)
    eng.step()
    bare()
    world.barrier()
    times: dict[str, list[float]] = {"engine": [], "bare": []}
    for _ in range(rounds):  # alternately, same machine state
        for name, fn in (("engine", eng.step), ("bare", bare)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    worst = world.node_values(world.size, {world.rank: med["engine"]}).max()
    worst_bare = world.node_values(world.size, {world.rank: med["bare"]}).max()
    if world.is_root:
        print(f"| {world.kind.split()[0]} | gossip {spec}, d={dim}, {world.size} ranks | {nbytes} B "
              f"| {1e3 * worst:.3f} ms | {1e3 * worst_bare:.3f} ms | **{worst / worst_bare:.2f}** |",
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="ranks of the ring (default 2)")
    p.add_argument("--dims", type=int, nargs="+", default=[10_000, 1_000_000],
                   help="vector sizes (default 10000 1000000)")
    p.add_argument("--compressors", nargs="+", default=["none", "sign"],
                   help="compressors (default none sign)")
    p.add_argument("--rounds", type=int, default=100, help="timed rounds per measurement")
    p.add_argument("--part", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dim", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--spec", default="none", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part:
        part(args.dim, args.rounds, args.spec)
        return
    bin_dir = Path(sys.executable).parent
    launchers = {"mpiexec": [str(bin_dir / "mpiexec"), "-n", str(args.ranks), sys.executable],
                 "torchrun": [str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node",
                              str(args.ranks)]}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    print("## engine round over a bare exchange of the same bytes (median, max over ranks)")
    print("| launcher | run | message | engine round | bare exchange | round / bare |\n"
          "|---|---|---|---|---|---|", flush=True)
    for dim in args.dims:
        for spec in args.compressors:
            rounds = max(20, args.rounds // (5 if dim >= 1_000_000 else 1))
            for launch in launchers.values():
                subprocess.run([*launch, __file__, "--part", "--dim", str(dim), "--spec", spec,
                                "--rounds", str(rounds)], env=env, check=True,
                               stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
