"""Engine benchmark: ratios measured side by side in one run (not a test; ``make bench``).

(a) An MPI gossip round (one node per rank on a ring, ``--ranks`` 2 and 4: one core per rank
    here, then two ranks per core) over its floor, the same work done by its parts standalone.
    For exact gossip (``none``) the floor is a bare mpi4py exchange of the vectors and a plain
    numpy mix ``(x + Σ_j x_j) / (1 + degree)`` into a preallocated buffer (issue 22's target:
    <= 1.2 at d = 10^6); for a
    compressor it is the bare exchange of the round's real messages, one standalone encode and
    the standalone decode-add of every message the round decodes, its own included (target
    <= 1.3). Also the round over the bare exchange of the same bytes alone and, for exact
    gossip, over a hand-fused numpy round of the same update (the same checks and roundings
    streamed through the cache in one Python loop, checked equal to the engine's result).
    A D-PSGD row (``--dpsgd``: the consensus problem, exact messages) times a round that also
    takes a gradient and a step, over that floor with ``g = x − c`` and ``x −= η·g`` in numpy.
    Started by this script under ``mpiexec -n RANKS``.
(b) In-process CHOCO top-1% on a ring, the block engine over a hand-vectorized torch round of
    the same update (targets <= 1.5 at n = 25, d = 2000 and <= 1.0 at n = 1000, d = 10^4),
    timed alternately; n = 10^4 nodes, d = 10^3 reports s/round and memory.
(c) A user's compressor in the batch form (docs/extending.md) over the built-in of the same
    kind, per in-process CHOCO round on a ring (n = 25, d = 2000), timed alternately: a
    ``(‖x‖₁/d)·sign(x)`` written as a user would (the built-in ``sign``'s math; target <= 1.2),
    and the guide's ``BlockSign`` (one scale per 256 entries: more work than ``sign``), executed
    from the guide's own code block.

    python benchmarks/bench_engine.py                                # prints the tables
    python benchmarks/bench_engine.py --write docs/performance.md   # and puts them in the page
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from docpage import write_between_markers  # noqa: E402

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.compress import Codec, pack_bits, register_compressor, unpack_bits  # noqa: E402
from gossip.compress.wire import Sections, numel_of  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.layout import Layout  # noqa: E402
from gossip.problems.consensus import Consensus  # noqa: E402
from gossip.rng import generator, init_seed  # noqa: E402

SPECS = ("none", "topk:0.01", "sign", "qsgd:4", "lowrank:1")
"""The compressors of the MPI table (``--specs``' default)."""

ETA = 0.01
"""D-PSGD's step in part (a)'s D-PSGD row (the consensus problem)."""

HEADERS = {
    "mpi": "| run | message | engine round | its transport part | bare exchange | floor "
           "| round / floor | round / bare | hand-fused numpy round | round / fused |\n"
           "|---|---|---|---|---|---|---|---|---|---|",
    "in_process": "| run | engine | torch reference | engine / reference | notes |\n"
                  "|---|---|---|---|---|",
    "user": "| run | built-in sign | user's sign | user / built-in | guide's BlockSign "
            "| BlockSign / built-in |\n|---|---|---|---|---|---|",
}
"""The header of each table (a docs test finds them in docs/performance.md)."""


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
    layout = None
    if spec.startswith("lowrank"):  # a near-square matrix (1000 x 1000 at d = 10^6)
        rows = max(r for r in range(1, int(dim ** 0.5) + 1) if dim % r == 0)
        layout = Layout([(rows, dim // rows)])
    dpsgd = spec == "dpsgd"  # D-PSGD on the consensus problem, exact messages
    problem = Consensus(torch.randn(world.size, dim, generator=generator(init_seed(1, 0))),
                        dtype=torch.float32) if dpsgd else None
    eng = Engine(make_algorithm("dpsgd", eta=ETA) if dpsgd else make_algorithm("gossip"), topo,
                 lambda i: torch.randn(dim), compressor="none" if dpsgd else spec, world=world,
                 dtype=torch.float32, layout=layout,
                 oracles=(lambda i, gen: problem.oracle(i, gen)) if dpsgd else None)
    nbytes = eng.block.compressor.nbytes_rows(eng.block.x[0])
    view = topo.view(world.rank)
    send = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    recv = {j: np.empty(nbytes, dtype=np.uint8) for j in view.in_neighbors}

    def bare() -> None:
        reqs = [comm.Irecv([recv[j], MPI.BYTE], source=j, tag=1) for j in view.in_neighbors]
        reqs += [comm.Isend([send, MPI.BYTE], dest=j, tag=1) for j in view.out_neighbors]
        MPI.Request.Waitall(reqs)

    fns = [eng.step, bare, floor_of(eng, view, comm, problem)]
    if spec == "none":  # the same update, hand-fused: checked equal to the engine's, then timed
        fused = FusedGossip(eng.block.x[0].clone(), view, comm)
        for _ in range(3):
            eng.step()
            fused.step()
        same = comm.allreduce(int(torch.equal(fused.x, eng.block.x[0])), op=MPI.MIN)
        if not same:
            raise SystemExit("bench_engine: the hand-fused gossip round differs from the engine's")
        fns.append(fused.step)
    eng.step()  # warm up buffers
    bare()
    comm.Barrier()
    comm0 = eng.comm_s
    times = _interleaved(fns, rounds, sync=comm.Barrier)  # alternately, same machine state
    t_comm = (eng.comm_s - comm0) / rounds  # the transport's share of a round (mean)
    t_engine, t_bare, t_floor, *t_fused = (comm.allreduce(t, op=MPI.MAX) for t in times)
    t_comm = comm.allreduce(t_comm, op=MPI.MAX)
    if world.rank == 0:
        fused_cols = (f"{1e3 * t_fused[0]:.3f} ms | {t_engine / t_fused[0]:.2f}"
                      if t_fused else "— | —")
        run = "D-PSGD none (consensus)" if dpsgd else f"gossip {spec}"
        print(f"| {run}, d={dim}, {world.size} ranks | {nbytes} B "
              f"| {1e3 * t_engine:.3f} ms | {1e3 * t_comm:.3f} ms | {1e3 * t_bare:.3f} ms "
              f"| {1e3 * t_floor:.3f} ms | **{t_engine / t_floor:.2f}** | {t_engine / t_bare:.2f} "
              f"| {fused_cols} |")


def floor_of(eng: Engine, view, comm, problem: Consensus | None = None):
    """The work a round must do, from its parts used standalone: for exact gossip the bare
    exchange of the float32 vectors and a plain numpy mix ``(x + Σ_j x_j) / (1 + degree)``
    (its sum in a preallocated buffer); for D-PSGD on the consensus ``problem`` the same, then
    the gradient ``g = x − c`` and the step ``x −= η·g`` in numpy (preallocated ``g``);
    for a compressor the bare exchange of this round's real messages, one standalone encode of
    the node's message and the standalone decode-add of every message the round decodes: its
    own (gossip adds ``(w_ii − 1)·C(x_i)``) and each received one."""
    from mpi4py import MPI

    comp, x = eng.block.compressor, eng.block.x[:1].clone()
    nbrs, outs = list(view.in_neighbors), list(view.out_neighbors)
    if comp.is_identity:
        xn = x[0].numpy()
        recv = [np.empty_like(xn) for _ in nbrs]
        total = np.empty_like(xn)  # preallocated, as the engine's buffers are
        scale = np.float32(1.0 / (1 + len(nbrs)))
        if problem is not None:
            target, g, eta = problem.targets[view.node].numpy(), np.empty_like(xn), np.float32(ETA)

            def step() -> None:
                mix()
                np.subtract(xn, target, out=g)
                np.multiply(g, eta, out=g)
                np.subtract(xn, g, out=xn)

        def mix() -> None:
            reqs = [comm.Irecv([r, MPI.FLOAT], source=j, tag=3) for j, r in zip(nbrs, recv)]
            reqs += [comm.Isend([xn, MPI.FLOAT], dest=j, tag=3) for j in outs]
            MPI.Request.Waitall(reqs)
            np.add(xn, recv[0], out=total) if recv else np.copyto(total, xn)
            for r in recv[1:]:
                np.add(total, r, out=total)
            np.multiply(total, scale, out=xn)
        return mix if problem is None else step

    rng = eng.block.rng
    if comp.stateful:  # low-rank keeps its warm start per node: a fresh one of its own
        comp = eng._new_compressor()
        msg = comp.encode(x[0], rng).to_bytes().view(1, -1).clone()

        def encode() -> None:
            msg[0].copy_(comp.encode(x[0], rng).to_bytes())
    else:
        msg = comp.encode_rows(x, rng)

        def encode() -> None:
            comp.encode_rows(x, rng, out=msg)
    inbox = [torch.empty_like(msg) for _ in nbrs]
    out = torch.zeros_like(x)
    w_own = float(view.self_weight) - 1.0

    def kernels() -> None:
        encode()
        reqs = [comm.Irecv([b.numpy(), MPI.BYTE], source=j, tag=3) for j, b in zip(nbrs, inbox)]
        reqs += [comm.Isend([msg.numpy(), MPI.BYTE], dest=j, tag=3) for j in outs]
        MPI.Request.Waitall(reqs)
        comp.decode_add_rows_(out, msg, w_own)
        for b, w in zip(inbox, view.in_weights):
            comp.decode_add_rows_(out, b, float(w))
    return kernels


class FusedGossip:
    """Exact gossip ``x ← x + (w_ii − 1)·x + Σ_j w_ij·x_j`` for one node per rank, written by
    hand in numpy as tight as Python allows: the engine's checks (‖x‖ finite before sending, each
    received vector finite) and its roundings (each ``w·v`` rounded, then added in sorted
    neighbor order), with the arithmetic streamed through the cache in one loop of six numpy
    calls per chunk. Messages are the raw float32 vectors."""

    CHUNK = 1 << 15

    def __init__(self, x: torch.Tensor, view, comm) -> None:
        self.x, self.comm = x, comm
        self.xn = x.numpy()
        self.nbrs = list(view.in_neighbors)
        self.out = list(view.out_neighbors)
        self.w_own = np.float32(view.self_weight - 1.0)
        self.w = [np.float32(w) for w in view.in_weights]
        self.recv = [np.empty_like(self.xn) for _ in self.nbrs]
        self.m = np.empty(self.CHUNK, dtype=np.float32)
        self.t = np.empty(self.CHUNK, dtype=np.float32)

    def step(self) -> None:
        from mpi4py import MPI

        x, comm = self.xn, self.comm
        if not np.isfinite(self.x.sum().item()):
            raise FloatingPointError("NaN/Inf in x")
        reqs = [comm.Irecv([r, MPI.FLOAT], source=j, tag=2) for j, r in zip(self.nbrs, self.recv)]
        reqs += [comm.Isend([x, MPI.FLOAT], dest=j, tag=2) for j in self.out]
        MPI.Request.Waitall(reqs)
        for r in self.recv:
            if not np.isfinite(torch.from_numpy(r).sum().item()):
                raise FloatingPointError("NaN/Inf received")
        for a in range(0, x.size, self.CHUNK):
            b = min(a + self.CHUNK, x.size)
            m, t = self.m[: b - a], self.t[: b - a]
            np.multiply(x[a:b], self.w_own, out=m)
            for r, w in zip(self.recv, self.w):
                np.multiply(r[a:b], w, out=t)
                m += t
            x[a:b] += m


# -- (b) in process ---------------------------------------------------------------------------
def _interleaved(fns, rounds: int, sync=None) -> list[float]:
    """Median seconds of each function of ``fns``, timed one after the other in every round
    (the same machine state for all). ``sync`` (untimed) runs before each: under MPI a
    barrier, so no function's time includes a peer still finishing the one before."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, ts in zip(fns, times):
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [float(np.median(ts)) for ts in times]


class TorchChoco:
    """The same CHOCO top-k round, hand-vectorized over nodes in torch: top-k per row, the
    public copies updated by scatter, and each node's k-th neighbor's sparse message added
    per degree slot (the reference the engine's block round is measured against)."""

    def __init__(self, X0: torch.Tensor, topo, gamma: float, k: int):
        n = X0.shape[0]
        self.X, self.gamma, self.k = X0.clone(), gamma, k
        self.Xh, self.S = torch.zeros_like(X0), torch.zeros_like(X0)
        views = [topo.view(i) for i in range(n)]
        self.w_self = torch.tensor([v.self_weight for v in views], dtype=X0.dtype)[:, None]
        deg = max(len(v.in_neighbors) for v in views)
        self.slots = []
        for j in range(deg):  # every node of the benchmark graphs has the same degree
            src = torch.tensor([v.in_neighbors[j] for v in views])
            w = torch.tensor([v.in_weights[j] for v in views], dtype=X0.dtype)[:, None]
            self.slots.append((src, w))

    def step(self) -> None:
        X, Xh, S = self.X, self.Xh, self.S
        X.add_(S - Xh, alpha=self.gamma)
        D = X - Xh
        idx = D.abs().topk(self.k, dim=1, sorted=False).indices
        vals = D.gather(1, idx)
        Xh.scatter_add_(1, idx, vals)
        S.scatter_add_(1, idx, vals * self.w_self)
        for src, w in self.slots:
            S.scatter_add_(1, idx[src], vals[src] * w)


def in_process_part(n: int, d: int, rounds: int) -> str:
    torch.set_num_threads(1)
    topo = topologies.build("ring", n)
    x0 = lambda i: torch.randn(d, generator=generator(init_seed(0, i)))  # noqa: E731
    t0 = time.perf_counter()
    eng = Engine(make_algorithm("choco", gamma=0.05), topo, x0, compressor="topk:0.01",
                 dtype=torch.float32)
    t_setup = time.perf_counter() - t0
    eng.step()
    block = eng.block
    tensors = [block.x, *block.state.values()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    state_gib = sum(storages.values()) / 2**30  # each storage once (stacked state shares one)
    k = max(1, int(0.01 * d))
    ref = TorchChoco(block.x.clone(), topo, 0.05, k)
    ref.step()
    t_engine, t_ref = _interleaved([eng.step, ref.step], rounds)
    return (f"| CHOCO top-1%, ring {n}, d={d} | {1e3 * t_engine:.3f} ms/round "
            f"| {1e3 * t_ref:.3f} ms/round | **{t_engine / t_ref:.2f}** | setup {t_setup:.1f} s, "
            f"block state {state_gib:.2f} GiB |")


# -- (c) a user's compressor --------------------------------------------------------------------
class UserSign(Codec):
    """``(‖x‖₁/d)·sign(x)`` in the batch form, as a user writes it from docs/extending.md."""

    kind = 120

    def _sections(self, shape, dtype) -> Sections:
        return Sections.build(("scale", dtype, 1), ("bits", torch.uint8, -(-numel_of(shape) // 8)))

    def _encode_batch(self, X, rng, v) -> None:
        torch.div(X.abs().sum(1, keepdim=True), X.shape[1], out=v["scale"])
        pack_bits(X < 0, v["bits"])

    def _decode_batch(self, v, out) -> None:
        signs = unpack_bits(v["bits"], out.shape[1]).to(out.dtype).mul_(-2.0).add_(1.0)
        torch.mul(signs, v["scale"], out=out)


def guide_compressor() -> None:
    """Run the guide's compressor example (it registers ``blocksign``)."""
    text = (ROOT / "docs" / "extending.md").read_text()
    block = next(b.split("\n", 1)[1] for b in text.split("```python")[1:] if "class BlockSign" in b)
    exec(compile(block.split("```")[0], "<docs/extending.md: BlockSign>", "exec"), {"__name__": "guide"})


def user_compressor_part(n: int, d: int, rounds: int) -> str:
    torch.set_num_threads(1)
    register_compressor("usersign", UserSign)
    guide_compressor()
    topo = topologies.build("ring", n)
    x0 = lambda i: torch.randn(d, generator=generator(init_seed(0, i)))  # noqa: E731
    engines = [Engine(make_algorithm("choco", gamma=0.3), topo, x0, compressor=spec,
                      dtype=torch.float32) for spec in ("sign", "usersign", "blocksign")]
    for e in engines:
        e.step()
    t_sign, t_user, t_block = _interleaved([e.step for e in engines], rounds)
    return (f"| CHOCO, ring {n}, d={d} | {1e3 * t_sign:.3f} ms | {1e3 * t_user:.3f} ms "
            f"| {t_user / t_sign:.2f} | {1e3 * t_block:.3f} ms | {t_block / t_sign:.2f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4],
                   help="MPI ranks of the ring in part (a), one run each (default 2 4: one core "
                        "per rank here, then two ranks per core)")
    p.add_argument("--dims", type=int, nargs="+", default=[10_000, 1_000_000],
                   help="vector sizes for part (a)")
    p.add_argument("--compressors", nargs="+",
                   default=list(SPECS),
                   help="compressors for part (a) (low-rank on the vector as a near-square matrix)")
    p.add_argument("--dpsgd", action=argparse.BooleanOptionalAction, default=True,
                   help="also time a D-PSGD round (consensus problem, exact messages) in part "
                        "(a), over the floor with its gradient and step in numpy")
    p.add_argument("--rounds", type=int, default=200, help="timed rounds per measurement")
    p.add_argument("--large", action=argparse.BooleanOptionalAction, default=True,
                   help="also time n = 10^4 nodes, d = 10^3 (s/round, memory)")
    p.add_argument("--write", type=Path, metavar="PAGE",
                   help="also write the tables into PAGE between its bench_engine markers "
                        "(make bench: docs/performance.md)")
    p.add_argument("--mpi-part", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dim", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--specs", nargs="+", default=["none"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mpi_part:
        for spec in args.specs:  # one launch for every compressor
            mpi_part(args.dim, args.rounds, spec)
        return
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    emit(f"torch {torch.__version__}, {os.cpu_count()} cores, one torch thread per process; "
         f"load average {os.getloadavg()[0]:.2f} at the start")
    emit("\n**(a) An MPI gossip round over its floor** (one node per rank on a ring; max over "
         "ranks of the median round, the parts timed alternately; targets: round / floor <= 1.2 "
         "for `none`, <= 1.3 for the compressors)\n")
    emit(HEADERS["mpi"])
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for ranks in args.ranks:
        for dim in args.dims:
            rounds = max(20, args.rounds // (10 if dim >= 1_000_000 else 1))
            res = subprocess.run([str(mpiexec), "-n", str(ranks), sys.executable, __file__,
                                  "--mpi-part", "--dim", str(dim), "--specs", *args.compressors,
                                  *(["dpsgd"] if args.dpsgd else []),
                                  "--rounds", str(rounds)],
                                 env=env, check=True, capture_output=True, text=True)
            emit(res.stdout.strip())
    emit("\n**(b) In-process CHOCO top-1 % over a hand-vectorized torch round** (median, "
         "interleaved; targets: <= 1.5 at n = 25, <= 1.0 at n = 1000)\n")
    emit(HEADERS["in_process"])
    emit(in_process_part(25, 2000, args.rounds))
    emit(in_process_part(1000, 10_000, max(10, args.rounds // 20)))
    if args.large:
        emit(in_process_part(10_000, 1000, 10))
    emit("\n**(c) A user's batch-form compressor over the built-in sign** (median, interleaved)\n")
    emit(HEADERS["user"])
    emit(user_compressor_part(25, 2000, args.rounds))
    emit(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    if args.write is not None:
        write_between_markers(args.write, "\n".join(lines), "bench_engine")


if __name__ == "__main__":
    main()
