"""Exact gossip's messages (the adaptive family's ``ExactRows``): a received row with a NaN/Inf
value is refused with its row index, as the ``none`` compressor refuses it; finite rows pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import topologies
from gossip.algorithms.adaptive_gossip import EXACT
from gossip.compress import make
from gossip.errors import CompressionError


def received(values: torch.Tensor) -> torch.Tensor:
    """[m, d] values as the [m, d·itemsize] byte rows a block receives."""
    return values.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_row_with_nan_or_inf_is_refused_with_its_index(dtype, bad):
    X = torch.randn(4, 1000, dtype=dtype)
    X[2, 517] = bad
    X[3, 3] = bad  # the first bad row is the one named
    with pytest.raises(CompressionError, match="NaN/Inf") as info:
        EXACT.check_rows(received(X), X[0])
    assert info.value.row == 2


def test_finite_rows_are_accepted():
    X = torch.randn(3, 1000, dtype=torch.float64)
    EXACT.check_rows(received(X), X[0])
    big = torch.full((2, 10), 1e308, dtype=torch.float64)  # finite values whose sum overflows
    EXACT.check_rows(received(big), big[0])


def test_the_same_row_is_refused_as_by_the_none_compressor():
    X = torch.randn(3, 64, dtype=torch.float64)
    none = make("none")
    msgs = torch.stack([none.encode(x).to_bytes() for x in X])  # header, then the values
    X[1, 5] = float("nan")
    msgs[:, 8:].view(torch.float64).copy_(X)  # as if corrupted on the way
    with pytest.raises(CompressionError) as by_none:
        none.check_rows(msgs, X[0])
    with pytest.raises(CompressionError) as by_exact:
        EXACT.check_rows(received(X), X[0])
    assert by_none.value.row == by_exact.value.row == 1


def test_the_block_names_the_sender_of_a_nan_row():
    """Node 2 lives in another process and sends NaN in an exact-gossip phase (DADAM's)."""
    from gossip.core.block import Block
    from gossip.core.routing import MixPlan
    from gossip.errors import RowsError

    topo = topologies.build("ring", 4)
    ids = [0, 1, 3]
    nodes = [SimpleNamespace(id=i, state={}) for i in ids]
    block = Block(nodes, torch.ones(3, 8, dtype=torch.float64), make("none"), lambda: make("none"))
    block.begin_round(1, MixPlan.build(topo, ids, lambda j: j in ids, torch.device("cpu")))
    rows = block.encode(block.x, EXACT)
    assert [(j, i) for j, i, _ in block.plan.remote_in] == [(2, 1), (2, 3)]
    rows.received().view(torch.float64).fill_(0.5)
    block.check_received(rows)
    rows.received().view(torch.float64)[:, 3] = float("nan")
    with pytest.raises(RowsError, match=r"message from node 2 to node 1 was refused: exact "
                                        r"gossip: the message's values contain NaN/Inf") as info:
        block.check_received(rows)
    assert (info.value.sender, info.value.receiver) == (2, 1)
