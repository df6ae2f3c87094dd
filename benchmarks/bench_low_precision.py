"""Low-precision decentralized training on digits: float32 against autocast bf16/fp16 with the
matching 16-bit message (issue 25's check; the table of docs/low-precision.md).

Every run is ``experiments/train.py`` in this process: scikit-learn's digits, an MLP 64-128-10,
8 nodes on a ring, iid split, batch 32 per node, SGD with momentum 0.9 at lr 0.1, evaluated
once at the end. Per algorithm four settings: float32 with ``none`` (the reference), float32
with the ``bf16`` message (the message's effect alone), ``--autocast bf16`` with ``bf16``, and
``--autocast fp16`` with ``fp16``. Each over ``--seeds``: the table gives the mean final test
accuracy of the averaged model (min–max over seeds), its difference to the reference in
points, the mean test loss, bits sent per node, their ratio to the reference, and the median
time per epoch (wall time of the whole run over its epochs; the settings run interleaved, seed
by seed, so a busy machine slows them alike).

    python benchmarks/bench_low_precision.py                      # ~2 min on one CPU core
    python benchmarks/bench_low_precision.py --epochs 5 --seeds 0 # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = (("none", "none"), ("none", "bf16"), ("bf16", "bf16"), ("fp16", "fp16"))
"""(autocast, compressor) per row; the first is the reference."""


def train_script() -> Any:
    """experiments/train.py as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location("_bench_train", ROOT / "experiments" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(train: Any, args: argparse.Namespace, algorithm: str, autocast: str, compressor: str,
        seed: int) -> dict[str, Any]:
    """One training run's table row (its own printout silenced)."""
    argv = ["--data", "digits", "--model", "mlp", "--hidden", "128", "--nodes", str(args.nodes),
            "--topology", "ring", "--algorithm", algorithm, "--compressor", compressor,
            "--autocast", autocast, "--epochs", str(args.epochs), "--eval-every", str(args.epochs),
            "--lr", "0.1", "--optimizer", "momentum", "--seed", str(seed)]
    if algorithm == "choco":
        argv += ["--gamma", str(args.gamma)]
    with contextlib.redirect_stdout(io.StringIO()):
        row = train.main(argv)
    if row["status"] != "ok":
        raise SystemExit(f"{algorithm} autocast={autocast} {compressor} seed {seed}: {row['status']}")
    return row


def table(results: dict[tuple[str, str, str], list[dict[str, Any]]]) -> str:
    """The markdown table of docs/low-precision.md."""
    lines = ["| algorithm | autocast | message | test accuracy (min–max) | Δ vs fp32 (points) "
             "| test loss | bits/node | bits vs fp32 | s/epoch |", "|---|---|---|---|---|---|---|---|---|"]
    for (alg, autocast, comp), rows in results.items():
        ref = results[(alg, *SETTINGS[0])]
        acc = [r["test_accuracy"] for r in rows]
        mean = statistics.fmean(acc)
        delta = 100 * (mean - statistics.fmean(r["test_accuracy"] for r in ref))
        bits = statistics.fmean(r["bits_per_node"] for r in rows)
        ratio = bits / statistics.fmean(r["bits_per_node"] for r in ref)
        sec = statistics.median(r["seconds_per_epoch"] for r in rows)
        loss = statistics.fmean(r["test_loss"] for r in rows)
        lines.append(f"| {alg} | {autocast} | {comp} | {mean:.2%} ({min(acc):.2%}–{max(acc):.2%}) "
                     f"| {delta:+.2f} | {loss:.4f} | {bits:.4g} | {ratio:.3f} | {sec:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", nargs="+", default=["dpsgd", "choco"], help="train.py algorithms")
    p.add_argument("--epochs", type=int, default=20, help="epochs per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds")
    p.add_argument("--nodes", type=int, default=8, help="nodes on the ring")
    p.add_argument("--gamma", type=float, default=0.5, help="CHOCO-SGD's consensus step")
    args = p.parse_args(argv)
    train = train_script()
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {
        (alg, *setting): [] for alg in args.algorithms for setting in SETTINGS}
    for seed in args.seeds:  # settings interleaved: a busy machine slows them all alike
        for alg, autocast, comp in results:
            results[(alg, autocast, comp)].append(run(train, args, alg, autocast, comp, seed))
        print(f"done: seed {seed}", file=sys.stderr, flush=True)
    out = table(results)
    print(f"digits, MLP 64-128-10, {args.nodes} nodes on a ring, {args.epochs} epochs, "
          f"seeds {' '.join(map(str, args.seeds))}\n")
    print(out)
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
