"""The numpy fast path for CPU tensors (``dispatch.NUMPY``) against the torch path (what CUDA
runs): the same bytes, the same decoded values, the same errors, no stray warnings; plus the
bit-plane packing, top-k ties, payload views, autograd and the rand-k index cache."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from gossip.compress import bits, dispatch, make, sparse
from gossip.compress.checks import Workspace
from gossip.compress.sparse import sample_distinct
from gossip.errors import CompressionError
from gossip.layout import Layout

SPECS = [
    "none",
    "fp16",
    "bf16",
    "topk:0.1",
    "topk:3",
    "topk:0.3",  # bitmap indices
    "randk:0.25",
    "randk:0.25:unbiased",
    "sign",
    "qsgd:1",
    "qsgd:4",
    "qsgd:2:biased",
    "qsgd:8",  # 9-bit codes: a raw low byte and one plane
    "qsgd:12",
    "qsgd:16",  # 17-bit codes: int32 on the numpy path
    "qsgd:s=127",
    "lead:2",
    "lead:8",
    "natural",
    "lowrank:2",
]


def gen(seed: int = 3) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def both_paths(fn, monkeypatch):
    """``fn()`` on the numpy path, then on the torch path."""
    a = fn()
    monkeypatch.setattr(dispatch, "NUMPY", False)
    b = fn()
    monkeypatch.setattr(dispatch, "NUMPY", True)
    return a, b


# ------------------------------------------------------------------------ bit planes
@pytest.mark.parametrize("width", [1, 2, 3, 5, 7, 8, 9, 12, 13, 16, 17, 18])
@pytest.mark.parametrize("d", [1, 7, 8, 13, 1001, 70_001])
def test_pack_codes_numpy_matches_torch(width, d):
    rng = np.random.default_rng(width * 1000 + d)
    codes = rng.integers(0, 1 << width, d)
    n8 = bits.nbytes_bits(d)
    padded = torch.zeros(8 * n8, dtype=bits.code_dtype(width))
    padded[:d] = torch.from_numpy(codes.astype(np.int32 if width > 8 else np.uint8))
    ws = Workspace()
    ref = torch.zeros(bits.packed_nbytes(d, width), dtype=torch.uint8)
    old = dispatch.NUMPY
    try:
        dispatch.NUMPY = False
        bits.pack_codes(padded, width, ref, ws, torch.device("cpu"))
    finally:
        dispatch.NUMPY = old
    got = np.full(ref.numel(), 0xAB, dtype=np.uint8)  # garbage: every byte must be written
    bits.pack_codes_np(codes.astype(bits.host_code_dtype(width)), width, got, ws)
    assert np.array_equal(got, ref.numpy())
    back = bits.unpack_codes_np(got, d, width, ws)
    assert np.array_equal(back, codes)
    torch_back = bits.unpack_codes(ref, d, width, ws, torch.device("cpu"))
    assert np.array_equal(torch_back[:d].numpy().astype(np.int64), codes)


@pytest.mark.parametrize("width", [2, 3, 5, 7, 8, 9, 13, 17])
@pytest.mark.parametrize("d", [8, 13, 1001, 70_001])
def test_pack_codes_np_by_chunks(width, d):
    """A message packed chunk by chunk (the encoders' chunks, any order, the last one short) is
    byte for byte the message packed at once, and every byte is written."""
    rng = np.random.default_rng(width * 1000 + d)
    codes = rng.integers(0, 1 << width, d).astype(bits.host_code_dtype(width))
    ws = Workspace()
    ref = np.empty(bits.packed_nbytes(d, width), dtype=np.uint8)
    bits.pack_codes_np(codes, width, ref, ws)
    for step in (8, 64, 4096 * 17):
        got = np.full(ref.size, 0xAB, dtype=np.uint8)
        for a in reversed(range(0, d, step)):
            bits.pack_codes_np(codes[a : a + step], width, got, ws, a, d)
        assert np.array_equal(got, ref), step


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lead_step_of_zero_and_nan_inputs(dtype):
    """LEAD's step is ‖x‖_∞/s with ‖x‖_∞ = max(−min x, max x) as numpy's min and max give it:
    the sign bit of a zero step (x = 0 with zeros of both signs) and of a NaN step (NaN in x,
    ``check_finite`` off) is on the wire and stays numpy's, whichever reduction finds the norm."""
    rng = np.random.default_rng(7)
    for d in (1, 8, 33, 1000, 4097):
        zeros = np.where(rng.random(d) < 0.5, -0.0, 0.0)
        nans = rng.standard_normal(d)
        nans[rng.integers(0, d, 3)] = np.nan
        nans[rng.integers(0, d)] = -np.nan
        for xn in (zeros, nans):
            xn = xn.astype(dtype == torch.float32 and np.float32 or np.float64)
            c = make("lead:2")
            c.check_finite = False
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                step = c.encode(torch.from_numpy(xn), gen()).host["scale"][0]
            want = xn.dtype.type(max(-float(xn.min()), float(xn.max()))) * xn.dtype.type(1 / c.s)
            assert step.tobytes() == want.tobytes(), (d, step, want)


# -------------------------------------------------------------------- bytes and values
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spec", SPECS)
def test_numpy_and_torch_paths_agree(spec, dtype, monkeypatch):
    for shape in ((1,), (13,), (2000,), (40, 25)):
        if spec == "topk:3" and shape == (1,):
            continue
        x = torch.randn(shape, generator=gen(sum(shape)), dtype=dtype)
        x.view(-1)[::9] = 0.0
        x.view(-1)[::13] = -0.0
        base = torch.randn(shape, generator=gen(5), dtype=dtype)

        def run(x=x, base=base):
            c = make(spec)
            p = c.encode(x, gen())
            q = make(spec).from_bytes(p.to_bytes().clone(), x)
            acc_own, acc_recv = base.clone(), base.clone()
            c.decode_add_(acc_own, p, -0.37)
            make(spec).decode_add_(acc_recv, q, 0.61)
            return p.to_bytes(), c.decode(p), make(spec).decode(q), acc_own, acc_recv

        (b1, y1, r1, a1, c1), (b2, y2, r2, a2, c2) = both_paths(run, monkeypatch)
        assert torch.equal(b1, b2), shape
        assert torch.equal(y1, y2) and torch.equal(r1, r2) and torch.equal(y1, r1), shape
        tol = 1e-6 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(a1, a2, rtol=tol, atol=tol)
        torch.testing.assert_close(c1, c2, rtol=tol, atol=tol)
        torch.testing.assert_close(a1, base - 0.37 * y1, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "spec", ["none", "topk:0.01", "topk:0.2", "randk:0.01", "sign", "qsgd:4", "qsgd:8", "lead:2"]
)
def test_numpy_and_torch_paths_agree_on_large_tensors(spec, monkeypatch):
    """Large tensors switch kernels (streaming unpack, table gather, sampled top-k)."""
    x = torch.randn(300_001, generator=gen(8))
    base = torch.randn(300_001, generator=gen(9))

    def run():
        c = make(spec)
        p = c.encode(x, gen())
        acc = base.clone()
        c.decode_add_(acc, make(spec).from_bytes(p.to_bytes().clone(), x), 0.3)
        return p.to_bytes(), c.decode(p), acc

    (b1, y1, a1), (b2, y2, a2) = both_paths(run, monkeypatch)
    assert torch.equal(b1, b2) and torch.equal(y1, y2)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(a1, base + 0.3 * y1)


@pytest.mark.parametrize("spec", ["none", "topk:0.1", "randk:0.25", "sign", "qsgd:2", "lead:2"])
def test_per_tensor_paths_agree(spec, monkeypatch):
    layout = Layout([(6, 5), (7,), (3, 2, 2), (1,), (40, 50)])
    x = torch.randn(layout.numel, generator=gen(9))

    def run():
        c = make(spec, layout=layout)
        p = c.encode(x, gen())
        q = c.from_bytes(p.to_bytes().clone(), x)
        acc = torch.ones_like(x)
        c.decode_add_(acc, q, 0.5)
        return p.to_bytes(), c.decode(p), acc

    (b1, y1, a1), (b2, y2, a2) = both_paths(run, monkeypatch)
    assert torch.equal(b1, b2) and torch.equal(y1, y2)
    torch.testing.assert_close(a1, a2)


# --------------------------------------------------------------------------------- top-k
def _reference_topk(x: torch.Tensor, k: int) -> list[int]:
    """k largest |x_i|, the lowest indices first among ties, in increasing index order."""
    a = x.abs().double().numpy()
    order = np.lexsort((np.arange(a.size), -a))  # by -|x|, then by index
    return sorted(order[:k].tolist())


@pytest.mark.parametrize("d", [1, 9, 50, 1000, 2000, 4095, 5000, 70_001])
@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.3, 1.0])
def test_topk_ties_on_both_paths(d, ratio, monkeypatch):
    g = gen(d)
    levels = torch.tensor([0.0, 0.5, 1.0, 2.0, 3.0])  # few distinct magnitudes: many ties
    x = levels[torch.randint(0, 5, (d,), generator=g)] * torch.sign(torch.randn(d, generator=g))
    k = max(1, int(ratio * d))
    c = make(f"topk:{ratio}")
    b1, b2 = both_paths(lambda: c.encode(x).to_bytes(), monkeypatch)
    assert torch.equal(b1, b2)
    y = c.decode(c.from_bytes(b1.clone(), x))
    kept = torch.nonzero(y).view(-1).tolist()
    ref = _reference_topk(x, k)
    assert kept == [i for i in ref if x[i] != 0]  # zeros decode as zeros
    assert c.fixed_nbytes(x) == b1.numel()


@pytest.mark.parametrize("d", [200, 10_000])
def test_topk_nan_without_check_gives_a_message(d):
    c = make("topk:0.05")
    c.check_finite = False
    x = torch.randn(d, generator=gen())
    x[::3] = float("nan")  # more NaNs than k
    p = c.encode(x)
    assert p.nbytes == c.fixed_nbytes(x)
    c.decode(c.from_bytes(p.to_bytes(), x))  # garbage, but no crash


# --------------------------------------------------------------------- errors, warnings
@pytest.mark.parametrize("spec", SPECS)
def test_nonfinite_raises_without_warnings(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = make(spec)
        for n in (37, 5000):
            for bad in (float("nan"), float("inf"), -float("inf")):
                x = torch.randn(n, generator=gen())
                x[5] = bad
                x[n - 1] = -bad
                if spec == "lowrank:2":
                    x = x.view(-1, 1 if n == 37 else 50)
                with pytest.raises(CompressionError, match="NaN/Inf"):
                    c.encode(x, gen())


def test_huge_values_without_warnings():
    big = torch.tensor([3e38, -3e38, 1.0, 2e38])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for spec in ("none", "topk:1", "randk:2", "bf16", "lead:2", "lead:8", "qsgd:2", "natural"):
            c = make(spec)
            try:
                y = c.decode(c.from_bytes(c.encode(big, gen()).to_bytes(), big))
            except CompressionError as e:  # reported as what it is, not as NaN/Inf
                assert (spec, "overflows" in str(e) or "2^127" in str(e)) in (
                    ("qsgd:2", True),  # ‖x‖₂ overflows float32
                    ("natural", True),  # above the largest exponent code
                )
                continue
            assert y.shape == big.shape
        c = make("lead:2")  # corrupt codes (outside the 2s + 1 levels) are refused, quietly
        buf = c.encode(big, gen()).to_bytes().clone()
        buf[12:] = 0
        with pytest.raises(CompressionError, match="outside the 5 levels"):
            c.from_bytes(buf, big)


def test_malformed_messages_on_the_numpy_path():
    x = torch.randn(1000, generator=gen())
    c = make("topk:0.02")
    buf = c.encode(x).to_bytes().clone()
    idx = buf[8 + 80 :].view(torch.int32)
    for pos, value, what in ((0, -5, "out of range"), (19, 1000, "out of range"), (3, 0, "strictly")):
        bad = buf.clone()
        bad[8 + 80 :].view(torch.int32)[pos] = value if what != "strictly" else int(idx[2])
        with pytest.raises(CompressionError, match=what):
            c.from_bytes(bad, x)
    bad = buf.clone()
    bad[1] = 0x12  # float64 announced
    with pytest.raises(CompressionError, match="carries"):
        c.from_bytes(bad, x)
    with pytest.raises(CompressionError, match="truncated"):
        c.from_bytes(buf[:-4], x)


# ------------------------------------------------------------------ payloads, autograd
def test_payload_parts_are_views_of_the_buffer():
    x = torch.randn(500, generator=gen())
    for spec in ("none", "topk:0.05", "sign", "qsgd:4"):
        c = make(spec)
        for p in (c.encode(x, gen()), c.from_bytes(c.encode(x, gen()).to_bytes().clone(), x)):
            assert p.host is not None and "Payload(" in repr(p)
            lo = p.buffer.data_ptr()
            hi = lo + p.nbytes
            for name, t in p.parts.items():
                if name == "sel":
                    continue
                assert isinstance(t, torch.Tensor)
                assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi


def test_decode_add_and_autograd():
    x = torch.randn(300, generator=gen())
    for spec in ("none", "topk:0.1", "sign", "lead:2"):
        c = make(spec)
        p = c.encode(x, gen())
        y = c.decode(p)
        out = torch.zeros(300)
        v0 = out._version
        c.decode_add_(out, p, 2.0)
        assert out._version > v0  # autograd sees the in-place write
        torch.testing.assert_close(out, 2 * y)
        leaf = torch.zeros(300, requires_grad=True)  # in place on a leaf: the torch path
        c.decode_add_(leaf, p, 1.0)
        torch.testing.assert_close(leaf.detach(), y)
        xg = x.clone().requires_grad_(True)
        assert torch.equal(c.encode(xg * 1.0, gen()).to_bytes(), p.to_bytes())
        with torch.no_grad():
            assert torch.equal(c.encode(x, gen()).to_bytes(), p.to_bytes())


def test_noncontiguous_input_and_out():
    m = torch.randn(30, 20, generator=gen())
    for spec in ("none", "topk:0.1", "sign", "qsgd:4"):
        c = make(spec)
        p = c.encode(m.t(), gen())
        assert torch.equal(p.to_bytes(), c.encode(m.t().contiguous(), gen()).to_bytes())
        out = torch.zeros(40, 30)[::2]  # not contiguous: the torch path
        assert not out.is_contiguous()
        assert torch.equal(c.decode(p, out=out), c.decode(p))


# ------------------------------------------------------------------ rand-k index cache
def test_randk_index_cache(monkeypatch):
    a = sample_distinct(2000, 20, 7)
    a[:] = 0  # the caller's copy: the cache is untouched
    assert torch.equal(sample_distinct(2000, 20, 7), torch.from_numpy(sparse._distinct_cached(2000, 20, 7)))
    monkeypatch.setattr(sparse, "_CACHE_KEYS", 4)  # evictions: every lookup still exact
    x = torch.randn(2000, generator=gen())
    c = make("randk:0.01")
    g = gen(11)
    payloads = [c.encode(x, g) for _ in range(10)]
    for p in payloads:
        q = make("randk:0.01").from_bytes(p.to_bytes(), x)
        assert torch.equal(make("randk:0.01").decode(q), c.decode(p))
    assert len(sparse._CACHE) <= 4


@pytest.mark.parametrize("layout", [None, Layout([(7,), (6, 5), (1,), (3, 3), (40, 50)])])
@pytest.mark.parametrize("spec", SPECS)
def test_every_byte_is_written(spec, layout, monkeypatch):
    """Stale memory in ``out=`` (or in the alignment gaps between per-tensor bodies) never
    reaches the wire: the bytes depend on the input alone."""
    x = torch.randn(2061 if layout is None else layout.numel, generator=gen(4))
    if spec == "topk:3" and layout is not None:
        spec = "topk:1"  # a tensor of one entry
    if spec.startswith("lowrank") and layout is None:
        x = x.view(3, 687)
    for use_numpy in (True, False):
        monkeypatch.setattr(dispatch, "NUMPY", use_numpy)
        got = []
        for fill in (0x00, 0xFF):
            c = make(spec, layout=layout)
            out = torch.full((c.max_nbytes(x) + 16,), fill, dtype=torch.uint8)
            got.append(c.encode(x, gen(), out=out).to_bytes().clone())
        assert torch.equal(got[0], got[1]), use_numpy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spec", ["qsgd:4", "qsgd:8", "qsgd:16", "lead:2", "natural"])
def test_chunked_encoders_match_torch(spec, dtype, monkeypatch):
    """The numpy encoders run in chunks (``quantize.CHUNK``): chunk borders never show."""
    from gossip.compress import quantize
    from gossip.rng import Stream

    monkeypatch.setattr(quantize, "CHUNK", 64)
    for d in (64, 65, 200, 1001):
        x = torch.randn(d, generator=gen(d), dtype=dtype)
        x[::7] = 0.0
        a, b = both_paths(lambda x=x, d=d: make(spec).encode(x, Stream(4, [d])).to_bytes(),
                          monkeypatch)
        assert torch.equal(a, b), d
