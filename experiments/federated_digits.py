"""Federated vs decentralized training on digits: accuracy against rounds and against bits.

    python experiments/federated_digits.py --rounds 300 --plot results/federated_digits.png

32 data holders, a Dirichlet(0.1) label split (strongly non-iid), an MLP 64-128-10, batch 32.
FedAvg, SCAFFOLD and FedAdam run on the star (node 0 the server, 32 clients, 10 sampled a round,
5 local steps), and the methods whose clients run Adam: FedAdamW, the same without its parts
(FedAvg with clients on AdamW), FedAdam-SSM (one top-10 % mask for the updates of x, m and v)
and its baseline with three separate top-k masks at the same uplink bits (6.67 %: 3k values and
k indices against 3k values and 3k indices); CHOCO-SGD (top-10 %) and D-PSGD on the 32-ring
(every node, one step a round).
The plot's bits are what a participant sends and receives: ``bits_up_per_client + bits_down_per_client``
on the star, ``2 · bits_per_node`` on the ring (each node receives what its neighbors send, as
much as it sends). Prints a table of rounds (not epochs: a federated round holds 5 local steps),
accuracy and the bits counted from the bytes sent (up and down per client on the star, sent
per node on the ring); ``--plot`` draws both panels. Every run goes through
``train.py`` (its flags, logs under ``--out``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gossip.cli import HelpFormatter, add_rounds_argument, guarded, positive_int  # noqa: E402

COMMON = ["--data", "digits", "--model", "mlp", "--hidden", "128", "--partition", "dirichlet:0.1",
          "--batch-size", "32"]
FED = ["--topology", "star", "--nodes", "33", "--clients-per-round", "10", "--local-steps", "5"]
FED_EPOCHS = [*FED[:-2], "--local-epochs", "2"]  # K_i = ⌈2·n_i/32⌉: heterogeneous local steps
RING = ["--topology", "ring", "--nodes", "32"]
RUNS: dict[str, list[str]] = {
    "FedAvg": [*FED, "--algorithm", "fedavg", "--lr", "0.05"],
    "SCAFFOLD": [*FED, "--algorithm", "scaffold", "--lr", "0.05"],
    "FedAdam": [*FED, "--algorithm", "fedadam", "--lr", "0.05", "--server-lr", "0.01"],
    "FedAdamW": [*FED, "--algorithm", "fedadamw", "--lr", "0.01"],
    "FedAvg-AdamW": [*FED, "--algorithm", "fedadamw", "--lr", "0.01", "--hparam", "gamma=0",
                     "v_start=zero", "step_count=local"],
    "FedAdam-SSM top-10%": [*FED, "--algorithm", "fedadam-ssm", "--lr", "0.003", "--hparam",
                            "density=0.1"],
    "FedAdam-3masks top-6.67%": [*FED, "--algorithm", "fedadam-ssm", "--lr", "0.003", "--hparam",
                                 "density=0.0667", "mask=separate"],
    "FedAdam-SSM-plain top-10%": [*FED, "--algorithm", "fedadam-ssm", "--lr", "0.003",
                                  "--hparam", "density=0.1", "uplink_memory=none"],
    "FedAdam-3masks-plain top-6.67%": [*FED, "--algorithm", "fedadam-ssm", "--lr", "0.003",
                                       "--hparam", "density=0.0667", "mask=separate",
                                       "uplink_memory=none"],
    "FedDyn alpha=0.01": [*FED, "--algorithm", "feddyn", "--lr", "0.05", "--hparam", "alpha=0.01"],
    "FedAvg by-size": [*FED, "--algorithm", "fedavg", "--lr", "0.05", "--sampling", "weighted"],
    "FedAvg fair": [*FED, "--algorithm", "fedavg", "--lr", "0.05", "--sampling", "fair"],
    "FedAvg power-d=20": [*FED, "--algorithm", "fedavg", "--lr", "0.05", "--selection", "power",
                          "--candidates", "20"],
    "FedAvg E=2": [*FED_EPOCHS, "--algorithm", "fedavg", "--lr", "0.05"],
    "FedNova E=2": [*FED_EPOCHS, "--algorithm", "fednova", "--lr", "0.05"],
    "SCAFFOLD E=2": [*FED_EPOCHS, "--algorithm", "scaffold", "--lr", "0.05"],
    "CHOCO-SGD top-10%": [*RING, "--algorithm", "choco", "--compressor", "topk:0.1", "--gamma",
                          "0.2", "--optimizer", "momentum", "--lr", "0.05"],
    "D-PSGD": [*RING, "--algorithm", "dpsgd", "--optimizer", "momentum", "--lr", "0.05"],
}
"""label -> train.py flags (besides COMMON, the length and the log)."""


def exchanged_bits(rec: dict[str, Any]) -> float:
    """Bits a participant sent and received up to this record (module docstring)."""
    if "bits_up_per_client" in rec:
        return rec["bits_up_per_client"] + rec["bits_down_per_client"]
    return 2.0 * rec["bits_per_node"]


def format_table(curves: dict[str, list[dict[str, Any]]]) -> str:
    """One row per run: the rounds it ran (a federated round is one exchange with the sampled
    clients, whatever its local steps), final and best test accuracy, and the bits counted
    from the bytes sent: up (a client to the server) and down (the server to a client) per
    client on the star, sent per node on the ring."""
    def f(v: float | None) -> str:
        return "—" if v is None else f"{v:.3g}"

    lines = ["| run | rounds | final test acc | best test acc | bits up/client | bits down/client "
             "| bits sent/node (ring) |", "|---|---|---|---|---|---|---|"]
    for label, recs in curves.items():
        last = recs[-1]
        star = "bits_up_per_client" in last
        best = max(r["test_accuracy"] for r in recs)
        lines.append(f"| {label} | {last['round']} | {last['test_accuracy']:.2%} | {best:.2%} "
                     f"| {f(last.get('bits_up_per_client'))} | {f(last.get('bits_down_per_client'))} "
                     f"| {'—' if star else f(last['bits_per_node'])} |")
    return "\n".join(lines)


def check_paths(args: argparse.Namespace) -> None:
    """Before the first run: --out can be made a folder of logs and --plot written in a format
    matplotlib has (one ``error:`` line naming the path otherwise)."""
    from gossip.cli import check_outputs
    from gossip.outputs import check_writable

    problem = check_writable(args.out, "--out", directory=True)
    if problem:
        raise SystemExit(problem)
    check_outputs(argparse.Namespace(plot=args.plot))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    add_rounds_argument(p, 300)
    p.add_argument("--log-every", type=positive_int, default=10, help="rounds between records")
    p.add_argument("--out", default="results/federated_digits", help="folder of the logs")
    p.add_argument("--plot", default=None, help="image of accuracy vs rounds and vs bits")
    p.add_argument("--only", nargs="+", default=None, choices=sorted(RUNS), help="runs to make")
    p.add_argument("--seed", type=int, default=0, help="the runs' seed (data split, sampling, init)")
    from gossip.config import suggest_flags

    suggest_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    args = parse_args(argv)
    check_paths(args)
    import importlib.util

    from gossip.metrics import read_jsonl

    spec = importlib.util.spec_from_file_location("_gossip_train", ROOT / "experiments" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    train = module.main
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    curves: dict[str, list[dict]] = {}
    for label, flags in RUNS.items():
        if args.only and label not in args.only:
            continue
        log = out / (label.replace(" ", "-").replace("%", "").replace("=", "").lower() + ".jsonl")
        train([*COMMON, "--seed", str(args.seed), *flags, "--rounds", str(args.rounds), "--log-every",
               str(args.log_every), "--out", str(log)])
        recs = [r | {"bits_exchanged": exchanged_bits(r)} for r in read_jsonl(log)
                if r["type"] == "round"]
        curves[label] = recs
    print(format_table(curves))
    if args.plot:
        from gossip.plot import plot_runs

        plot_runs(curves, args.plot, metric="test_accuracy", x_keys=("round", "bits_exchanged"),
                  title="digits, 32 holders, Dirichlet(0.1)", logy=False, flag="--plot")
    return curves


if __name__ == "__main__":
    guarded(main, memory_hint="--rounds or the runs (--only)")
