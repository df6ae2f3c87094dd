"""The fused dense mix (gossip.compress.fused): the numpy path's bits, and the finite mask."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.compress import dispatch, fused, jit
from gossip.compress.dispatch import LOOP_FROM
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
    assert dispatch.fused_mix(x)
    assert not dispatch.fused_mix(x.half())
    monkeypatch.setattr(dispatch, "JIT", False)
    assert not dispatch.fused_mix(x)


@pytest.mark.parametrize("alg, kwargs, dtype", [("gossip", {}, torch.float32),
                                                ("gossip", {"gamma": 0.7}, torch.float32),
                                                ("choco", {"gamma": 0.5}, torch.float64)])
def test_a_run_has_the_bits_of_the_numpy_path(alg, kwargs, dtype, monkeypatch):
    """Exact gossip (and CHOCO's copy of a float64 model) on long rows: the same bits with and
    without the kernel."""
    topo = topologies.build("torus", 9)
    calls = []
    real = fused.DenseMix.__call__
    monkeypatch.setattr(fused.DenseMix, "__call__", lambda *a, **k: calls.append(1) or real(*a, **k))

    def run():
        eng = Engine(make_algorithm(alg, **kwargs), topo,
                     lambda i: torch.randn(LOOP_FROM + 3, generator=torch.Generator().manual_seed(i)),
                     compressor="none", dtype=dtype)
        for _ in range(3):
            eng.step()
        return eng.block.x.clone()

    with_kernel = run()
    assert calls  # the kernel ran
    monkeypatch.setattr(dispatch, "JIT", False)
    n = len(calls)
    assert torch.equal(run(), with_kernel)
    assert len(calls) == n  # and this time it did not


@pytest.mark.parametrize("alg, spec, kwargs", [("choco", "none", {"gamma": 0.5}),
                                               ("choco", "topk:0.1", {"gamma": 0.3}),
                                               ("lead", "lead:4", {}), ("c-gt", "none", {})])
def test_the_wide_gap_kernel_has_the_bits_of_its_torch_twin(alg, spec, kwargs, monkeypatch):
    """A float32 model's channel sums its gap in float64: the numba kernel (long rows on the
    CPU) and its torch twin give the same bits, copies moved in place (α = 1) or not."""
    from gossip.problems import make_problem

    topo = topologies.build("torus", 9)  # in-process rows: the own ones, then neighbors
    d = dispatch.JIT_FROM + 3
    problem = make_problem("least-squares", n_nodes=9, dim=d, samples_per_node=4, seed=1,
                           dtype=torch.float32)
    calls = []
    real_get = jit.get

    def counting(name):
        kernel = real_get(name)
        if name != "wide_gap" or kernel is None:
            return kernel
        return lambda *a: calls.append(1) or kernel(*a)

    monkeypatch.setattr(jit, "get", counting)

    def run():
        oracles = None if alg == "choco" else (lambda i, g: problem.oracle(i, g))
        eng = Engine(make_algorithm(alg, **kwargs), topo,
                     lambda i: torch.randn(d, generator=torch.Generator().manual_seed(i)),
                     compressor=spec, dtype=torch.float32, oracles=oracles)
        for _ in range(3):
            eng.step()
        return [eng.block.x.clone(), *(t.clone() for t in eng.block.state.values())]

    with_kernel = run()
    assert calls  # the kernel ran
    monkeypatch.setattr(dispatch, "JIT", False)
    n = len(calls)
    assert all(torch.equal(a, b) for a, b in zip(run(), with_kernel))
    assert len(calls) == n


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.0, 0.7, 1.3])
def test_alpha_adds_as_torch_add_does(dtype, alpha):
    """``out += α·(sum)``: the sum rounded first, then torch's ``add_(…, alpha=)`` (one fused
    multiply-add), whatever the path."""
    g = torch.Generator().manual_seed(2)
    m, d = 3, 9000
    staging = torch.randn(6, d + 3, generator=g, dtype=dtype)[:, 1 : d + 1]
    own, recv = staging[:m], staging[m:]
    out = torch.randn(m, d, generator=g, dtype=dtype)
    src, dst = torch.tensor([3, 4, 0, 5]), torch.tensor([0, 1, 2, 2])
    w = torch.rand(4, generator=g, dtype=torch.float64)
    w_own = torch.rand(m, generator=g, dtype=torch.float64) - 1.0
    total = torch.from_numpy(reference(np.zeros((m, d), out.numpy().dtype), own.numpy(),
                                       w_own.numpy(), src.tolist(), dst.tolist(), w.numpy(),
                                       staging.numpy(), add=False))
    expect = out.clone().add_(total, alpha=alpha)
    ok = fused.mix_rows_(out, own, w_own, fused.Terms(m, src, dst, w, dtype), own, recv,
                         add=True, alpha=alpha)
    assert torch.equal(out, expect)
    assert ok.all()


def test_in_place_over_the_rows_it_reads():
    """A model mixed in place with its neighbors' rows of the same tensor (exact gossip of
    several nodes in one process): every result reads the inputs as they were."""
    g = torch.Generator().manual_seed(3)
    m, d = 5, 20_000
    x = torch.randn(m, d, generator=g)
    ring = torch.arange(m)
    src = torch.cat(((ring - 1) % m, (ring + 1) % m))
    dst = torch.cat((ring, ring))
    w = torch.full((2 * m,), 1 / 3, dtype=torch.float64)
    w_own = torch.full((m,), 1 / 3 - 1.0, dtype=torch.float64)
    total = torch.from_numpy(reference(np.zeros((m, d), np.float32), x.numpy(), w_own.numpy(),
                                       src.tolist(), dst.tolist(), w.numpy(), x.numpy(), add=False))
    expect = x.clone().add_(total, alpha=1.0)
    fused.mix_rows_(x, x, w_own, fused.Terms(m, src, dst, w, torch.float32), x, None,
                    add=True, alpha=1.0)
    assert torch.equal(x, expect)


def test_a_model_changed_after_the_kernel_checked_it_is_checked_again():
    """Exact gossip sends the model the kernel wrote (and found finite) without another NaN/Inf
    pass; a model changed since then is checked at its next send, and NaN is refused."""
    topo = topologies.build("ring", 4)
    eng = Engine(make_algorithm("gossip"), topo,
                 lambda i: torch.randn(LOOP_FROM + 5, generator=torch.Generator().manual_seed(i)),
                 compressor="none", dtype=torch.float32)
    eng.step()
    sums = []
    real = eng.block.compressor.encode_rows

    def spy(X, rng=None, *, out=None):
        sums.append(eng.block.compressor.check_finite)
        return real(X, rng, out=out)

    eng.block.compressor.encode_rows = spy
    eng.step()
    # the kernel's check of round 1's result stands for round 2's send: no encode with the
    # check on (the block writes the headers where they are, without calling the encoder)
    assert True not in sums
    eng.block.x[2, 7] = math.nan
    with pytest.raises(Exception, match="node 2 .*NaN/Inf"):
        eng.step()
    assert sums[-1] is True
