"""The same digits runs through DecentralizedTrainer and through gossip.wrap (in process with a
block of nodes, or one node per MPI rank), for the equality tests of tests/training/test_wrap.py
and tests/helpers/mpi_wrap.py."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.training import MLP, DecentralizedTrainer, digits
from gossip.wrap import GossipOptimizer, wrap

BATCH = 16
CONFIGS: dict[str, dict[str, Any]] = {
    # algorithm: topology, compressor, local optimizer (lr, momentum) or None, hyper-parameters
    "choco": {"topology": "ring", "compressor": "topk:0.1", "sgd": (0.1, 0.9), "hparams": {"gamma": 0.5}},
    "dpsgd": {"topology": "ring", "compressor": "none", "sgd": (0.1, 0.0), "hparams": {}},
    "onebit-adam": {"topology": "complete", "compressor": "none", "sgd": None,
                    "hparams": {"eta": 1e-3, "freeze_step": 4}},
    "desloc": {"topology": "ring", "compressor": "none", "sgd": None,
               "hparams": {"eta": 1e-2, "period_x": 2, "period_m": 3, "period_v": 4}},
}
"""The algorithms checked against the trainer (the issue's four), each with a setting that
exercises its compressed or periodic phases within a few rounds."""
LAUNCHED = (*CONFIGS, "lead", "beer", "c-gt")
"""Checked one node per process under the launchers too: the four, one whose first step is its
setup (LEAD), one whose round ends with the model's step (BEER), gradient tracking (C-GT)."""


def model(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The digits MLP, built from a seeded generator (identical on every process)."""
    torch.manual_seed(seed)
    return MLP(64, 10, (32,)).to(dtype)


def config(name: str) -> dict[str, Any]:
    """The run setting of ``name`` (CONFIGS), or a plain one for any other algorithm."""
    if name in CONFIGS:
        return CONFIGS[name]
    cls = REGISTRY[name]
    return {"topology": "complete" if cls.requires.graph.complete else "ring", "compressor": "none",
            "sgd": (0.1, 0.0) if cls.takes_optimizer else None, "hparams": {}}


def trainer_losses(name: str, n: int, rounds: int, seed: int = 0, dtype: torch.dtype = torch.float32,
                   quantize: str | None = None) -> tuple[list[float], torch.Tensor]:
    """Per-round mean train loss of all nodes and the final block of models, by the trainer."""
    cfg = config(name)
    train, _ = digits()
    lr = cfg["sgd"]
    opt = None if lr is None else (lambda p: torch.optim.SGD(p, lr=lr[0], momentum=lr[1]))
    trainer = DecentralizedTrainer(
        model(), train, topology=topologies.build(cfg["topology"], n, seed=seed),
        algorithm=make_algorithm(name, **cfg["hparams"]), compressor=cfg["compressor"],
        optimizer=opt, batch_size=BATCH, seed=seed, dtype=dtype, quantize=quantize)
    records = trainer.fit(rounds=rounds, log_every=1)
    return [r["train_loss"] for r in records[1:]], trainer.engine.block.x.clone()


def wrapped(name: str, nodes: int | None, seed: int = 0, dtype: torch.dtype = torch.float32,
            quantize: str | None = None) -> tuple[nn.Module, GossipOptimizer]:
    """``gossip.wrap`` of the digits MLP for ``name``'s setting."""
    cfg = config(name)
    net = model(dtype=dtype)
    lr = cfg["sgd"]
    opt = None if lr is None else torch.optim.SGD(net.parameters(), lr=lr[0], momentum=lr[1])
    return wrap(net, opt, algorithm=name, compressor=cfg["compressor"], topology=cfg["topology"],
                seed=seed, nodes=nodes, quantize=quantize, **cfg["hparams"])


def endless(loader: DataLoader) -> Iterator[Any]:
    """The loader's batches, pass after pass."""
    while True:
        yield from loader


def wrap_losses(name: str, nodes: int | None, rounds: int, seed: int = 0,
                opt: GossipOptimizer | None = None, streams: list | None = None,
                ) -> tuple[list[float], torch.Tensor]:
    """The same run as :func:`trainer_losses` in a user's loop: every hosted node's gradient by
    ``loss.backward()``, then ``opt.step()``, until ``rounds`` rounds ran (one step more when
    the first is the algorithm's setup); the loss of each round is reduced over the nodes as
    the trainer does (collective under MPI)."""
    if opt is None:
        _, opt = wrapped(name, nodes, seed)
    train, _ = digits()
    if streams is None:
        streams = [endless(DataLoader(train, batch_size=BATCH, sampler=opt.sampler(train, node=i)))
                   for i in opt.local_nodes]
    losses = []
    last = opt.round + rounds
    while opt.round < last:
        before = opt.round
        opt.zero_grad()
        sums, counts = {}, {}
        for i, net, batches in zip(opt.local_nodes, opt.models, streams, strict=True):
            x, y = next(batches)
            loss = nn.functional.cross_entropy(net(x.to(next(net.parameters()).dtype)), y)
            loss.backward()
            sums[i] = float(loss.detach().to(torch.float64) * y.shape[0])
            counts[i] = float(y.shape[0])
        opt.step()
        total = math.fsum(opt.engine.node_values(counts).tolist())
        if opt.round > before:  # a round, not the setup (the trainer logs that loss at round 0)
            losses.append(math.fsum(opt.engine.node_values(sums).tolist()) / total)
    return losses, opt.engine.block.x.clone()
