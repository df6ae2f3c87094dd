"""The fused dense mix (gossip.compress.fused): the numpy path's bits, and the finite mask."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.compress import fused
from gossip.compress.rows import LOOP_FROM
from gossip.engine import Engine

pytestmark = pytest.mark.skipif(fused.kernel() is None, reason="numba is not installed")


def reference(out, own, w_own, src, dst, w, vals, add):
    """Each product rounded, then added in order (the numpy path's roundings)."""
    r = out.copy() if add else np.zeros_like(out)
    if own is not None:
        r += np.multiply(own, w_own.astype(out.dtype)[:, None])
    for s, t, wk in zip(src, dst, w.astype(out.dtype)):
        r[t] += np.multiply(vals[s], wk)
    return r


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize("with_own", [True, False])
def test_equals_the_numpy_roundings(dtype, add, with_own):
    g = torch.Generator().manual_seed(1)
    m, d = 3, 5000  # d not a multiple of the chunk: a short last chunk
    staging = torch.randn(7, d + 5, generator=g, dtype=dtype)[:, 2 : d + 2]  # strided rows
    own, recv = staging[:m], staging[m:]
    out = torch.randn(m, d, generator=g, dtype=dtype)
    src = torch.tensor([4, 3, 0, 5, 6, 1, 2])
    dst = torch.tensor([0, 1, 2, 0, 2, 0, 0])  # target 0 four times: adds in this order
    w = torch.rand(7, generator=g, dtype=torch.float64)
    w_own = torch.rand(m, generator=g, dtype=torch.float64) - 1.0
    expect = reference(out.numpy(), own.numpy() if with_own else None, w_own.numpy(),
                       src.tolist(), dst.tolist(), w.numpy(), staging.numpy(), add)
    terms = fused.Terms(m, src, dst, w, dtype)
    ok = fused.mix_rows_(out, own if with_own else None, w_own, terms, own, recv, add=add)
    assert np.array_equal(out.numpy(), expect)
    assert ok.all()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_term_marks_its_target(bad):
    m, d = 2, 10_000
    vals = torch.ones(4, d)
    vals[3, 9_999] = bad  # row 3 only goes to target 1
    out = torch.zeros(m, d)
    terms = fused.Terms(m, torch.tensor([2, 3]), torch.tensor([0, 1]), torch.ones(2, dtype=torch.float64),
                        torch.float32)
    ok = fused.mix_rows_(out, vals[:m], torch.full((m,), -0.5, dtype=torch.float64), terms, vals[:m],
                         vals[m:], add=False)
    assert ok.tolist() == [True, False]


def test_not_usable_without_numba_or_off_cpu(monkeypatch):
    x = torch.zeros(1, 10)
    assert fused.usable(x)
    assert not fused.usable(x.half())
    monkeypatch.setattr(fused, "_kernel", False)
    assert not fused.usable(x)


@pytest.mark.parametrize("alg, kwargs", [("gossip", {}), ("gossip", {"gamma": 0.7}),
                                         ("choco", {"gamma": 0.5})])
def test_a_run_has_the_bits_of_the_numpy_path(alg, kwargs, monkeypatch):
    """Exact gossip (and CHOCO's copy) on long rows: the same bits with and without the kernel."""
    topo = topologies.build("torus", 9)
    calls = []
    real = fused.mix_rows_
    monkeypatch.setattr(fused, "mix_rows_", lambda *a, **k: calls.append(1) or real(*a, **k))

    def run():
        eng = Engine(make_algorithm(alg, **kwargs), topo,
                     lambda i: torch.randn(LOOP_FROM + 3, generator=torch.Generator().manual_seed(i)),
                     compressor="none", dtype=torch.float32)
        for _ in range(3):
            eng.step()
        return eng.block.x.clone()

    with_kernel = run()
    assert calls  # the kernel ran
    monkeypatch.setattr(fused, "_kernel", False)
    n = len(calls)
    assert torch.equal(run(), with_kernel)
    assert len(calls) == n  # and this time it did not
