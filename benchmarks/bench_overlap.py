"""Overlap benchmark: time per round with a simulated link delay, the next gradients computed
while the messages travel (``overlap=True``) or after them, measured side by side (not a test).

Digits, an MLP per node, a ring of NODES nodes in process; each run trains ROUNDS rounds in
chunks timed alternately with its twin (same machine state). The two runs of a pair must end
with the same models bit for bit (overlap moves work in time, not in value): checked, and the
test accuracy of the averaged model is reported once for both. The last rows do the same with
``gossip.wrap`` and a user's own loop (CHOCO-SGD: each step's messages travel during the next
forward and backward).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import topologies  # noqa: E402
from gossip.training.datasets import digits  # noqa: E402
from gossip.training.models import MLP  # noqa: E402
from gossip.training.trainer import DecentralizedTrainer  # noqa: E402

RUNS = {  # label: (algorithm, compressor, algorithm keywords)
    "CHOCO-SGD top-10%": ("choco", "topk:0.1", {"gamma": 0.3}),
    "D-PSGD": ("dpsgd", "none", {}),
}


def trainer(name: str, nodes: int, latency: float, overlap: bool) -> DecentralizedTrainer:
    algorithm, compressor, hp = RUNS[name]
    train, test = digits()
    torch.manual_seed(0)
    from gossip.algorithms import make_algorithm

    return DecentralizedTrainer(
        MLP(64, 10, (128,)), train, test_set=test, topology=topologies.build("ring", nodes),
        algorithm=make_algorithm(algorithm, **hp), compressor=compressor,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batch_size=32, seed=0,
        link_latency=latency, overlap=overlap)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=8, help="nodes of the ring (default 8)")
    p.add_argument("--rounds", type=int, default=200, help="rounds per run (default 200)")
    p.add_argument("--chunk", type=int, default=20, help="rounds per timed chunk (default 20)")
    p.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.005],
                   help="simulated link delays in seconds (default 0 0.005)")
    args = p.parse_args()
    torch.set_num_threads(1)
    print("| run | link delay | sequential | overlapped | overlapped / sequential "
          "| same models | test accuracy |\n|---|---|---|---|---|---|---|", flush=True)
    for name in RUNS:
        for latency in args.latency:
            pair = [trainer(name, args.nodes, latency, ov) for ov in (False, True)]
            spent = [0.0, 0.0]
            done = 0
            while done < args.rounds:
                k = min(args.chunk, args.rounds - done)
                for j, t in enumerate(pair):
                    t0 = time.perf_counter()
                    t.fit(rounds=k, log_every=k)
                    spent[j] += time.perf_counter() - t0
                done += k
            same = all(torch.equal(pair[0].engine.nodes[i].x, pair[1].engine.nodes[i].x)
                       for i in pair[0].engine.nodes)
            acc = pair[0].evaluate_average(pair[0].test_set).accuracy
            seq, ovl = (1e3 * s / args.rounds for s in spent)
            print(f"| {name} | {1e3 * latency:g} ms | {seq:.2f} ms | {ovl:.2f} ms "
                  f"| **{ovl / seq:.2f}** | {'yes' if same else 'NO'} | {100 * acc:.2f}% |",
                  flush=True)
    for latency in args.latency:
        wrap_row(args.nodes, args.rounds, args.chunk, latency)


def wrap_row(nodes: int, rounds: int, chunk: int, latency: float) -> None:
    """The user's loop through gossip.wrap, with and without overlap, timed alternately."""
    from gossip.wrap import wrap

    train, test = digits()
    xs, ys = train.tensors
    pair = []
    for overlap in (False, True):
        torch.manual_seed(0)
        model = MLP(64, 10, (128,))
        pair.append(wrap(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                         algorithm="choco", compressor="topk:0.1", gamma=0.3, nodes=nodes,
                         overlap=overlap, link_latency=latency)[1])
    spent, step = [0.0, 0.0], [0, 0]
    while step[1] < rounds:
        for j, opt in enumerate(pair):
            t0 = time.perf_counter()
            for _ in range(chunk):
                for k, m in enumerate(opt.models):
                    at = 32 * ((nodes * step[j] + k) % (len(ys) // 32))
                    torch.nn.functional.cross_entropy(m(xs[at:at + 32]), ys[at:at + 32]).backward()
                opt.step()
                opt.zero_grad()
                step[j] += 1
            spent[j] += time.perf_counter() - t0
    for opt in pair:
        opt.synchronize()
    same = all(torch.equal(pair[0].engine.nodes[i].x, pair[1].engine.nodes[i].x)
               for i in pair[0].engine.nodes)
    model = pair[0].average_model()
    acc = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()
    seq, ovl = (1e3 * s / step[0] for s in spent)
    print(f"| gossip.wrap CHOCO top-10% | {1e3 * latency:g} ms | {seq:.2f} ms | {ovl:.2f} ms "
          f"| **{ovl / seq:.2f}** | {'yes' if same else 'NO'} | {100 * acc:.2f}% |", flush=True)


if __name__ == "__main__":
    main()
