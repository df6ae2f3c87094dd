"""The float64 setup the algorithm tests share: a graph, starting points, problems, an engine run
recording every round, the round-by-round comparison; and a heterogeneous problem for the
exact-convergence checks."""

from __future__ import annotations

import numpy as np
import torch

import topologies
from gossip.compress import make
from gossip.engine import Engine
from gossip.problems import make_problem
from gossip.rng import generator, init_seed

N, D = 8, 12
TOPO = topologies.build("erdos-renyi:p=0.4", N, seed=7)
W = TOPO.dense()


def x0_fn(seed=1, shape=(D,)):
    return lambda i: torch.randn(shape, generator=generator(init_seed(seed, i)), dtype=torch.float64)


def X0(seed=1):
    f = x0_fn(seed)
    return np.stack([f(i).numpy() for i in range(N)])


def row_compressor(spec):
    comp = make(spec)
    return lambda i, v: comp.decode(comp.encode(torch.from_numpy(np.ascontiguousarray(v)))).numpy()


PROBLEM = make_problem("least-squares", n_nodes=N, dim=D, samples_per_node=30, seed=3,
                       dtype=torch.float64)
LASSO = make_problem("lasso", n_nodes=N, dim=D, samples_per_node=30, seed=3, dtype=torch.float64)


def full_grad(problem):
    return lambda X: np.stack([problem.grad_full(i, torch.from_numpy(X[i])).numpy()
                               for i in range(N)])


def oracles(problem):
    return lambda i, gen: problem.oracle(i, gen)


def run_engine(alg, spec, rounds, x0=None, problem=None, **kw):
    eng = Engine(alg, TOPO, x0 or x0_fn(), compressor=spec,
                 oracles=oracles(problem) if problem else None, **kw)
    out = [np.stack([eng.nodes[i].x.numpy().copy() for i in range(N)])]
    for _ in range(rounds):
        eng.step()
        out.append(np.stack([eng.nodes[i].x.numpy().copy() for i in range(N)]))
    return out, eng


def assert_same(ours, theirs, atol=1e-10):
    assert len(ours) == len(theirs)
    for r, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=f"round {r}")


HETERO = make_problem("least-squares", n_nodes=8, dim=40, samples_per_node=30, seed=5,
                      heterogeneity=3.0, dtype=torch.float64)


def distance(eng, problem):
    x_star = problem.solution()
    return max(float(((nd.x - x_star) ** 2).sum() / (x_star**2).sum()) for nd in eng.nodes.values())
