"""Batched exchanges (gossip/network/events.py, ``EventLoop._flush``): runs of consecutive
exchanges between disjoint pairs applied in one vectorized update give the models of the events
one by one, bit for bit, with loss (one-sided updates) and fresh rejoins, float32 and float64."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine


def _run(batched: bool, dtype: torch.dtype, network: str | None):
    n = 40
    X = torch.randn(n, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    alg = make_algorithm("pairwise-gossip")
    alg.batch_exchanges = batched
    sizes: list[int] = []
    if batched:
        apply = alg.exchange_pairs

        def counted(block, rows_i, rows_j, j_heard, i_heard):
            sizes.append(int(rows_i.numel()))
            apply(block, rows_i, rows_j, j_heard, i_heard)

        alg.exchange_pairs = counted
    eng = Engine(alg, topologies.build("ring", n), lambda i: X[i], dtype=dtype, network=network)
    recs = eng.run(6, log_every=3)
    return eng.block.x.clone(), recs, sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("network", ["loss=0.3", "churn=at:3@1-2,fresh;loss=0.1"])
def test_batched_exchanges_equal_the_events_one_by_one(dtype, network):
    x_one, recs_one, _ = _run(False, dtype, network)
    x_batch, recs_batch, sizes = _run(True, dtype, network)
    assert torch.equal(x_one, x_batch)
    assert sum(sizes) == recs_batch[-1]["activations"] == 6 * 40
    assert max(sizes) > 1  # some events did go together
    for a, b in zip(recs_one, recs_batch, strict=True):  # the same trace and counts
        assert {k: v for k, v in a.items() if not k.endswith("_s")} == \
               {k: v for k, v in b.items() if not k.endswith("_s")}


def test_prefilled_draws_are_the_draws_one_row_at_a_time():
    from gossip.network.timing import KeyedDraws

    one, many = KeyedDraws(7, "async.clock", None), KeyedDraws(7, "async.clock", None)
    many.prefill(range(50), 1, chunk=16)
    for row in range(50):
        for k in (1, 2, 31, 32, 300):
            assert one.value(row, k) == many.value(row, k)


def test_draws_in_small_chunks_are_the_block_draws():
    """``chunk=FIRST`` (an event loop's clocks and peers): the same numbers as whole blocks,
    a row's cache never past one chunk."""
    from gossip.network.timing import FIRST, KeyedDraws

    block, small = KeyedDraws(3, "async.partner", None), KeyedDraws(3, "async.partner", None,
                                                                     chunk=FIRST)
    for row in range(5):
        for k in (1, 2, 31, 32, 33, 64, 255, 256, 257, 700):
            assert block.value(row, k) == small.value(row, k)
    assert max(v[2].size for v in small.cache.values()) == FIRST
    assert max(v[2].size for v in block.cache.values()) > FIRST
