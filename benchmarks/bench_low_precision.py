"""Low-precision decentralized training on digits: float32 against autocast bf16/fp16 with the
matching 16-bit message, and bfloat16/float16 models with float32 master weights (issue 25's
check; the table of docs/low-precision.md).

Every run is ``experiments/train.py`` in this process: scikit-learn's digits, an MLP 64-128-10,
8 nodes on a ring, iid split (``--partition``), batch 32 per node, SGD with momentum 0.9 at
lr 0.1, evaluated once at the end. Per algorithm six settings: float32 with ``none`` (the
reference), float32 with the ``bf16`` message (the message's effect alone), ``--autocast bf16``
with ``bf16``, ``--autocast fp16`` with ``fp16``, and ``--dtype bfloat16`` / ``--dtype float16``
with ``none`` (the models stored, sent and mixed in 16 bits, the optimizer stepping float32
master weights). Each over ``--seeds``: the table gives the mean final test
accuracy of the averaged model (min–max over seeds), its difference to the reference in
points, the mean test loss, bits sent per node, their ratio to the reference, and the median
time per epoch (wall time of the whole run over its epochs; the settings run interleaved, seed
by seed, so a busy machine slows them alike).

A second table times the parts a round is made of, in this process, best of ``--repeat``:
one node's gradient (``ModelOracle.grad``: a batch of 32 through forward and backward, float32
or under autocast) and one message of the model (``encode_rows`` then ``decode_add_rows_`` of the
whole per-tensor message, ``none`` / ``bf16`` / ``fp16``), in µs per call.

    python benchmarks/bench_low_precision.py                      # ~3 min on one CPU core
    python benchmarks/bench_low_precision.py --epochs 5 --seeds 0 # a quick look
    python benchmarks/bench_low_precision.py --parts-only --device cuda

``--int8`` prints instead the table of 8-bit compute (``--quantize int8`` / ``int8-sr``,
Aketi, Kodge & Roy 2022) with 8-bit messages (``lead:7``: 2⁷ + 1 levels of ‖x‖_∞ and the sign
in 8 bits per entry) for CHOCO-SGD and DeepSqueeze (γ = ``--gamma``), against float32 with
exact messages, and the two apart (8-bit messages alone, 8-bit compute alone):

    python benchmarks/bench_low_precision.py --int8                        # ~5 min
    python benchmarks/bench_low_precision.py --int8 --partition dirichlet:0.5 --epochs 40
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = (("float32", "none", "none"), ("float32", "none", "bf16"), ("float32", "bf16", "bf16"),
            ("float32", "fp16", "fp16"), ("bfloat16", "none", "none"), ("float16", "none", "none"))
"""(model dtype, autocast, compressor) per row; the first is the reference."""

INT8_SETTINGS = (("none", "none"), ("none", "lead:7"), ("int8", "none"), ("int8", "lead:7"),
                 ("int8-sr", "lead:7"))
"""(quantize, compressor) per row of the ``--int8`` table; the first is the reference."""


def train_script() -> Any:
    """experiments/train.py as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location("_bench_train", ROOT / "experiments" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(train: Any, args: argparse.Namespace, algorithm: str, dtype: str, autocast: str,
        compressor: str, seed: int, quantize: str = "none") -> dict[str, Any]:
    """One training run's table row (its own printout silenced)."""
    argv = ["--data", "digits", "--model", "mlp", "--hidden", "128", "--nodes", str(args.nodes),
            "--topology", "ring", "--partition", args.partition, "--algorithm", algorithm,
            "--compressor", compressor, "--autocast", autocast, "--epochs", str(args.epochs),
            "--eval-every", str(args.epochs), "--lr", "0.1", "--optimizer", "momentum",
            "--seed", str(seed), "--device", args.device, "--dtype", dtype, "--quantize", quantize]
    if algorithm in ("choco", "deepsqueeze"):
        argv += ["--gamma", str(args.gamma)]
    with contextlib.redirect_stdout(io.StringIO()):
        row = train.main(argv)
    if row["status"] != "ok":
        raise SystemExit(f"{algorithm} {dtype} autocast={autocast} quantize={quantize} {compressor} "
                         f"seed {seed}: "
                         f"{row['status']}")
    return row


def table(results: dict[tuple[str, str, str, str], list[dict[str, Any]]]) -> str:
    """The markdown table of docs/low-precision.md."""
    lines = ["| algorithm | model | autocast | message | test accuracy (min–max) | Δ vs fp32 (points) "
             "| test loss | bits/node | bits vs fp32 | s/epoch |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (alg, dtype, autocast, comp), rows in results.items():
        ref = results[(alg, *SETTINGS[0])]
        acc = [r["test_accuracy"] for r in rows]
        mean = statistics.fmean(acc)
        delta = 100 * (mean - statistics.fmean(r["test_accuracy"] for r in ref))
        bits = statistics.fmean(r["bits_per_node"] for r in rows)
        ratio = bits / statistics.fmean(r["bits_per_node"] for r in ref)
        sec = statistics.median(r["seconds_per_epoch"] for r in rows)
        loss = statistics.fmean(r["test_loss"] for r in rows)
        lines.append(f"| {alg} | {dtype} | {autocast} | {comp} | {mean:.2%} ({min(acc):.2%}–{max(acc):.2%}) "
                     f"| {delta:+.2f} | {loss:.4f} | {bits:.4g} | {ratio:.3f} | {sec:.3f} |")
    return "\n".join(lines)


def int8_table(results: dict[tuple[str, str, str], list[dict[str, Any]]]) -> str:
    """The markdown table of 8-bit compute and messages (docs/low-precision.md)."""
    lines = ["| algorithm | compute | message | test accuracy (min–max) | Δ vs fp32 (points) "
             "| test loss | bits/node | bits vs fp32 | s/epoch |", "|---|---|---|---|---|---|---|---|---|"]
    for (alg, quantize, comp), rows in results.items():
        ref = results[(alg, *INT8_SETTINGS[0])]
        acc = [r["test_accuracy"] for r in rows]
        mean = statistics.fmean(acc)
        delta = 100 * (mean - statistics.fmean(r["test_accuracy"] for r in ref))
        bits = statistics.fmean(r["bits_per_node"] for r in rows)
        ratio = bits / statistics.fmean(r["bits_per_node"] for r in ref)
        sec = statistics.median(r["seconds_per_epoch"] for r in rows)
        loss = statistics.fmean(r["test_loss"] for r in rows)
        compute = "float32" if quantize == "none" else quantize
        lines.append(f"| {alg} | {compute} | {comp} | {mean:.2%} ({min(acc):.2%}–{max(acc):.2%}) "
                     f"| {delta:+.2f} | {loss:.4f} | {bits:.4g} | {ratio:.3f} | {sec:.3f} |")
    return "\n".join(lines)


def saved_bytes(quantize: str, batch: int = 32) -> tuple[int, int]:
    """(bytes autograd keeps for the backward, bytes of extra tensors made) of one forward of
    the digits MLP on ``batch`` samples: the memory of a node's step besides its model,
    optimizer state and flat gradient (float32 or ``quantize``)."""
    import torch

    from gossip.training import MLP
    from gossip.training.precision import QuantizedCompute

    torch.manual_seed(0)
    model = MLP(64, 10, (128,))
    if quantize != "none":
        QuantizedCompute(quantize, 0).install(model)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    inputs = {x.untyped_storage().data_ptr()} | params  # the batch and the model itself
    return sum(v for k, v in saved.items() if k not in inputs), len(saved)


def int8_main(args: argparse.Namespace) -> str:
    """The ``--int8`` runs and their table (CHOCO-SGD and DeepSqueeze unless --algorithms)."""
    train = train_script()
    algorithms = args.algorithms or ["choco", "deepsqueeze"]
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {
        (alg, *setting): [] for alg in algorithms for setting in INT8_SETTINGS}
    for seed in args.seeds:  # settings interleaved: a busy machine slows them all alike
        for alg, quantize, comp in results:
            results[(alg, quantize, comp)].append(
                run(train, args, alg, "float32", "none", comp, seed, quantize))
        print(f"done: seed {seed}", file=sys.stderr, flush=True)
    out = int8_table(results)
    print(f"digits, MLP 64-128-10, {args.nodes} nodes on a ring, {args.partition} split, "
          f"{args.epochs} epochs, γ = {args.gamma}, seeds {' '.join(map(str, args.seeds))}\n")
    print(out)
    mem = ["", "| saved for the backward (batch 32) | " + " | ".join(
        f"{saved_bytes(q)[0]} B" for q in ("none", "int8", "int8-sr")) + " |"]
    mem.insert(0, "| memory of a node's step | float32 | int8 | int8-sr |\n|---|---|---|---|")
    mem_table = mem[0] + "\n" + mem[2]
    print()
    print(mem_table)
    return out + "\n\n" + mem_table


def best_us(fn: Any, calls: int, repeat: int, sync: Any) -> float:
    """Best over ``repeat`` of the mean time of ``calls`` calls of ``fn``, in µs."""
    fn()  # warm-up: allocations, autocast caches, kernels
    best = float("inf")
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def parts(device: str, calls: int, repeat: int) -> str:
    """The markdown table of one node's gradient and one message's encode + decode."""
    import numpy as np
    import torch

    from gossip.compress import make
    from gossip.rng import generator
    from gossip.training import MLP, BatchStream, ModelOracle, digits, flat, node_loader

    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    train, _ = digits()
    torch.manual_seed(0)
    model = MLP(64, 10, (128,)).to(dev)
    x = flat.flatten(model).clone()
    g = torch.empty_like(x)
    layout = flat.layout_of(model)
    lines = [f"| part ({device}) | float32 / none | bf16 | fp16 |", "|---|---|---|---|"]
    grad = []
    for autocast in (None, "bf16", "fp16"):
        stream = BatchStream(node_loader(train, np.arange(len(train)), 32, generator(1)))
        oracle = ModelOracle(model, stream, autocast=autocast)
        # the batch moves to the device inside grad(), as in training
        grad.append(best_us(lambda o=oracle: o.grad(x, g), calls, repeat, sync))
    lines.append("| gradient of one node (batch 32) | " + " | ".join(f"{t:.0f} µs" for t in grad) + " |")
    msg = []
    for spec in ("none", "bf16", "fp16"):
        c = make(spec, layout)
        X, out = x[None].clone(), torch.zeros(1, x.numel(), device=dev)

        def roundtrip(c=c, X=X, out=out) -> None:  # the engine's block calls, one node
            c.decode_add_rows_(out, c.encode_rows(X), 0.5)

        msg.append(best_us(roundtrip, calls, repeat, sync))
    lines.append("| encode + decode-add of one message | " + " | ".join(f"{t:.0f} µs" for t in msg) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", nargs="+", default=None,
                   help="train.py algorithms (default dpsgd choco; with --int8 choco deepsqueeze)")
    p.add_argument("--epochs", type=int, default=20, help="epochs per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds")
    p.add_argument("--nodes", type=int, default=8, help="nodes on the ring")
    p.add_argument("--gamma", type=float, default=0.5,
                   help="the consensus step of CHOCO-SGD and DeepSqueeze")
    p.add_argument("--partition", default="iid", help="train.py's split: iid, sorted, dirichlet:ALPHA")
    p.add_argument("--device", default="cpu", help="torch device of the runs and the part timings")
    p.add_argument("--parts-only", action="store_true", help="only the table of part timings")
    p.add_argument("--calls", type=int, default=200, help="calls per timing of a part")
    p.add_argument("--repeat", type=int, default=5, help="timings per part (the best is shown)")
    p.add_argument("--int8", action="store_true",
                   help="the table of 8-bit compute and 8-bit messages instead (CHOCO-SGD, DeepSqueeze)")
    args = p.parse_args(argv)
    if args.int8:
        return int8_main(args)
    args.algorithms = args.algorithms or ["dpsgd", "choco"]
    part_table = parts(args.device, args.calls, args.repeat)
    if args.parts_only:
        print(part_table)
        return part_table
    train = train_script()
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {
        (alg, *setting): [] for alg in args.algorithms for setting in SETTINGS}
    for seed in args.seeds:  # settings interleaved: a busy machine slows them all alike
        for key in results:
            results[key].append(run(train, args, *key, seed))
        print(f"done: seed {seed}", file=sys.stderr, flush=True)
    out = table(results)
    print(f"digits, MLP 64-128-10, {args.nodes} nodes on a ring, {args.partition} split, "
          f"{args.epochs} epochs, seeds {' '.join(map(str, args.seeds))}\n")
    print(out)
    print()
    print(part_table)
    return out + "\n\n" + part_table


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
