"""Compressors: round trips through bytes, honest sizes, NaN/Inf, determinism, per-compressor
properties (top-k sets and ties, rand-k index sets, sign, natural, low-rank), layouts."""

from __future__ import annotations

import math

import pytest
import torch

from gossip.compress import dispatch, make
from gossip.compress.sparse import sample_distinct
from gossip.errors import CompressionError
from gossip.layout import Layout
from gossip.rng import Stream

SEED = 1234

SPECS = [
    "none",
    "fp16",
    "bf16",
    "topk:0.1",
    "topk:3",
    "randk:0.25",
    "randk:0.25:unbiased",
    "sign",
    "qsgd:4",
    "qsgd:s=3",
    "qsgd:2:biased",
    "qsgd:12",  # 13-bit codes: the raw-low-byte + planes layout
    "qsgd:s=127",  # 8-bit codes: raw bytes
    "lead:2",
    "lead:8",  # 9-bit codes
    "natural",
    "lowrank:2",
    "vote",
    "vote:ties",
]
RANDOMIZED = {
    "randk:0.25",
    "randk:0.25:unbiased",
    "qsgd:4",
    "qsgd:s=3",
    "qsgd:2:biased",
    "qsgd:12",
    "qsgd:s=127",
    "lead:2",
    "lead:8",
    "natural",
}
SUMMED = {"sign", "lowrank:2"}  # a floating sum (‖x‖₁) or product on the wire
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def vectors(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = gen(7)
    return {
        "d1": torch.randn(1, generator=g, dtype=dtype),
        "d13": torch.randn(13, generator=g, dtype=dtype),
        "d1000": torch.randn(1000, generator=g, dtype=dtype),
        "zeros": torch.zeros(77, dtype=dtype),
        "const": torch.full((50,), -2.5, dtype=dtype),
        "signed_zeros": torch.tensor(
            [0.0, -0.0, 1.0, -1.0, -0.0, 3.0, 0.0, -2.0, 5.0], dtype=dtype
        ),
        "matrix": torch.randn(12, 9, generator=g, dtype=dtype),
        "conv": torch.randn(6, 3, 2, 2, generator=g, dtype=dtype),
    }


def width_of(s: int) -> int:
    return math.ceil(math.log2(2 * s + 1))


def expected_nbytes(spec: str, shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The honest wire size of docs/compressors.md plus our 8-byte header, per compressor."""
    d, isz, n8 = math.prod(shape), dtype.itemsize, -(-math.prod(shape) // 8)
    name, *args = spec.split(":")
    if name == "none":
        return 8 + isz * d
    if name in ("fp16", "bf16"):
        return 8 + 2 * d
    if name in ("topk", "randk"):
        a = args[0]
        k = int(a) if a.isdigit() else max(1, int(float(a) * d))
        if name == "randk":
            return 8 + 8 + isz * k  # seed + values
        if n8 < 4 * k:  # a bitmap when smaller than the indices
            return 8 + isz * k + n8
        return 8 + -(-isz * k // 4) * 4 + 4 * k  # int32 indices start 4-byte aligned
    if name == "sign":
        return 8 + isz + n8
    if name in ("qsgd", "lead"):
        s = int(args[0][2:]) if args[0].startswith("s=") else 1 << (int(args[0]) - 1)
        return 8 + isz + width_of(s) * n8
    if name == "natural":
        return 8 + d + n8
    if name == "vote":
        return 8 + n8 * (2 if args else 1)
    if name == "lowrank":
        if len(shape) <= 1:
            return 8 + isz * d
        m, k = shape[0], d // shape[0]
        r = min(int(args[0]), m, k)
        return 8 + isz * r * (m + k)
    raise AssertionError(spec)


def roundtrip(c, x, g=None):
    p = c.encode(x, g if g is not None else gen())
    return p, c.decode(p)


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", SPECS)
def test_roundtrip_bytes_and_sizes(spec, dtype):
    for name, x in vectors(dtype).items():
        if spec == "topk:3" and x.numel() < 3:
            continue
        c = make(spec)
        p, y = roundtrip(c, x)
        assert y.shape == x.shape and y.dtype == x.dtype, name
        buf = p.to_bytes()
        assert buf.dtype == torch.uint8 and buf.dim() == 1 and buf.is_contiguous()
        assert p.nbytes == buf.numel() == c.fixed_nbytes(x) == c.max_nbytes(x), name
        assert p.nbytes == expected_nbytes(spec, tuple(x.shape), dtype), (name, p.nbytes)
        # through a copy of the bytes, also at an odd offset of a larger buffer
        wide = torch.zeros(buf.numel() + 3, dtype=torch.uint8)
        wide[3:].copy_(buf)
        for received in (buf.clone(), wide[3:]):
            y2 = c.decode(c.from_bytes(received, like=torch.empty_like(x)))
            assert torch.equal(y2, y), name
        if name == "zeros" and spec != "vote":  # vote: sgn(0) = +1
            assert torch.equal(y, torch.zeros_like(x)), name


@pytest.mark.parametrize("spec", SPECS)
def test_decode_out_and_decode_add(spec):
    x = torch.randn(8, 25, generator=gen(3), dtype=torch.float64)
    c = make(spec)
    p = c.encode(x, gen())
    y = c.decode(p)
    out = torch.full_like(x, 7.0)
    assert c.decode(p, out=out) is out and torch.equal(out, y)
    flat = torch.empty(x.numel(), dtype=x.dtype)
    assert torch.equal(c.decode(p, out=flat).view_as(x), y)
    as32 = torch.empty(x.shape, dtype=torch.float32)  # another dtype: cast on the way out
    assert torch.equal(c.decode(p, out=as32), y.float())
    base = torch.randn(x.shape, generator=gen(4), dtype=x.dtype)
    acc = base.clone()
    assert c.decode_add_(acc, c.from_bytes(p.to_bytes(), x), -0.37) is acc
    torch.testing.assert_close(acc, base + (-0.37) * y, rtol=1e-12, atol=1e-12)
    with pytest.raises(CompressionError, match="entries"):
        c.decode(p, out=torch.empty(x.numel() + 1, dtype=x.dtype))


def test_sign_size_at_one_million():
    x = torch.randn(10**6, generator=gen())
    c = make("sign")
    p = c.encode(x)
    assert p.nbytes == 125_000 + 4 + 8 == c.fixed_nbytes(x)


def test_encode_into_preallocated_buffer():
    c = make("qsgd:4")
    x = torch.randn(1000, generator=gen())
    big = torch.empty(c.max_nbytes(x) + 64, dtype=torch.uint8)
    p = c.encode(x, gen(), out=big)
    assert p.buffer.data_ptr() == big.data_ptr() and p.nbytes == c.max_nbytes(x)
    assert torch.equal(p.to_bytes(), c.encode(x, gen()).to_bytes())
    with pytest.raises(CompressionError, match="needs"):
        c.encode(x, gen(), out=big[:10])
    with pytest.raises(CompressionError, match="multiple of 8"):
        c.encode(x, gen(), out=big[1:])


# ------------------------------------------------------------------- NaN / Inf / dtypes
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", SPECS)
def test_nonfinite_input_raises(spec, dtype):
    c = make(spec)
    for bad in (float("nan"), float("inf"), -float("inf")):
        for shape in ((37,), (6, 7)):
            x = torch.randn(shape, generator=gen(), dtype=dtype)
            x.view(-1)[5] = bad
            with pytest.raises(CompressionError, match="NaN/Inf"):
                c.encode(x, gen())


def test_nonfinite_check_can_be_disabled():
    c = make("sign")
    c.check_finite = False
    x = torch.ones(9)
    x[2] = float("nan")
    c.encode(x)  # no error: the caller opted out


def test_huge_finite_values():
    big = torch.tensor([3e38, -3e38, 1.0])
    for spec in ("none", "topk:1", "randk:2", "bf16", "lead:2"):  # no overflowing statistic
        c = make(spec)
        c.decode(c.encode(big, gen()))
    with pytest.raises(CompressionError, match="overflows"):
        make("sign").encode(big)  # ‖x‖₁ overflows float32: not reported as NaN
    with pytest.raises(CompressionError, match="range"):
        make("fp16").encode(torch.tensor([70000.0]))
    make("fp16").encode(torch.tensor([65504.0, -65519.0]))  # rounds to the max, not Inf
    with pytest.raises(CompressionError, match="2\\^127"):
        make("natural").encode(torch.tensor([2.0**127 * 1.5]), gen())
    y = make("natural").decode(make("natural").encode(torch.tensor([2.0**127, -1.0]), gen()))
    assert y.tolist() == [2.0**127, -1.0]


def test_dtype_and_empty_errors():
    with pytest.raises(CompressionError, match="dtypes"):
        make("sign").encode(torch.arange(5))
    with pytest.raises(CompressionError, match="dtypes"):
        make("natural").encode(torch.ones(4, dtype=torch.int32), gen())
    with pytest.raises(CompressionError, match="beyond float16's largest value"):
        make("natural").encode(torch.tensor([40000.0], dtype=torch.float16), gen())
    with pytest.raises(CompressionError, match="d/k = 1000 overflow float16 .*bfloat16"):
        make("randk:1:unbiased").encode(torch.full((1000,), 100.0, dtype=torch.float16), gen())
    big = torch.full((1000,), 100.0, dtype=torch.bfloat16)  # bfloat16 has float32's range
    assert make("randk:1:unbiased").decode(make("randk:1:unbiased").encode(big, gen())).max() == 1e5
    with pytest.raises(CompressionError, match="empty"):
        make("none").encode(torch.empty(0))
    half = torch.randn(10, generator=gen()).half()
    c = make("none")
    assert torch.equal(c.decode(c.from_bytes(c.encode(half).to_bytes(), half)), half)


# ---------------------------------------------------------------------- randomness
@pytest.mark.parametrize("spec", sorted(RANDOMIZED))
def test_generator_required_and_deterministic(spec):
    c = make(spec)
    x = torch.randn(300, generator=gen(5))
    with pytest.raises(CompressionError, match="Generator"):
        c.encode(x)
    a = c.encode(x, gen(11)).to_bytes()
    b = make(spec).encode(x, gen(11)).to_bytes()
    assert torch.equal(a, b)
    assert not torch.equal(a, c.encode(x, gen(12)).to_bytes())


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "topk:0.1", "sign"])
def test_deterministic_compressors_ignore_generator(spec):
    x = torch.randn(300, generator=gen(5))
    assert torch.equal(make(spec).encode(x).to_bytes(), make(spec).encode(x, gen(3)).to_bytes())


# -------------------------------------------------------------------------------- top-k
def _topk_set(x: torch.Tensor, k: int) -> set[int]:
    return set(torch.topk(x.abs(), k).indices.tolist())


@pytest.mark.parametrize(
    "d,ratio",
    [
        (50, 0.1),
        (1000, 0.01),
        (1000, 0.5),
        (5000, 0.01),
        (36_864, 0.01),
        (200_000, 0.01),
        (200_000, 0.001),
        (70_001, 0.1),
    ],
)
def test_topk_exact_set_and_idempotent(d, ratio):
    x = torch.randn(d, generator=gen(d))  # continuous: no ties
    c = make(f"topk:{ratio}")
    k = max(1, int(ratio * d))
    p = c.encode(x)
    y = c.decode(p)
    kept = set(torch.nonzero(y).view(-1).tolist())
    assert kept == _topk_set(x, k)
    assert torch.equal(y[list(kept)], x[list(kept)])
    assert torch.equal(c.decode(c.encode(y)), y)  # idempotent
    assert c.delta_for(d) == k / d
    assert (y - x).norm() ** 2 <= (1 - k / d) * x.norm() ** 2


def test_topk_ties_lowest_index():
    c = make("topk:5")
    assert torch.nonzero(c.decode(c.encode(torch.ones(20)))).view(-1).tolist() == [0, 1, 2, 3, 4]
    x = torch.tensor([1.0, -3.0, 2.0, 3.0, -2.0, 2.0, 2.0, 0.5])
    y = make("topk:4").decode(make("topk:4").encode(x))
    assert torch.nonzero(y).view(-1).tolist() == [1, 2, 3, 4]  # |3|,|3|, then first two |2|
    # the sampled-threshold path (d >= 4096) on heavy ties: constant and few distinct values
    big = torch.full((100_000,), 2.0)
    yb = make("topk:0.01").decode(make("topk:0.01").encode(big))
    assert torch.nonzero(yb).view(-1).tolist() == list(range(1000))
    steps = torch.arange(100_000) % 7 - 3.0  # values -3..3
    ys = make("topk:0.05").decode(make("topk:0.05").encode(steps))
    idx = torch.nonzero(ys).view(-1)
    expect = torch.nonzero(steps.abs() == 3).view(-1)[:5000]
    assert torch.equal(idx, expect)


def test_topk_adversarial_sample_falls_back(monkeypatch):
    # the largest entries sit exactly on the sample's stride: the sampled threshold is too high,
    # fewer than k candidates pass it, and selection falls back to all entries
    d = 1 << 17
    x = torch.randn(d, generator=gen()).abs()
    x[::8] += 100.0 + torch.arange(d // 8, dtype=torch.float32)
    c = make("topk:0.05")
    k = int(0.05 * d)
    calls = []
    real = torch.topk
    monkeypatch.setattr(
        torch, "topk", lambda a, kk, **kw: calls.append(a.numel()) or real(a, kk, **kw)
    )
    y = c.decode(c.encode(x))
    assert d in calls  # the full fallback ran
    assert set(torch.nonzero(y).view(-1).tolist()) == _topk_set(x, k)


def test_topk_torch_path_matches_numpy_path(monkeypatch):
    x = torch.randn(150_000, generator=gen(2))
    x[::1000] = 5.0  # some ties
    ref = [make(s).encode(x).to_bytes() for s in ("topk:0.01", "topk:0.2")]
    monkeypatch.setattr(dispatch, "NUMPY", False)
    got = [make(s).encode(x).to_bytes() for s in ("topk:0.01", "topk:0.2")]
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


def test_topk_index_formats():
    x = torch.randn(1000, generator=gen())
    c = make("topk:0.01")  # k = 10: 40 bytes of indices < 125 bytes of bitmap
    assert "index" in c.encode(x).parts and c.fixed_nbytes(x) == 8 + 40 + 40
    c = make("topk:0.2")  # k = 200: bitmap
    assert "bitmap" in c.encode(x).parts and c.fixed_nbytes(x) == 8 + 800 + 125


def test_k_larger_than_d():
    with pytest.raises(CompressionError, match=r"k = 10 exceeds .* d = 5"):
        make("topk:10").encode(torch.ones(5))
    with pytest.raises(CompressionError, match=r"k = 10 exceeds .* d = 5"):
        make("randk:10").max_nbytes(torch.ones(5))
    with pytest.raises(CompressionError, match=r"k = 4 exceeds .* d = 3"):
        make("topk:4", layout=Layout([(10,), (3,)]))


# -------------------------------------------------------------------------------- rand-k
@pytest.mark.parametrize(
    "n,k", [(10, 3), (10, 10), (5000, 50), (5000, 4000), (100_000, 1000), (3000, 1500), (1, 1)]
)
def test_sample_distinct_exact_and_deterministic(n, k):
    a = sample_distinct(n, k, 99)
    assert a.dtype == torch.int64 and a.numel() == k
    assert torch.equal(a, torch.unique(a)) and int(a.min()) >= 0 and int(a.max()) < n
    assert torch.equal(a, sample_distinct(n, k, 99))
    if 0 < k < n:
        assert not torch.equal(a, sample_distinct(n, k, 100))


def test_randk_receiver_regenerates_indices():
    x = torch.randn(5000, generator=gen())
    for spec in ("randk:0.01", "randk:0.9", "randk:0.01:unbiased"):
        c = make(spec)
        p = c.encode(x, gen(4))
        y = c.decode(p)
        q = make(spec).from_bytes(p.to_bytes().clone(), x)  # a fresh receiver
        assert "sel" not in q.parts
        assert torch.equal(make(spec).decode(q), y)
        k = max(1, int(float(spec.split(":")[1]) * 5000))
        assert int((y != 0).sum()) == k
        scale = 5000 / k if spec.endswith("unbiased") else 1.0
        nz = y != 0
        torch.testing.assert_close(y[nz], x[nz] * scale)


# ---------------------------------------------------------------------------------- sign
def test_sign_values_and_zero_convention():
    x = torch.tensor([0.0, -0.0, 2.0, -4.0, 0.0, 1e-40, -1e-40, -6.0, 3.0], dtype=torch.float64)
    y = make("sign").decode(make("sign").encode(x))
    s = float(x.abs().sum() / x.numel())
    assert y.tolist() == [s, s, s, -s, s, s, -s, -s, s]
    for shape in ((1000,), (8, 125)):
        x = torch.randn(shape, generator=gen())
        y = make("sign").decode(make("sign").encode(x))
        delta = float(x.abs().sum() ** 2 / (x.numel() * x.norm() ** 2))
        torch.testing.assert_close((y - x).norm() ** 2, (1 - delta) * x.norm() ** 2)


@pytest.mark.parametrize("spec", SPECS)
def test_torch_path_matches_numpy_path(spec, monkeypatch):
    """The device-agnostic torch kernels (used on CUDA) give the CPU fast path's bytes."""
    x = torch.randn(1001, generator=gen())
    x[::7] = -0.0
    x[::11] = 0.0
    ref = make(spec).encode(x, gen())
    ref_y = make(spec).decode(ref)
    monkeypatch.setattr(dispatch, "NUMPY", False)
    c = make(spec)
    got = c.encode(x, gen())
    assert torch.equal(ref.to_bytes(), got.to_bytes())
    assert torch.equal(c.decode(c.from_bytes(ref.to_bytes(), x)), ref_y)


def test_vote_values_zero_convention_and_corrupt_planes():
    x = torch.tensor([0.0, -0.0, 2.0, -4.0, 0.0, 1e-40, -1e-40, -6.0, 3.0], dtype=torch.float64)
    vote, ties = make("vote"), make("vote:ties")
    assert vote.decode(vote.encode(x)).tolist() == [1, 1, 1, -1, 1, 1, -1, -1, 1]
    y = ties.decode(ties.encode(x))
    assert y.tolist() == [0, 0, 1, -1, 0, 1, -1, -1, 1]
    assert not torch.signbit(y[:2]).any()  # a tie decodes to +0.0
    assert not vote.bounded_variance and not vote.unbiased and vote.delta_for(9) is None
    buf = ties.encode(x).to_bytes().clone()
    buf[8] |= 0x01  # entry 0: negative and zero at once
    with pytest.raises(CompressionError, match="both negative and zero"):
        ties.from_bytes(buf, x)
    with pytest.raises(CompressionError, match="zero plane flag"):  # the header tells them apart
        vote.from_bytes(ties.encode(x).to_bytes(), x)
    with pytest.raises(CompressionError, match="only ':ties'"):
        make("vote:2")


# ------------------------------------------------------------------------ quantizers
@pytest.mark.parametrize("spec,s", [("qsgd:4", 8), ("qsgd:s=3", 3), ("lead:2", 2), ("lead:8", 128)])
def test_levels_are_on_the_grid(spec, s):
    x = torch.randn(999, generator=gen(), dtype=torch.float64)
    c = make(spec)
    y = c.decode(c.encode(x, gen()))
    norm = x.abs().max() if spec.startswith("lead") else x.norm()
    levels = y / norm * s
    torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-9)
    assert float(levels.abs().max()) <= s + 1e-9
    # each entry is rounded to one of its two neighbouring levels
    assert float(((x / norm * s) - levels).abs().max()) < 1 + 1e-9
    if spec.startswith("lead"):  # the largest entry is sent exactly
        i = int(x.abs().argmax())
        assert float(y[i]) == float(x[i])


def test_natural_powers_of_two():
    x = (
        torch.randn(2000, generator=gen(), dtype=torch.float64)
        * 10.0 ** torch.randint(-30, 30, (2000,), generator=gen()).double()
    )
    x[:5] = torch.tensor([0.0, -0.0, 1.0, -(2.0**-130), 2.0**-126], dtype=torch.float64)
    half = torch.randn(2000, generator=gen(), dtype=torch.float64) * 10.0 ** torch.randint(
        -3, 4, (2000,), generator=gen()).double()  # float16's normal range
    half[:3] = x[:3]
    for dtype in DTYPES:
        xd = (x if dtype.itemsize > 2 else half).to(dtype)
        y = make("natural").decode(make("natural").encode(xd, gen()))
        assert y.dtype == dtype
        nz = xd != 0
        lo = torch.exp2(torch.floor(torch.log2(xd[nz].double().abs()))).to(dtype)
        ok = (y[nz].abs() == lo) | (y[nz].abs() == 2 * lo)
        tiny = xd[nz].abs() < 2.0**-126  # unbiased rounding to 0 or 2^-126 down there
        assert bool((ok | tiny).all())
        assert bool(((y[nz] == 0) | (torch.sign(y[nz]) == torch.sign(xd[nz]))).all())
        assert bool((y[~nz] == 0).all())
        assert y[2] == 1.0


def test_qsgd_biased_is_scaled():
    x = torch.randn(500, generator=gen(), dtype=torch.float64)
    c, u = make("qsgd:2:biased"), make("qsgd:2")
    w = u.omega_for(500)
    assert c.delta_for(500) == pytest.approx(1 / (1 + w)) and not c.unbiased and u.unbiased
    torch.testing.assert_close(c.decode(c.encode(x, gen())), u.decode(u.encode(x, gen())) / (1 + w))


# --------------------------------------------------------------------------- low-rank
# float32: Gram–Schmidt's rounding depends on the conditioning of the drawn Q (5e-5: the
# counter-based draws of gossip.rng give 1.5e-5 on the (5, 50) case)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("shape,r", [((40, 30), 2), ((30, 8, 2, 2), 3), ((5, 50), 5)])
def test_lowrank_exact_on_low_rank(shape, r, dtype, tol):
    g = gen()
    m = shape[0]
    k = math.prod(shape) // m
    M = torch.randn(m, r, generator=g, dtype=dtype) @ torch.randn(r, k, generator=g, dtype=dtype)
    T = M.reshape(shape)
    c = make(f"lowrank:{r}")
    for step in range(3):
        y = c.decode(c.from_bytes(c.encode(T, g).to_bytes(), T))
        err = float((y - T).norm() / T.norm())
        if step >= 1:
            assert err < tol, (step, err)


def test_lowrank_warm_start_converges_and_state():
    g = gen()
    U, _ = torch.linalg.qr(torch.randn(60, 60, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(50, 50, generator=g, dtype=torch.float64))
    s = torch.tensor([10.0, 5.0] + [0.5**i for i in range(1, 49)], dtype=torch.float64)
    M = U[:, :50] @ torch.diag(s) @ V.T
    c = make("lowrank:2")
    errs = [float((c.decode(c.encode(M, g)) - M).norm()) for _ in range(8)]
    best = float(s[2:].norm())  # the rank-2 SVD error
    assert errs[-1] < errs[0] and errs[-1] < best * 1.01
    c2 = make("lowrank:2")
    c2.load_state_dict(c.state_dict())
    assert torch.equal(c2.encode(M).to_bytes(), c.encode(M).to_bytes())  # no generator needed
    c.reset()
    with pytest.raises(CompressionError, match="Generator"):
        c.encode(M)


def test_lowrank_zero_matrix_recovers():
    g = gen()
    c = make("lowrank:1")
    Z = torch.zeros(10, 8)
    assert torch.equal(c.decode(c.encode(Z, g)), Z)
    M = torch.outer(torch.arange(1.0, 11.0), torch.ones(8))
    c.encode(M, g)  # the collapsed factor is redrawn from g
    y = c.decode(c.encode(M, g))
    assert float((y - M).norm() / M.norm()) < 1e-5


def test_lowrank_vectors_raw_and_rank_clipped():
    c = make("lowrank:4")
    v = torch.randn(17, generator=gen())
    assert torch.equal(c.decode(c.encode(v)), v)
    M = torch.randn(3, 20, generator=gen())
    p = c.encode(M, gen())
    assert p.nbytes == 8 + 4 * 3 * (3 + 20)  # rank min(4, 3, 20) = 3
    torch.testing.assert_close(c.decode(p), M)  # full rank: exact


# ------------------------------------------------------------------------------ layout
SHAPES = [(6, 5), (7,), (3, 2, 2), (1,), (4, 4)]


@pytest.mark.parametrize("spec", SPECS)
def test_per_tensor_layout(spec):
    if spec == "topk:3":
        spec = "topk:1"
    layout = Layout(SHAPES)
    x = torch.randn(layout.numel, generator=gen(9), dtype=torch.float64)
    c = make(spec, layout=layout)
    p = c.encode(x, Stream(1, [0]))
    y = c.decode(p)
    # the same as compressing each tensor alone with the same stream (one call per tensor)
    g = Stream(1, [0])
    singles = [make(spec) for _ in SHAPES]
    expect = torch.cat(
        [s.decode(s.encode(v, g)).view(-1) for s, v in zip(singles, layout.views(x), strict=True)]
    )
    assert torch.equal(y, expect)
    if type(c).layout_free:  # entry-wise: the flat vector's one message, the same values
        assert p.nbytes == expected_nbytes(spec, (layout.numel,), x.dtype) == c.fixed_nbytes(x)
    else:  # size: one header, bodies aligned to 8
        sizes = [expected_nbytes(spec, sh, x.dtype) - 8 for sh in SHAPES]
        pos = 8
        for n in sizes:
            pos = -(-pos // 8) * 8 + n
        assert p.nbytes == pos == c.fixed_nbytes(x)
    q = c.from_bytes(p.to_bytes().clone(), torch.empty_like(x))
    assert torch.equal(c.decode(q), y)
    acc = torch.ones_like(x)
    c.decode_add_(acc, q, 2.0)
    torch.testing.assert_close(acc, 1 + 2 * y, rtol=1e-12, atol=1e-12)
    if not type(c).layout_free:
        with pytest.raises(CompressionError, match="layout"):
            c.encode(torch.randn(layout.numel + 1, dtype=torch.float64), gen())


def test_per_tensor_constants_and_lowrank_views():
    layout = Layout([(20, 10), (50,), (3, 3)])
    assert make("topk:0.1", layout=layout).delta == pytest.approx(min(20 / 200, 5 / 50, 1 / 9))
    c = make("qsgd:2", layout=layout)
    assert c.unbiased and c.omega == pytest.approx(min(200 / 4, math.sqrt(200) / 2))
    assert make("sign", layout=layout).delta == pytest.approx(1 / 200)
    assert make("natural", layout=layout).omega == 0.125
    lr = make("lowrank:1", layout=layout)
    x = torch.randn(layout.numel, generator=gen())
    p = lr.encode(x, gen())
    assert p.nbytes == 8 + 4 * (20 + 10) + 4 * 50 + 4 * (3 + 3) + 0  # 120, 200, 24: aligned
    y = lr.decode(p)
    assert torch.equal(y[200:250], x[200:250])  # the vector is sent raw
    assert len({id(c) for c in lr.inners}) == 3  # stateful: one instance per tensor


def test_per_tensor_rejects_other_layout_messages():
    a = make("sign", layout=Layout([(10,), (6,)]))
    b = make("sign", layout=Layout([(16,)]))
    x = torch.randn(16, generator=gen())
    with pytest.raises(CompressionError):
        b.from_bytes(a.encode(x).to_bytes(), x)
    with pytest.raises(CompressionError, match="per tensor"):
        make("sign").from_bytes(a.encode(x).to_bytes(), x)


# --------------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", SPECS)
def test_cuda_roundtrip(spec):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(SEED)
    x = torch.randn(40, 30, device=dev, generator=g)
    c = make(spec)
    p = c.encode(x, g)
    assert p.buffer.device.type == "cuda"
    y = c.decode(p)
    assert y.device.type == "cuda"
    assert torch.equal(c.decode(c.from_bytes(p.to_bytes().cpu(), x)), y)
    on_cpu = make(spec).encode(x.cpu())
    if spec in SUMMED:  # the scale on the wire is a sum, rounded in the device's order
        assert torch.allclose(make(spec).decode(on_cpu), y.cpu(), rtol=1e-5, atol=0)
    elif spec not in RANDOMIZED:  # no floating reduction reaches the wire: the CPU's bytes
        assert torch.equal(p.to_bytes().cpu(), on_cpu.to_bytes())
    if spec in RANDOMIZED:
        with pytest.raises(CompressionError, match="device"):
            c.encode(x, gen())
