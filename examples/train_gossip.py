"""The loop of train_plain.py, decentralized: every process is a node of a ring, CHOCO-SGD.

    python examples/train_gossip.py --steps 300              # one node (nothing to gossip with)
    mpiexec -n 4 python examples/train_gossip.py --steps 300
    torchrun --nproc-per-node 4 examples/train_gossip.py --steps 300
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

import gossip
from gossip.training import MLP, digits


def accuracy(model: nn.Module, data) -> float:
    """Fraction of ``data`` (a TensorDataset) that ``model`` classifies right."""
    x, y = data.tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description="digits MLP training loop")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    args = parser.parse_args()
    train, test = digits()
    torch.manual_seed(0)  # the same initial model on every process
    model = MLP(64, 10, hidden=(64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = gossip.wrap(model, opt, algorithm="choco", compressor="topk:0.1", gamma=0.5)
    loader = DataLoader(train, batch_size=32, sampler=opt.sampler(train))
    step = 0
    while step < args.steps:
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if step == args.steps:
                break
    model = opt.average_model()  # x̄ (every process takes part)
    if opt.is_root:
        print(f"steps {step}  last loss {loss.item():.4f}  test accuracy {accuracy(model, test):.3f}")


if __name__ == "__main__":
    main()
