"""A gossip.wrap loop under torchrun in which rank 1 stops stepping after two steps and its
script ends, while the other ranks go on (test_torch_dist.py): each of them must name rank 1."""

from __future__ import annotations

import sys

import torch
from torch import nn

from gossip.wrap import wrap

torch.manual_seed(0)
net = nn.Linear(4, 1)
model, opt = wrap(net, torch.optim.SGD(net.parameters(), lr=0.1), algorithm="dpsgd",
                  topology="ring", timeout=float(sys.argv[1]))
for step in range(6):
    if opt.rank == 1 and step == 2:
        sys.exit(0)  # the misuse: this process takes fewer steps than the others
    loss = model(torch.ones(2, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
