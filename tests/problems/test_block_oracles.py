"""The oracles' block path (``Oracle.block_group`` / ``grad_block``, ``Block.gradients``):
several nodes' gradients in one batched operation, the same bits and counters as node by node,
float32 and float64, consecutive nodes or not, next to sampled oracles that keep their own path."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.problems import make_problem
from gossip.problems.consensus import Consensus
from gossip.problems.oracles import FullGradient

N, D = 12, 9


def _targets(seed):
    return torch.randn(N, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nodes", [list(range(3, 10)), [7, 2, 11, 0, 5]])
def test_grad_block_equals_grad_node_by_node(dtype, nodes):
    pb = Consensus(_targets(0), dtype=dtype)
    X = torch.randn(len(nodes), D, generator=torch.Generator().manual_seed(1), dtype=dtype)
    one = [pb.oracle(i) for i in nodes]
    block = [pb.oracle(i) for i in nodes]
    expect = torch.stack([o.grad(X[k].clone()) for k, o in enumerate(one)])
    assert len({o.block_group() for o in block}) == 1
    out = torch.empty_like(X)
    FullGradient.grad_block(block, X, out)
    assert torch.equal(out, expect)
    assert [o.counters() for o in block] == [o.counters() for o in one]


def _dpsgd(dtype, block_path: bool):
    """D-PSGD on a block of two consensus problems and sampled least-squares nodes between them."""
    ls = make_problem("least-squares", n_nodes=N, dim=D, samples_per_node=6, seed=2, dtype=dtype)
    pa, pb = Consensus(_targets(3), dtype=dtype), Consensus(_targets(4), dtype=dtype)
    for p in (pa, pb):
        p.block_gradients = block_path

    def oracle(i, gen):
        if i in (5, 6):
            return ls.oracle(i, gen, "sgd", 2)
        return (pa if i < 5 else pb).oracle(i, gen)

    x0 = torch.randn(N, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    eng = Engine(make_algorithm("dpsgd", eta=0.1), topologies.build("ring", N), lambda i: x0[i],
                 oracles=oracle, dtype=dtype)
    for _ in range(4):
        eng.step()
    return eng.block.x.clone(), [nd.oracle.counters() for nd in eng.block.nodes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dpsgd_rounds_with_the_block_path_equal_node_by_node(dtype):
    x_node, counts_node = _dpsgd(dtype, block_path=False)
    x_block, counts_block = _dpsgd(dtype, block_path=True)
    assert torch.equal(x_node, x_block)
    assert counts_node == counts_block
