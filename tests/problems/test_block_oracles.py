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


def _consensus_run(dtype, whole: bool, network=None, rounds=4):
    """D-PSGD on one consensus problem, its oracles made node by node (a plain factory, the
    per-node block path) or as one object of arrays (``problem.oracles()``)."""
    pb = Consensus(_targets(6), dtype=dtype)
    factory = pb.oracles("full")
    oracles = factory if whole else (lambda i, gen: factory(i, gen))
    x0 = torch.randn(N, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    eng = Engine(make_algorithm("dpsgd", eta=0.1), topologies.build("ring", N), x0,
                 oracles=oracles, dtype=dtype, network=network)
    made = sum(nd is not None for nd in eng.nodes.rows._made)
    for _ in range(rounds):
        eng.step()
    return eng, made


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("network", [None, "active=0.5"])
def test_oracles_as_one_object_equal_node_by_node(dtype, network):
    """The whole-block oracles (FullGradientRows) give the per-node path's bits and counters,
    with no node made at setup; under partial activation the sleeping nodes' oracles are put
    aside node by node and the rest still asked as runs of rows."""
    node, _ = _consensus_run(dtype, False, network)
    whole, made = _consensus_run(dtype, True, network)
    assert made == 0
    assert torch.equal(node.block.x, whole.block.x)
    assert [nd.oracle.counters() for nd in node.block.nodes] == \
        [nd.oracle.counters() for nd in whole.block.nodes]
    if network is not None:  # some nodes slept: not every node was asked every round
        assert len({nd.oracle.grads for nd in whole.block.nodes}) > 1


def test_oracle_rows_views_count_in_the_arrays():
    """A node's oracle read from the rows object is a FullGradient whose counters are the
    arrays' entries (its own calls, its state dict and its restore go there too)."""
    eng, _ = _consensus_run(torch.float64, True, rounds=2)
    rows = eng.nodes.rows._shared.oracles
    oracle = eng.nodes[3].oracle
    assert isinstance(oracle, FullGradient) and oracle is eng.nodes[3].oracle
    assert oracle.counters()["grads"] == 2 == rows.counts[0, 3]
    x = torch.zeros(D, dtype=torch.float64)
    assert torch.equal(oracle.grad(x), -_targets(6)[3])
    assert rows.counts[0, 3] == 3 and rows.counts[0, 4] == 2
    state = oracle.state_dict()
    oracle.load_state_dict({**state, "grads": 9})
    assert rows.counts[0, 3] == 9
