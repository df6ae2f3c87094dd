"""Routing plans are built in time linear in the arcs: a star's hub (degree n - 1) does not
make the plan quadratic in n."""

from __future__ import annotations

import time

import pytest
import torch

import topologies
from gossip.core.routing import MixPlan


@pytest.mark.slow
def test_a_large_star_plans_in_linear_time():
    n = 8000
    topo = topologies.build("star", n)
    ids = list(range(n))
    start = time.perf_counter()
    plan = MixPlan.build(topo, ids, lambda i: True, torch.device("cpu"))
    seconds = time.perf_counter() - start
    assert seconds < 8.0, f"{seconds:.1f} s to plan an {n}-node star"  # quadratic: minutes
    assert len(plan.slots) == n - 1  # the hub hears every leaf, one slot per in-neighbor
    src, rows, _ = plan.slots[0]
    assert rows is None and src.tolist() == [1] + [0] * (n - 1)  # slot 0: every node's first
    for k in (1, n // 2, n - 2):
        src, rows, w = plan.slots[k]
        assert rows.tolist() == [0] and src.tolist() == [k + 1]  # the hub's k-th in-neighbor
        assert w.tolist() == [topo.view(0).in_weights[k]]
