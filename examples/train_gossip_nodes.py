"""train_gossip.py's run of N processes, in one process: ``gossip.wrap(..., nodes=N)`` hosts all
N nodes here, each with its model (``opt.models``), its gradient and its part of the data, and
gives the numbers of ``mpiexec -n N python examples/train_gossip.py`` (the same seed, data
order and sums in node order):

    python examples/train_gossip_nodes.py --nodes 4 --steps 300
    mpiexec -n 4 python examples/train_gossip.py --steps 300      # the same last line
"""

import argparse
from collections.abc import Iterator

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


def batches(loader: DataLoader) -> Iterator:
    """The loader's batches, epoch after epoch: each node starts its next epoch when its own
    part of the data runs out, as each process of train_gossip.py does."""
    while True:
        yield from loader


def main() -> None:
    parser = argparse.ArgumentParser(description="digits MLP training loop, N nodes in one process")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--nodes", type=int, default=4, help="nodes (the processes replaced)")
    args = parser.parse_args()
    train, test = digits()
    torch.manual_seed(0)  # the initial model of every node
    model = MLP(64, 10, hidden=(64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = gossip.wrap(model, opt, algorithm="choco", compressor="topk:0.1", gamma=0.5,
                             nodes=args.nodes)
    data = [batches(DataLoader(train, batch_size=32, sampler=opt.sampler(train, node=i)))
            for i in opt.local_nodes]
    for _ in range(args.steps):
        opt.zero_grad()
        losses = []
        for node_model, node_data in zip(opt.models, data, strict=True):  # one gradient per node
            x, y = next(node_data)
            loss = nn.functional.cross_entropy(node_model(x), y)
            loss.backward()
            losses.append(loss)
        opt.step()  # one round of CHOCO-SGD over all nodes
    model = opt.average_model()
    print(f"steps {args.steps}  last loss {losses[0].item():.4f}  "  # node 0's, as rank 0 prints
          f"test accuracy {accuracy(model, test):.3f}")


if __name__ == "__main__":
    main()
