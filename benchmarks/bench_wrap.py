"""gossip.wrap's cost per step over DecentralizedTrainer's per round (not a test).

CHOCO-SGD with top-10% on a ring, the digits MLP (64-64-10), SGD with momentum, batch 32: the
same run, the same numbers (tests/training/test_wrap.py), once through the trainer's
``fit(rounds=R)`` and once as a user's loop (DataLoader with the wrapper's sampler, forward,
``loss.backward()``, ``opt.step()``), timed alternately, the median of ``--repeats``. In one
process with ``--nodes`` nodes (the loop backpropagates every hosted node), or under
``mpiexec -n N`` with one node per rank. Also a plain torch loop with SGD (no gossip) for scale.

    python benchmarks/bench_wrap.py --nodes 4
    mpiexec -n 4 python benchmarks/bench_wrap.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.training import MLP, DecentralizedTrainer, digits  # noqa: E402
from gossip.wrap import wrap  # noqa: E402

BATCH, LR, MOMENTUM, GAMMA, COMPRESSOR = 32, 0.05, 0.9, 0.5, "topk:0.1"


def model() -> nn.Module:
    torch.manual_seed(0)
    return MLP(64, 10, (64,))


def endless(loader):
    while True:
        yield from loader


def trainer_s(n: int, rounds: int) -> float:
    train, _ = digits()
    trainer = DecentralizedTrainer(
        model(), train, topology=topologies.build("ring", n), algorithm=make_algorithm("choco", gamma=GAMMA),
        compressor=COMPRESSOR, optimizer=lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM),
        batch_size=BATCH)
    trainer.fit(rounds=2, log_every=10**9)  # warm-up
    tic = time.perf_counter()
    trainer.fit(rounds=rounds, log_every=10**9)
    return (time.perf_counter() - tic) / rounds


def wrap_s(nodes: int | None, rounds: int) -> float:
    train, _ = digits()
    net = model()
    net, opt = wrap(net, torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM), algorithm="choco",
                    compressor=COMPRESSOR, gamma=GAMMA, nodes=nodes)
    streams = [endless(DataLoader(train, batch_size=BATCH, sampler=opt.sampler(train, node=i)))
               for i in opt.local_nodes]

    def step() -> None:
        opt.zero_grad()
        for m, batches in zip(opt.models, streams, strict=True):
            x, y = next(batches)
            nn.functional.cross_entropy(m(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    tic = time.perf_counter()
    for _ in range(rounds):
        step()
    return (time.perf_counter() - tic) / rounds


def plain_s(rounds: int) -> float:
    train, _ = digits()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    batches = endless(DataLoader(train, batch_size=BATCH, shuffle=True))
    tic = time.perf_counter()
    for _ in range(rounds):
        x, y = next(batches)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return (time.perf_counter() - tic) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4,
                        help="nodes in one process, at least 2 (ignored under mpiexec)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    world = World.detect()
    n, nodes = (world.size, None) if world.size > 1 else (args.nodes, args.nodes)
    if n < 2:
        parser.error("the trainer needs a graph of at least 2 nodes: --nodes 2 or more")
    times: dict[str, list[float]] = {"trainer": [], "wrap": [], "plain": []}
    for _ in range(args.repeats):
        times["trainer"].append(trainer_s(n, args.rounds))
        times["wrap"].append(wrap_s(nodes, args.rounds))
        times["plain"].append(plain_s(args.rounds))
    med = {k: statistics.median(v) for k, v in times.items()}
    if world.is_root:
        where = f"{world.size} processes, one node each" if world.size > 1 else f"{n} nodes in one process"
        print(f"CHOCO {COMPRESSOR}, digits MLP, batch {BATCH}, {where}, {args.rounds} rounds x {args.repeats}:")
        print(f"  trainer {1e3 * med['trainer']:.3f} ms/round   wrap {1e3 * med['wrap']:.3f} ms/step   "
              f"wrap/trainer {med['wrap'] / med['trainer']:.3f}   plain torch loop (1 model) "
              f"{1e3 * med['plain']:.3f} ms/step")


if __name__ == "__main__":
    main()
