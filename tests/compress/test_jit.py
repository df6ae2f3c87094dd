"""The numba kernels of :mod:`gossip.compress.jit` against their numpy twins: the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.compress import dispatch, jit, make
from gossip.compress.rows import section
from gossip.errors import CompressionError
from gossip.rng import Stream

pytestmark = pytest.mark.skipif(jit.get("topk_candidates") is None,
                                reason="numba is not installed")

DTYPES = st.sampled_from([np.float32, np.float64])


def draw(seed: int, d: int, dtype, levels: int) -> np.ndarray:
    """Gaussian entries, or (``levels`` > 0) a few magnitudes with random signs: many ties,
    zeros and −0.0 among them."""
    rng = np.random.default_rng(seed)
    if levels:
        x = rng.integers(0, levels, d).astype(dtype) * rng.choice([-1.0, 1.0], d).astype(dtype)
    else:
        x = rng.standard_normal(d).astype(dtype) * dtype(rng.uniform(1e-3, 1e3))
    return x


def both(fn, *args):
    """``fn(*args)`` with the numba kernels, then with their numpy twins."""
    try:
        out = [fn(*args)]
        dispatch.JIT = False
        out.append(fn(*args))
    finally:
        dispatch.JIT = True
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.integers(4096, 150_000), dtype=DTYPES,
       levels=st.sampled_from([0, 0, 3, 50]), ratio=st.sampled_from([0.001, 0.01, 0.05, 0.125]))
def test_topk_same_bytes_as_numpy(seed, d, dtype, levels, ratio):
    x = torch.from_numpy(draw(seed, d, dtype, levels))
    c = make(f"topk:{ratio}")
    fast, slow = both(lambda: c.encode(x).to_bytes().clone())
    assert torch.equal(fast, slow)
    k = max(1, int(ratio * d))
    ref = np.lexsort((np.arange(d), -np.abs(x.numpy())))[:k]  # by -|x|, then by index
    sel = c._select_jit(x.numpy(), k)
    assert sel is not None and np.array_equal(sel, np.sort(ref))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.integers(1, 20_000), dtype=DTYPES,
       q=st.floats(0.0, 1.0))
def test_topk_candidates_kernel(seed, d, dtype, q):
    """Every index with |x_i| ≥ t in order, NaN/Inf (above every threshold) and ±0.0 in x."""
    x = draw(seed, d, dtype, 0)
    rng = np.random.default_rng(seed)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype)
    if d > 10:
        x[rng.integers(0, d, 3)] = specials[rng.integers(0, 5, 3)]
    a = np.abs(x)
    t = np.quantile(a[np.isfinite(a)], q).astype(dtype) if np.isfinite(a).any() else dtype(0)
    ints = x.view(np.int32 if dtype == np.float32 else np.int64)
    mag = ints.dtype.type(np.iinfo(ints.dtype).max)
    idx = np.empty(d + 8, np.int64)
    flags = np.empty(jit.TOPK_CHUNK, np.bool_)
    c = jit.get("topk_candidates")(ints, t.view(ints.dtype), mag, idx, flags, *jit.BYTE_POSITIONS)
    assert np.array_equal(idx[:c], np.flatnonzero((a >= t) | np.isnan(a)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_topk_nonfinite_raises_on_the_kernel_path(bad):
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(0))
    x[49_999] = bad  # past the sample's stride: only the kernel's pass sees it
    c = make("topk:0.01")
    with pytest.raises(CompressionError, match="NaN/Inf"):
        c._select_jit(x.numpy(), 500)


def encode_row(spec: str, x: torch.Tensor, seed: int) -> bytes:
    """``encode_rows`` of the one row ``x`` with the stream of node 3, round 2."""
    c = make(spec)
    rng = Stream(seed, [3])
    rng.begin_round(2)
    return bytes(c.encode_rows(x.view(1, -1), rng).numpy())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.one_of(st.integers(1, 70), st.integers(4000, 20_000)),
       dtype=DTYPES, spec=st.sampled_from(["qsgd:4", "qsgd:1", "qsgd:s=3", "qsgd:2:biased",
                                           "lead:2", "lead:6"]),
       zeros=st.booleans())
def test_level_codes_same_bytes_as_numpy(seed, d, dtype, spec, zeros):
    x = torch.from_numpy(draw(seed, d, dtype, 0))
    if zeros:
        x[:: 3] = 0.0
    fast, slow = both(encode_row, spec, x, seed)
    assert fast == slow


@pytest.mark.parametrize("spec", ["qsgd:4", "lead:2"])
def test_level_codes_kernel_serves_long_rows_and_zero(spec):
    """The kernel runs (not the loop) for a long row and for x = 0 (no level added)."""
    if jit.torch_rounding("add_alpha", np.float32) == 0:
        pytest.skip("torch's add(alpha=) rounds neither way everywhere here: no kernel")
    c = make(spec)
    for x in (torch.randn(300_001, generator=torch.Generator().manual_seed(1)), torch.zeros(5000)):
        rng = Stream(0, [0])
        nv = c._norm_host(x, x.numpy())
        body = np.zeros(c.fixed_nbytes(x), np.uint8)
        assert c._encode_jit(x.numpy(), rng.draw16(x.numel())[0], nv, body)
        dispatch.JIT = False
        try:
            want = c.encode(x, Stream(0, [0])).to_bytes().numpy()
        finally:
            dispatch.JIT = True
        assert np.array_equal(body[: c.width * ((x.numel() + 7) // 8)],
                              want[-c.width * ((x.numel() + 7) // 8):])


@pytest.mark.parametrize("spec", ["qsgd:4", "lead:2"])
def test_level_add_long_rows_refuse_codes_outside_the_levels(spec):
    """A long row holding a code outside the 2s + 1 levels raises the per-row error naming
    it, and ``out`` is left as it was (every row is checked before any is added)."""
    c = make(spec)
    d = 1 << 16
    X = torch.randn(3, d, generator=torch.Generator().manual_seed(2))
    block = c.encode_rows(X, Stream(0, [0, 1, 2])).clone()
    n8 = d // 8
    codes = block[2, -(c.width * n8):].view(c.width, n8)  # the last row's planes
    codes[:, 100] = 0xFF  # entries 800..807: code 2^width − 1 > o + s
    out = torch.randn(3, d)
    before = out.clone()
    with pytest.raises(CompressionError) as err:
        c.decode_add_rows_(out, block, 0.5)
    assert err.value.row == 2 and torch.equal(out, before)
    got = c.decode_add_rows_(out, block[:2], 0.5)  # the good rows still add, as each message
    want = before.clone()
    for r in range(2):
        c.decode_add_(want[r], c.from_bytes(block[r], want[r]), 0.5)
    assert torch.equal(got, want)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.one_of(st.integers(4090, 4200), st.integers(4096, 70_000)),
       dtype=DTYPES, levels=st.sampled_from([0, 3]), spec=st.sampled_from(["sign", "sign_l2"]))
def test_sign_same_bytes_as_numpy(seed, d, dtype, levels, spec):
    """±0.0 (levels: many zeros, half of them −0.0) give clear bits; the scale's bits are
    torch's sum of the kernel's |x|."""
    x = torch.from_numpy(draw(seed, d, dtype, levels))
    c = make(spec)
    fast, slow = both(lambda: c.encode(x).to_bytes().clone())
    assert torch.equal(fast, slow)


def test_sign_bits_kernel():
    """|x| exactly, bit i set for x_i < 0 only, padding bits clear, chunk edges included."""
    x = np.random.default_rng(0).standard_normal(3 * jit.SIGN_CHUNK + 13).astype(np.float32)
    x[::5] = -0.0
    absx, out = np.empty_like(x), np.full(-(-x.size // 8), 0xFF, np.uint8)
    jit.get("sign_bits")(x, absx, out, np.empty(jit.SIGN_CHUNK, np.uint8))
    assert np.array_equal(absx.view(np.int32), np.abs(x).view(np.int32))
    assert np.array_equal(out, np.packbits(x < 0, bitorder="little"))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 30), d=st.integers(8, 3000), dtype=DTYPES,
       levels=st.sampled_from([0, 0, 2, 5, 50]), ratio=st.sampled_from([0.001, 0.01, 0.05, 0.1]),
       nonfinite=st.sampled_from([None, np.nan, np.inf]))
def test_topk_blocks_same_bytes_as_numpy(seed, m, d, dtype, levels, ratio, nonfinite):
    """Blocks of short rows (``topk_rows``: a sampled threshold) give the bytes of numpy's
    introselect path, ties and zeros included; a NaN/Inf row is refused on both paths."""
    X = torch.from_numpy(np.stack([draw(seed + r, d, dtype, levels) for r in range(m)]))
    if nonfinite is not None:
        X[m // 2, d // 3] = nonfinite
    c = make(f"topk:{ratio}")

    def encode():
        try:
            return c.encode_rows(X, None).clone()
        except CompressionError as exc:
            return exc.row

    fast, slow = both(encode)
    if nonfinite is None:
        assert torch.equal(fast, slow)
        plan = c.plan(X[0])
        if plan.param == 0:  # indices on the wire: the rule, largest |x| first, ties by index
            k = max(1, int(ratio * d))
            got = section(fast, plan, "index").numpy()
            for r in range(m):
                ref = np.sort(np.lexsort((np.arange(d), -np.abs(X[r].numpy())))[:k])
                assert np.array_equal(got[r], ref)
    else:
        assert fast == slow == m // 2
