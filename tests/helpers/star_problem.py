"""The star both federated test modules run on: 7 clients of heterogeneous least squares around
node 0, their float64 gradients for the references, and the start point."""

from __future__ import annotations

import numpy as np
import torch

import topologies
from gossip.problems import make_problem

N, D = 8, 6  # node 0 the server, 7 clients
STAR = topologies.build("star", N)
PROBLEM = make_problem("least-squares", n_nodes=N - 1, dim=D, samples_per_node=20, seed=3,
                       heterogeneity=2.0, dtype=torch.float64)
GRADS = [None] + [lambda y, i=i: PROBLEM.grad_full(i - 1, torch.from_numpy(y)).numpy()
                  for i in range(1, N)]
X0 = np.linspace(-1.0, 1.0, D)
