"""GPU check (issue 11): CUDA == CPU bytes for every compressor, and block-engine round times.

One short script (< 5 min on one GPU; ``benchmarks/gpu.sh`` runs it):

1. **Bytes.** Every built-in compressor spec (every form :data:`gossip.catalog.COMPRESSOR_SPECS`
   lists, placeholders filled in) encodes the same CPU float32 and float64 tensors on the CPU
   and on ``--device`` with the same randomness: a single tensor (``encode``) and a block of
   ``--rows`` nodes (``encode_rows``). The table gives, per spec and dtype, whether the bytes
   are equal, ``decode max|diff|`` (CPU decode of the CPU bytes against device decode of the
   device bytes) and ``cross max|diff|`` (the *device's* bytes decoded on the CPU against the
   device: receivers may sit on other devices, so this must be 0 for every compressor whose
   decode has no reduction, i.e. all but low-rank).

2. **Timing.** In-process block-engine rounds on ``--device`` (CHOCO top-1% and plain gossip
   with ``none`` on a ring of ``--nodes`` nodes, d = ``--dim``, float32), ms per round with
   ``torch.cuda.synchronize()``, beside the same on the CPU for ``--cpu-nodes`` nodes, per node
   for comparison; a markdown table. Rounds are measured adaptively (``--budget`` seconds per
   row, at most ``--rounds``).

Which bytes must be equal (a difference exits 1), and which may differ (reported only):

* ``exact``: none, fp16, bf16, topk. Elementwise rounding and a selection whose ties go to the
  lowest index; no floating reduction reaches the wire, so the bytes cannot depend on the device.
* ``rng``: randk, lead, natural. Equal given the same random draws: rand-k's indices come from a
  seed drawn from the caller's generator, LEAD's scale is a max (order-free), natural has no
  reduction; ``gossip.rng.Stream`` (counter-based integer hashing) draws the same numbers on
  every device, so they must be equal.
* ``reduction``: sign, sign_l1, sign_l2, qsgd, lowrank, and any compressor registered by a user.
  The scale on the wire is a floating sum (‖x‖₁, ‖x‖₂) or a matrix product (low-rank); a GPU
  sums in another order than the CPU, so the scale may differ in its last bits (and QSGD codes
  whose draw falls on that boundary with it). This is our expectation, not a measurement: the
  check was written without a GPU, so the table is the first measurement. Decoding the same
  bytes (``cross``) must still agree exactly, except for low-rank (P·Qᵀ is a reduction).

With ``--device cpu`` everything runs on the CPU (``--quick`` makes it take seconds): the
"device" side then takes the torch code path that CUDA tensors take (``dispatch.NUMPY = False``)
and the reference the numpy fast path, so the check is meaningful without a GPU too.

Exit status: 0 when every required equality holds, 1 otherwise (or when a compressor raised).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.catalog import COMPRESSOR_SPECS  # noqa: E402
from gossip.compress import dispatch, make  # noqa: E402
from gossip.compress.base import row_stride  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.rng import Stream  # noqa: E402  (counter-based: the same draws on every device)

EXACT = {"none", "fp16", "bf16", "topk"}
RNG = {"randk", "lead", "natural"}
FILL = {"RATIO": "0.1", "K": "20", "BITS": "4", "LEVELS": "5", "RANK": "2"}
"""Values for the placeholders of the registry's spec forms (``topk:RATIO`` -> ``topk:0.1``)."""
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ------------------------------------------------------------------------------ randomness
def single_rng(seed: int, device: torch.device) -> Stream:
    """The randomness of one ``encode``: node 0's stream of run ``seed`` in round 1."""
    stream = Stream(seed, [0])
    stream.begin_round(1)
    return stream


def pitched(rows: list[torch.Tensor] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The messages ``rows`` as a [m, nbytes] block on ``device`` whose rows start 8-aligned
    (the layout ``encode_rows`` gives and ``decode_add_rows_`` reads)."""
    m, nbytes = len(rows), (rows[0].numel() if len(rows) else 0)
    block = torch.zeros((m, row_stride(nbytes)), dtype=torch.uint8, device=device)[:, :nbytes]
    for r in range(m):
        block[r].copy_(rows[r])
    return block


def encode_block(comp, spec: str, X: torch.Tensor, seed: int) -> torch.Tensor:
    """[m, nbytes] messages of the rows of ``X``, as the block engine would encode them."""
    m = X.shape[0]
    if comp.stateful:  # one instance per node (what Block does for stateful compressors)
        return pitched([make(spec).encode(X[r], single_rng(seed + r, X.device)).to_bytes()
                        for r in range(m)], X.device)
    if not comp.randomized:
        return comp.encode_rows(X)
    stream = Stream(seed, list(range(m)))
    stream.begin_round(1)
    return comp.encode_rows(X, stream)


def decode_block(comp, block: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    comp.decode_add_rows_(out, block, 1.0)
    return out


@contextlib.contextmanager
def code_path(torch_path: bool):
    """Run the compressors' torch code path on CPU tensors too (the path CUDA tensors take)."""
    saved = dispatch.NUMPY
    dispatch.NUMPY = saved and not torch_path
    try:
        yield
    finally:
        dispatch.NUMPY = saved


# ------------------------------------------------------------------------------ 1. bytes
def specs() -> list[str]:
    """Every built-in compressor's spec forms, placeholders filled in (plug-ins registered in
    this process are not the package's to check)."""
    out = []
    for form in (f for name, (forms, _) in COMPRESSOR_SPECS.items() for f in forms or (name,)):
        out.append(re.sub(r"\b[A-Z]+\b", lambda m: FILL.get(m[0], m[0]), form))
    return list(dict.fromkeys(out))


def expectation(spec: str) -> str:
    name = spec.split(":")[0]
    if name in EXACT:
        return "exact"
    if name in RNG:
        return "rng"
    return "reduction"


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.cpu().double(), b.cpu().double()
    if a.shape != b.shape:
        return math.inf
    return float((a - b).abs().max()) if a.numel() else 0.0


def check_spec(spec: str, dtype: torch.dtype, device: torch.device, rows: int, seed: int) -> list[dict]:
    """Rows of the bytes table for one spec and dtype (single tensor and block)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 50, generator=g, dtype=torch.float64).to(dtype)  # a matrix for low-rank
    X = torch.randn(rows, 2000, generator=g, dtype=torch.float64).to(dtype)
    on_dev = device.type != "cpu"
    kind = expectation(spec)
    results = []
    for what, data in (("encode", x), (f"encode_rows m={rows}", X)):
        # reference: the CPU as a CPU run does it (numpy fast path)
        ref_c = make(spec)
        dev_c = make(spec)
        if what == "encode":
            ref_bytes = ref_c.encode(data, single_rng(seed, torch.device("cpu"))).to_bytes().clone()
            ref_val = ref_c.decode(ref_c.from_bytes(ref_bytes, data))
        else:
            ref_bytes = encode_block(ref_c, spec, data, seed)
            ref_val = decode_block(make(spec), ref_bytes, data)
        with code_path(torch_path=not on_dev):
            dd = data.to(device)
            if what == "encode":
                dev_bytes = dev_c.encode(dd, single_rng(seed, device)).to_bytes().clone()
                dev_val = dev_c.decode(dev_c.from_bytes(dev_bytes, dd))
            else:
                dev_bytes = encode_block(dev_c, spec, dd, seed)
                dev_val = decode_block(make(spec), dev_bytes, dd)
        # the device's bytes decoded on the CPU (a receiver elsewhere)
        if what == "encode":
            host_bytes = dev_bytes.cpu()
            c = make(spec)
            cross_val = c.decode(c.from_bytes(host_bytes, data))
        else:
            host_bytes = pitched(dev_bytes, torch.device("cpu"))
            cross_val = decode_block(make(spec), host_bytes, data)
        same = ref_bytes.shape == host_bytes.shape and torch.equal(ref_bytes, host_bytes)
        comparable = True
        cross = max_diff(cross_val, dev_val)
        if same or not comparable:
            verdict = "ok"
        elif kind == "reduction":
            verdict = "differs (allowed)"
        else:
            verdict = "MISMATCH"
        if cross != 0.0 and not spec.startswith("lowrank"):
            verdict = "MISMATCH (cross)"
        results.append({
            "spec": spec, "dtype": str(dtype).removeprefix("torch."), "call": what, "expect": kind,
            "bytes": ("yes" if same else "no") if comparable else "n/a (rng)",
            "decode": max_diff(ref_val, dev_val) if comparable else math.nan,
            "cross": cross, "verdict": verdict,
        })
    return results


def bytes_table(device: torch.device, rows: int, seed: int) -> tuple[list[str], bool]:
    lines = ["| spec | dtype | call | expect | bytes equal | decode max abs diff | "
             "cross max abs diff | verdict |", "|---|---|---|---|---|---|---|---|"]
    ok = True
    for spec in specs():
        for dname, dtype in DTYPES.items():
            try:
                results = check_spec(spec, dtype, device, rows, seed)
            except Exception as exc:  # a compressor that fails on the device is a failure too
                ok = False
                lines.append(f"| {spec} | {dname} | - | {expectation(spec)} | - | - | - | "
                             f"ERROR: {type(exc).__name__}: {str(exc)[:80]} |")
                continue
            for r in results:
                ok &= not r["verdict"].startswith("MISMATCH")
                lines.append(f"| {r['spec']} | {r['dtype']} | {r['call']} | {r['expect']} | "
                             f"{r['bytes']} | {r['decode']:.3g} | {r['cross']:.3g} | {r['verdict']} |")
    return lines, ok


# ------------------------------------------------------------------------------ 2. timing
ENGINE_RUNS = (("choco", {"gamma": 0.05}, "topk:0.01"), ("gossip", {}, "none"))
STATE_COPIES = {"choco": 6, "gossip": 4}
"""Rough [n, d] tensors alive during a round (model, state, decode buffers, messages), to
refuse sizes that cannot fit before allocating them."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit_nodes(n: int, d: int, copies: int, device: torch.device) -> int:
    """``n``, halved until ``copies`` [n, d] float32 tensors fit in 80% of the free memory."""
    if device.type != "cuda":
        return n
    free, _ = torch.cuda.mem_get_info(device)
    while n > 2 and copies * n * d * 4 > 0.8 * free:
        n //= 2
    return n


def time_engine(alg: str, hp: dict, spec: str, n: int, d: int, device: torch.device,
                budget: float, max_rounds: int) -> dict:
    """ms per round of the in-process block engine (median over adaptively many rounds)."""
    n = fit_nodes(n, d, STATE_COPIES[alg], device)
    gen = torch.Generator(device).manual_seed(0)
    t0 = time.perf_counter()
    eng = Engine(make_algorithm(alg, **hp), topologies.build("ring", n),
                 lambda i: torch.randn(d, generator=gen, device=device), compressor=spec,
                 device=device, dtype=torch.float32)
    setup_s = time.perf_counter() - t0
    eng.step()  # warm-up: allocations, workspaces, plans
    sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < max_rounds and (not times or time.perf_counter() - start < budget):
        tic = time.perf_counter()
        eng.step()
        sync(device)
        times.append(time.perf_counter() - tic)
    sent = float(eng.bytes_sent().sum()) / n / eng.round if eng.round else 0.0
    times.sort()
    ms = 1e3 * times[len(times) // 2]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        peak = math.nan
    del eng
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return {"algorithm": alg, "compressor": spec, "device": str(device), "n": n, "d": d,
            "rounds": len(times), "ms": ms, "us_node": 1e3 * ms / n, "bytes_node": sent,
            "setup_s": setup_s, "peak_gib": peak}


def timing_table(args, device: torch.device) -> list[str]:
    lines = ["| algorithm | compressor | device | n | d | rounds | ms/round | µs/node-round | "
             "bytes sent/node-round | setup s | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    sizes = [(device, args.nodes)]
    if device.type != "cpu" or args.cpu_nodes != args.nodes:
        sizes.append((torch.device("cpu"), args.cpu_nodes))
    for alg, hp, spec in ENGINE_RUNS:
        for dev, n in sizes:
            r = time_engine(alg, hp, spec, n, args.dim, dev, args.budget, args.rounds)
            lines.append(f"| {r['algorithm']} | {r['compressor']} | {r['device']} | {r['n']} | "
                         f"{r['d']} | {r['rounds']} | {r['ms']:.2f} | {r['us_node']:.1f} | "
                         f"{r['bytes_node']:.0f} | {r['setup_s']:.1f} | "
                         + ("-" if math.isnan(r["peak_gib"]) else f"{r['peak_gib']:.2f}") + " |")
            print(lines[-1], file=sys.stderr, flush=True)  # progress
    return lines


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Check that every compressor gives the same bytes on --device as on the CPU "
                    "(exit 1 if a required equality fails) and time block-engine rounds.")
    p.add_argument("--device", default="cuda",
                   help="device to check against the CPU (default cuda; 'cpu' compares the "
                        "torch code path against the numpy fast path, for machines without GPU)")
    p.add_argument("--nodes", type=int, default=1024,
                   help="nodes of the timed ring on --device (default 1024; halved until it fits)")
    p.add_argument("--cpu-nodes", type=int, default=64,
                   help="nodes of the same timed ring on the CPU, for a per-node comparison "
                        "(default 64)")
    p.add_argument("--dim", type=int, default=100_000,
                   help="model dimension d of the timed runs (default 100000: 400 MB per "
                        "[1024, d] float32 tensor)")
    p.add_argument("--rounds", type=int, default=50,
                   help="at most this many timed rounds per table row (default 50)")
    p.add_argument("--budget", type=float, default=15.0,
                   help="seconds of timed rounds per table row; rounds stop once spent "
                        "(default 15; the whole script stays under 5 minutes)")
    p.add_argument("--rows", type=int, default=8,
                   help="nodes m of the block in the bytes check (encode_rows on [m, 2000]; "
                        "default 8)")
    p.add_argument("--seed", type=int, default=1234, help="seed of data and randomness (default 1234)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes (nodes 16, cpu-nodes 8, dim 2000, 3 rounds, 1 s budget): "
                        "seconds, e.g. --device cpu on a machine without GPU")
    p.add_argument("--skip-bytes", action="store_true", help="skip the bytes check")
    p.add_argument("--skip-timing", action="store_true", help="skip the timing")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.cpu_nodes, args.dim, args.rounds, args.budget = 16, 8, 2000, 3, 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch sees no CUDA device (use --device cpu)",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else "cpu (bytes: the torch code path against the numpy fast path)")
    print(f"# gpu_check: {name}, torch {torch.__version__}, randomness: "
          "gossip.rng.Stream\n")
    ok = True
    if not args.skip_bytes:
        lines, ok = bytes_table(device, args.rows, args.seed)
        print("## Bytes: CPU vs " + str(device) + "\n")
        print("\n".join(lines) + "\n", flush=True)
    if not args.skip_timing:
        print("## Block-engine rounds (ring, float32, in process)\n")
        lines = timing_table(args, device)
        print("\n" + "\n".join(lines) + "\n")
    print(f"total {time.perf_counter() - t0:.1f} s; "
          + ("all required equalities hold" if ok else "MISMATCH: see the table"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
