"""Compressor throughput next to the kernels that bound it (run by ``make bench``; not a test).

For each size d (float32, one torch thread) and compressor: median encode / decode time over
``--repeat`` runs, as GB/s of input (4d bytes / time), and ratios to

* ``copy``: ``dst.copy_(src)`` of the same tensor (memory bandwidth; sign and rand-k target
  ≥ 0.25 of it),
* ``rand``: ``torch.rand(d, out=…)``, what a stochastic quantizer's dither used to cost (qsgd,
  lead, natural target ≥ 2 of it: their counter-based 16-bit dithers, ``gossip.rng``, hash one
  64-bit word per four entries),
* ``torch.topk`` of |x| alone (top-k targets ≥ 1).

Encode writes into a preallocated ``out=`` buffer and decode into a preallocated tensor, as
the engine does (fresh model-sized memory costs page faults: docs/performance.md). Low-rank
runs on the tensor viewed as a near-square matrix. Prints a markdown table.

Section "blocks" (``--blocks``): a block of m nodes × d entries (default 1000 × 10⁴,
float32), ``encode_rows`` + ``decode_add_rows_`` (per-row weights) of top-k 1%, none and sign
next to a hand-written vectorized torch reference of the same math (no header, no checks) and
to the per-row loop (the base class's default), timed interleaved in one run.

    python benchmarks/bench_compress.py --sizes 1e5 1e6 1e7 --repeat 7
    python benchmarks/bench_compress.py --blocks --repeat 5
    python benchmarks/bench_compress.py --kernels --repeat 41   # long-row kernels vs floors
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gossip.compress import make  # noqa: E402
from gossip.compress.base import Compressor  # noqa: E402
from gossip.rng import Stream  # noqa: E402

#: the randomized compressors whose encode is compared with ``torch.rand(d)`` (issue 11)
RNG_SPECS = ["qsgd:4", "lead:2", "natural", "randk:0.01"]
RNG_SIZES = [1e6, 4e6]

SPECS = [
    "none",
    "fp16",
    "bf16",
    "topk:0.01",
    "randk:0.01",
    "sign",
    "qsgd:4",
    "qsgd:2:biased",
    "lead:2",
    "natural",
    "lowrank:1",
    "lowrank:4",
]
TARGETS = {  # spec prefix -> (baseline, minimal encode ratio)
    "sign": ("copy", 0.25),
    "randk": ("copy", 0.25),
    "qsgd": ("rand", 2.0),
    "lead": ("rand", 2.0),
    "natural": ("rand", 2.0),
    "topk": ("topk", 1.0),
}


def timeit(fns: dict[str, Callable[[], object]], repeat: int, device: torch.device) -> dict:
    """Median seconds of each function over ``repeat`` rounds after one warm-up.

    The functions run interleaved (one of each per round), so a ratio of two medians compares
    runs made under the same background load (this machine is shared).
    """
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rnd in range(repeat + 1):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if rnd:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def near_square(d: int) -> tuple[int, int]:
    m = int(math.isqrt(d))
    while d % m:
        m -= 1
    return m, d // m


def bench_size(d: int, specs: list[str], repeat: int, device: torch.device) -> list[dict]:
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    x = torch.randn(d, generator=gen, device=device)
    dst = torch.empty_like(x)
    gb = 4 * d / 1e9
    a = x.abs()
    k = max(1, int(0.01 * d))
    floors = {
        "copy": lambda: dst.copy_(x),
        "rand": lambda: torch.rand(d, out=dst, generator=gen),
        "topk": lambda: torch.topk(a, k),
    }
    base = timeit(floors, repeat, device)
    rows = [
        {"spec": f"copy (baseline) {base['copy'] * 1e3:.2f} ms", "enc": gb / base["copy"]},
        {"spec": f"torch.rand (floor) {base['rand'] * 1e3:.2f} ms", "enc": gb / base["rand"]},
        {"spec": f"torch.topk 1% (floor) {base['topk'] * 1e3:.2f} ms", "enc": gb / base["topk"]},
    ]
    for spec in specs:
        c = make(spec)
        xin = x.view(*near_square(d)) if spec.startswith("lowrank") else x
        buf = torch.empty(c.max_nbytes(xin), dtype=torch.uint8, device=device)
        out = torch.empty_like(xin)
        rng = Stream(0, [0])  # the node's counter-based stream (what the engine passes)
        payload = c.encode(xin, rng, out=buf)
        floor = next((f for p, (f, _) in TARGETS.items() if spec.startswith(p)), "copy")
        fns = {
            "copy": floors["copy"],
            "enc": lambda c=c, xin=xin, buf=buf, rng=rng: c.encode(xin, rng, out=buf),
            "dec": lambda c=c, p=payload, out=out: c.decode(p, out=out),
        }
        if floor != "copy":
            fns[floor] = floors[floor]
        t = timeit(fns, repeat, device)
        row = {
            "spec": spec,
            "enc": gb / t["enc"],
            "dec": gb / t["dec"],
            "enc/copy": t["copy"] / t["enc"],
            "dec/copy": t["copy"] / t["dec"],
            "bytes": payload.nbytes / (4 * d),
        }
        for prefix, (fl, need) in TARGETS.items():
            if spec.startswith(prefix):
                ratio = t[fl] / t["enc"]
                row["floor"] = f"{ratio:.2f} × {fl}"
                row["target"] = f"{'met' if ratio >= need else 'MISSED'} (≥ {need} × {fl})"
        rows.append(row)
    return rows


BLOCK_SPECS = ["topk:0.01", "none", "sign"]


def _reference(spec: str, X: torch.Tensor, w: torch.Tensor):
    """Hand-written vectorized torch of the same math: (encode, decode-add) closures."""
    m, d = X.shape
    out = torch.zeros_like(X)
    if spec.startswith("topk"):
        k = max(1, int(float(spec.split(":")[1]) * d))
        state = {}

        def enc():
            i = torch.topk(X.abs(), k, dim=1).indices
            state["i"], state["v"] = i, X.gather(1, i)

        enc()
        return enc, lambda: out.scatter_add_(1, state["i"], state["v"] * w)
    if spec == "none":
        buf = torch.empty_like(X)
        return (lambda: buf.copy_(X)), (lambda: out.addcmul_(buf, w))
    shifts = torch.arange(8, device=X.device, dtype=torch.uint8)
    state = {}

    def enc():  # ‖x‖₁/d and x < 0 packed 8 per byte (d a multiple of 8 here)
        state["s"] = X.abs().sum(1, keepdim=True) / d
        state["b"] = ((X < 0).view(m, -1, 8).to(torch.uint8) << shifts).sum(2, dtype=torch.uint8)

    def dec():
        neg = ((state["b"].unsqueeze(2) >> shifts) & 1).view(m, d).to(X.dtype)
        out.addcmul_((1 - 2 * neg) * state["s"], w)

    enc()
    return enc, dec


def bench_blocks(m: int, d: int, repeat: int, device: torch.device) -> None:
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    X = torch.randn(m, d, generator=gen, device=device)
    w = torch.rand(m, 1, generator=gen, device=device)
    print(f"\n### blocks: m = {m} nodes × d = {d:.0e}, float32 (ms, median of {repeat})\n")
    print("| compressor | encode_rows | reference | per-row loop | ref / ours | loop / ours "
          "| decode_add_rows_ | reference | per-row loop | ref / ours | loop / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in BLOCK_SPECS:
        c = make(spec)
        n = c.nbytes_rows(X[0])
        blk = torch.empty(m, n + (-n) % 8, dtype=torch.uint8, device=device)
        block = c.encode_rows(X, out=blk)
        out = torch.zeros_like(X)
        ref_enc, ref_dec = _reference(spec, X, w)
        t = timeit({
            "enc": lambda c=c, blk=blk: c.encode_rows(X, out=blk),
            "enc_ref": ref_enc,
            "enc_loop": lambda c=c, blk=blk: Compressor.encode_rows(c, X, out=blk),
            "dec": lambda c=c, b=block, out=out: c.decode_add_rows_(out, b, w.view(m)),
            "dec_ref": ref_dec,
            "dec_loop": lambda c=c, b=block, out=out: Compressor.decode_add_rows_(c, out, b,
                                                                                w.view(m)),
        }, repeat, device)
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"| {spec} | {ms['enc']:.2f} | {ms['enc_ref']:.2f} | {ms['enc_loop']:.2f} "
              f"| {t['enc_ref'] / t['enc']:.2f} | {t['enc_loop'] / t['enc']:.2f} "
              f"| {ms['dec']:.2f} | {ms['dec_ref']:.2f} | {ms['dec_loop']:.2f} "
              f"| {t['dec_ref'] / t['dec']:.2f} | {t['dec_loop'] / t['dec']:.2f} |")
def rng_ratios(d: int, specs: list[str], repeat: int, device: torch.device) -> dict[str, float]:
    """Speedup ``t(torch.rand(d)) / t(encode)`` of each randomized compressor, all measured
    interleaved in one run (float32, the node's :class:`gossip.rng.Stream`)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    x = torch.randn(d, generator=gen, device=device)
    dst = torch.empty_like(x)
    fns: dict[str, Callable[[], object]] = {"rand": lambda: torch.rand(d, out=dst)}
    for spec in specs:
        c = make(spec)
        buf = torch.empty(c.max_nbytes(x), dtype=torch.uint8, device=device)
        rng = Stream(0, [0])
        fns[spec] = lambda c=c, buf=buf, rng=rng: c.encode(x, rng, out=buf)
    t = timeit(fns, repeat, device)
    return {"rand_ms": t["rand"] * 1e3, **{spec: t["rand"] / t[spec] for spec in specs}}


def bench_kernels(d: int, repeat: int) -> None:
    """Section ``--kernels``: the CPU kernels of one long row (the one-node-per-rank MPI case)
    next to their floors, all timed interleaved in one run (medians): ``encode_rows`` and
    ``decode_add_rows_`` (weight 1/3) of top-k 1 %, sign and qsgd:4 on a [1, d] float32 row,
    each also without numba (:mod:`gossip.compress.jit` off: the numpy twins); low-rank:1
    ``encode`` / ``decode_add_`` of a 1000 × 1000 matrix. Floors: one read pass over x
    (``x.sum()``), a copy, the selection alone (``np.argpartition``, ``torch.topk`` of |x|),
    the two matrix-vector products and the rank-1 update of low-rank."""
    import numpy as np

    from gossip.compress import dispatch

    gen = torch.Generator()
    gen.manual_seed(0)
    X = torch.randn(1, d, generator=gen)
    xn, dst = X.numpy()[0], torch.empty(d)
    a = X[0].abs()
    k = d // 100
    M = torch.randn(1000, 1000, generator=gen)
    q, p, outm = torch.randn(1000, generator=gen), torch.empty(1000), torch.zeros(1000, 1000)
    fns: dict[str, Callable[[], object]] = {
        "read pass (x.sum)": lambda: X.sum(),
        "copy": lambda: dst.copy_(X[0]),
        "np.argpartition 1%": lambda: np.argpartition(xn, d - k),
        "torch.topk 1% of abs(x)": lambda: torch.topk(a, k, sorted=False),
        "lowrank floor: M q, Mᵀ p": lambda: (torch.mv(M, q, out=p), torch.mv(M.t(), p, out=q)),
        "lowrank floor: rank-1 add": lambda: outm.addr_(p, q),
    }

    def with_jit(fn: Callable[[], object], on: bool) -> Callable[[], object]:
        def run() -> object:
            dispatch.JIT = on
            try:
                return fn()
            finally:
                dispatch.JIT = True
        return run

    floors: dict[str, list[str]] = {}
    for spec in ["topk:0.01", "sign", "qsgd:4"]:
        c, rng, out = make(spec), Stream(0, [0]), torch.zeros(1, d)
        msg = c.encode_rows(X, rng)
        enc = f"{spec} encode"
        fns[enc] = lambda c=c, msg=msg, rng=rng: c.encode_rows(X, rng, out=msg)
        dec = f"{spec} decode-add"
        fns[dec] = lambda c=c, msg=msg, out=out: c.decode_add_rows_(out, msg, 1 / 3)
        for name in (enc, dec):  # the numpy/torch twins, for comparison
            fns[f"{name}, no numba"] = with_jit(fns[name], False)
        enc_floors = ["read pass (x.sum)", "copy"]
        if spec.startswith("topk"):
            enc_floors += ["np.argpartition 1%", "torch.topk 1% of abs(x)"]
        floors.update({enc: enc_floors, f"{enc}, no numba": enc_floors[:1],
                       dec: ["copy"], f"{dec}, no numba": ["copy"]})
    c, rng = make("lowrank:1"), Stream(0, [0])
    buf = torch.empty(c.max_nbytes(M), dtype=torch.uint8)
    pay = c.encode(M, rng, out=buf)
    fns["lowrank:1 encode"] = lambda: c.encode(M, rng, out=buf)
    fns["lowrank:1 decode-add"] = lambda: c.decode_add_(outm, pay, 1 / 3)
    floors["lowrank:1 encode"] = ["lowrank floor: M q, Mᵀ p"]
    floors["lowrank:1 decode-add"] = ["lowrank floor: rank-1 add"]
    t = timeit(fns, repeat, torch.device("cpu"))
    print(f"\n### kernels: one row of d = {d:.0e} float32, 1000 × 1000 for low-rank "
          f"(ms, median of {repeat}, interleaved)\n")
    print("| kernel | ms | floor | floor ms | kernel / floor |")
    print("|---|---|---|---|---|")
    for name, fl in floors.items():
        for f in fl:
            print(f"| {name} | {t[name] * 1e3:.3f} | {f} | {t[f] * 1e3:.3f} "
                  f"| {t[name] / t[f]:.2f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6, 1e7],
                    help="tensor sizes d of the throughput table (default 1e5 1e6 1e7)")
    ap.add_argument("--repeat", type=int, default=7, help="timed repetitions; medians (default 7)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--specs", nargs="+", default=SPECS,
                    help="compressors of the throughput table (default: the built-in set)")
    ap.add_argument("--blocks", action="store_true", help="only the blocks section")
    ap.add_argument("--block-shape", nargs=2, type=float, default=[1000, 1e4], metavar=("M", "D"),
                    help="block of M nodes of D entries for the blocks section (default 1000 1e4)")
    ap.add_argument("--kernels", action="store_true",
                    help="only the long-row kernels next to their floors (d = 1e6, one row)")
    ap.add_argument("--rng-only", action="store_true",
                    help="only the randomized encoders against torch.rand (d = 1e6, 4e6)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {args.threads} thread(s), device {device}, float32, "
          f"median of {args.repeat}\n")
    if args.kernels:
        bench_kernels(10**6, max(args.repeat, 21))
        return
    if not (args.blocks or args.rng_only):
        print_table(args, device)
    if not args.blocks:
        print("\nencode speedup over torch.rand(d) (t_rand / t_encode, target ≥ 2), interleaved:\n")
        print("| d | torch.rand ms | " + " | ".join(RNG_SPECS) + " |")
        print("|---|---|" + "---|" * len(RNG_SPECS))
        for size in RNG_SIZES:
            r = rng_ratios(int(size), RNG_SPECS, max(args.repeat, 9), device)
            print(f"| {size:.0e} | {r['rand_ms']:.2f} | "
                  + " | ".join(f"{r[s]:.2f}" for s in RNG_SPECS) + " |")
    if not args.rng_only:
        print()
        bench_blocks(int(args.block_shape[0]), int(args.block_shape[1]), args.repeat, device)


def print_table(args, device: torch.device) -> None:
    print(
        "| d | compressor | encode GB/s | decode GB/s | enc / copy | dec / copy "
        "| enc / floor | bytes / 4d | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        d = int(size)
        for r in bench_size(d, args.specs, args.repeat, device):

            def f(key: str, fmt: str = "{:.2f}", r=r) -> str:
                v = r.get(key)
                return "" if v is None else fmt.format(v) if not isinstance(v, str) else v

            print(
                f"| {d:.0e} | {r['spec']} | {f('enc')} | {f('dec')} | {f('enc/copy')} "
                f"| {f('dec/copy')} | {f('floor')} | {f('bytes', '{:.4f}')} | {f('target')} |"
            )


if __name__ == "__main__":
    main()
