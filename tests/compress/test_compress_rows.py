"""Blocks of nodes: ``encode_rows`` / ``decode_add_rows_`` against the per-row ``encode`` /
``decode_add_`` of every registered compressor, bit for bit (both CPU paths, padded views,
per-row weights, ``rows=`` permutations, ties, errors that name the row)."""

from __future__ import annotations

import pytest
import torch

from gossip.compress import dispatch, make, reference_kernels
from gossip.compress.base import row_stride
from gossip.errors import CompressionError
from tests.helpers.compressor_specs import concrete_specs

try:
    from gossip.rng import Stream
except ImportError:  # the per-node streams land with the randomized block methods
    Stream = None

SEED = 1234


SPECS = concrete_specs()
VECTORIZED = ["none", "fp16", "bf16", "topk:0.1", "topk:3", "topk:0.5", "sign", "sign_l2"]
#: randomized specs whose ``decode_add_rows_`` is vectorized (``encode_rows``: one batched draw)
VECTORIZED_DECODE = ["qsgd:4", "qsgd:2:biased", "qsgd:8", "qsgd:16", "lead:2", "natural", "randk:0.1",
                     "randk:0.1:unbiased"]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def streams(c, m):
    if not c.randomized:
        return None, None
    if Stream is None:
        pytest.skip("randomized compressors need gossip.rng.Stream (not in this checkout yet)")
    return Stream(SEED, list(range(m))), Stream(SEED, list(range(m)))


def bitwise(a: torch.Tensor) -> torch.Tensor:
    return a.contiguous().view(torch.uint8)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bitwise(a), bitwise(b))


def blocks(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    padded = torch.randn(5, 1003, generator=g, dtype=dtype)
    ties = torch.randint(-3, 4, (6, 200), generator=g).to(dtype)
    ties[1] = 0.0
    ties[2, ::2] = -0.0
    return {
        "1x1": torch.randn(1, 1, generator=g, dtype=dtype),
        "3x13": torch.randn(3, 13, generator=g, dtype=dtype),
        "4x1000": torch.randn(4, 1000, generator=g, dtype=dtype)  # float16: randk's d/k fits
        * torch.tensor([[1.0], [1e3 if dtype != torch.float16 else 30.0], [1e-3], [7.0]], dtype=dtype),
        "padded": padded[:, :1000],  # non-contiguous rows of a padded tensor
        "ties": ties,
        "5000": torch.randn(3, 5000, generator=g, dtype=dtype),
    }


def too_small(spec: str, block: str) -> bool:
    """A k-sparse spec with k = 3 (or a ratio of one entry) cannot compress a 1-entry row."""
    return block == "1x1" and spec.split(":")[0] in ("topk", "randk")


def per_row_bytes(c, X, rng=None) -> torch.Tensor:
    return torch.stack([c.encode(X[r], rng.row(r) if rng is not None else None).to_bytes()
                        for r in range(X.shape[0])])


def run_rows(c, X):
    ours, ref = streams(c, X.shape[0])
    if c.stateful:
        with pytest.raises(CompressionError, match="per node"):
            c.encode_rows(X, ours)
        pytest.skip("stateful: refuses blocks")
    block = c.encode_rows(X, ours)
    return block, per_row_bytes(make(c.spec), X, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", SPECS)
def test_encode_rows_equals_encode(spec, dtype):
    c = make(spec)
    for name, X in blocks(dtype).items():
        try:
            c.encode(X[0])
        except CompressionError:
            continue  # e.g. topk:3 on d = 1
        except Exception:  # noqa: BLE001 - randomized without a generator
            if not c.randomized:
                raise
        block, ref = run_rows(c, X)
        assert block.dtype == torch.uint8 and block.shape == ref.shape, name
        assert block.stride(0) % 8 == 0 and block.storage_offset() % 8 == 0, name
        assert torch.equal(block, ref), (spec, name)
        assert c.nbytes_rows(X[0]) == block.shape[1]


def decode_case(spec, dtype, X, weight, rows_perm, out_kind):
    c = make(spec)
    block, ref_block = run_rows(c, X)
    m, d = X.shape
    M = m + 2 if rows_perm else m
    g = torch.Generator().manual_seed(11)
    base = torch.randn(M, 2 * d + 8, generator=g, dtype=dtype)
    view = {"contiguous": lambda t: t[:, :d].contiguous(), "padded": lambda t: t[:, :d],
            "strided": lambda t: t[:, : 2 * d : 2]}[out_kind]
    rows = torch.randperm(M, generator=g)[:m] if rows_perm else None
    targets = rows.tolist() if rows is not None else list(range(m))
    w = weight if not isinstance(weight, torch.Tensor) else weight[:m]
    ref_base = base.clone()
    ref_out = view(ref_base)
    dec = make(spec)
    for r, t in enumerate(targets):
        p = dec.from_bytes(ref_block[r], ref_out[t])
        dec.decode_add_(ref_out[t], p, float(w[r]) if isinstance(w, torch.Tensor) else w)
    got_base = base.clone()
    c.decode_add_rows_(view(got_base), block, w, rows=rows)
    assert same(got_base, ref_base), (spec, dtype, out_kind, rows_perm)


WEIGHTS = torch.tensor([1.0, 0.3, -0.7, 1 / 3, 2.5, 1e-3], dtype=torch.float64)


@pytest.mark.parametrize("numpy_path", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", SPECS)
def test_decode_add_rows_equals_decode_add(spec, dtype, numpy_path, monkeypatch):
    monkeypatch.setattr(dispatch, "NUMPY", numpy_path)
    c = make(spec)
    if c.stateful:
        pytest.skip("stateful: refuses blocks")
    for name, X in blocks(dtype).items():
        if too_small(spec, name):
            continue
        for weight, perm, kind in ((1.0, False, "contiguous"), (WEIGHTS, False, "padded"),
                                   (WEIGHTS, True, "contiguous"), (0.25, True, "strided")):
            decode_case(spec, dtype, X, weight, perm, kind)


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "sign"])
def test_weights_as_float32_tensor(spec):
    X = blocks(torch.float32)["4x1000"]
    decode_case(spec, torch.float32, X, WEIGHTS.float(), False, "contiguous")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_identity_half_precision(dtype):
    X = blocks(torch.float32)["4x1000"].to(dtype)
    block, ref = run_rows(make("none"), X)
    assert torch.equal(block, ref)
    decode_case("none", dtype, X, WEIGHTS, True, "contiguous")
    decode_case("none", dtype, X, 1.0, False, "padded")


@pytest.mark.parametrize("spec", ["sign", "sign_l2"])
def test_sign_large_rows_and_threads(spec, monkeypatch):
    """Rows beyond the table-decode size (the fused add on the numpy path) and beyond torch's
    grain size with two threads (a row alone then reduces in another order)."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, (1 << 18) + 13, generator=g)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            block, ref = run_rows(make(spec), X)
            assert torch.equal(block, ref), threads
            decode_case(spec, torch.float32, X, WEIGHTS, False, "contiguous")
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("d", [64, 200, 4097, 9000])
def test_topk_ties_many(d):
    """Integer rows with heavy ties at the threshold, all-zero rows, one distinct value."""
    g = torch.Generator().manual_seed(d)
    X = torch.randint(-2, 3, (7, d), generator=g).float()
    X[3] = 0.0
    X[4] = -1.0
    X[5, : d // 2] = 5.0
    for spec in ("topk:0.01", "topk:0.1", "topk:0.5", "topk:1.0", f"topk:{d - 1}", "topk:1"):
        c = make(spec)
        block = c.encode_rows(X)
        assert torch.equal(block, per_row_bytes(make(spec), X)), spec


def test_encode_rows_reuses_out():
    X = blocks(torch.float32)["4x1000"]
    c = make("topk:0.1")
    n = c.nbytes_rows(X[0])
    out = torch.zeros(6, row_stride(n) + 8, dtype=torch.uint8)
    block = c.encode_rows(X, out=out)
    assert block.data_ptr() == out.data_ptr()
    assert torch.equal(out[:4, :n], per_row_bytes(c, X))


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("lowrank")])
def test_nan_row_names_the_row(spec):
    c = make(spec)
    X = blocks(torch.float32)["4x1000"].clone()
    X[2, 17] = float("nan")
    ours, _ = streams(c, 4)
    with pytest.raises(CompressionError, match="NaN/Inf") as info:
        c.encode_rows(X, ours)
    assert info.value.row == 2
    X[2, 17] = 0.0
    X[1, 3] = float("inf")
    ours, _ = streams(c, 4)
    with pytest.raises(CompressionError) as info:
        c.encode_rows(X, ours)
    assert info.value.row == 1


@pytest.mark.parametrize("spec", ["fp16", "bf16"])
def test_cast_out_of_range_names_the_row(spec):
    X = torch.ones(3, 10)
    X[1, 4] = 100.0 if spec == "fp16" else 3.4e38
    X[2, 4] = 1e5 if spec == "fp16" else 3.4e38
    with pytest.raises(CompressionError, match="range") as info:
        make(spec).encode_rows(X)
    assert info.value.row == (2 if spec == "fp16" else 1)


def expect_row_error(c, out, block, row, match=None, rows=None):
    single = None
    target = rows[row] if rows is not None else row
    try:
        c.from_bytes(block[row].clone(), out[target])
    except CompressionError as exc:
        single = str(exc)
    before = out.clone()
    with pytest.raises(CompressionError, match=match) as info:
        c.decode_add_rows_(out, block, 0.5, rows=rows)
    assert info.value.row == row
    if single is not None:
        assert str(info.value) == single
    return before


@pytest.mark.parametrize("numpy_path", [True, False])
@pytest.mark.parametrize("spec", VECTORIZED + ["qsgd:4", "lead:2", "natural"])
def test_corrupt_rows_name_the_first_bad_row(spec, numpy_path, monkeypatch):
    monkeypatch.setattr(dispatch, "NUMPY", numpy_path)
    c = make(spec)
    X = blocks(torch.float32)["4x1000"]
    ours, _ = streams(c, 4)
    block = c.encode_rows(X, ours)
    out = torch.zeros(4, 1000)
    bad = block.clone()
    bad[3, 0] ^= 0xFF  # magic
    bad[2, 2] ^= 0x01  # kind
    expect_row_error(c, out, bad, 2, "compressor")
    expect_row_error(c, out, bad, 2, rows=torch.tensor([1, 0, 3, 2]))
    bad = block.clone()
    bad[1, 4] ^= 0x01  # numel
    expect_row_error(c, out, bad, 1, "entries")
    with pytest.raises(CompressionError) as info:  # wrong size: every row, the first named
        c.decode_add_rows_(out, block[:, :-1])
    assert info.value.row == 0
    if spec.startswith(("qsgd", "lead")):  # codes outside the levels; a negative step
        bad = block.clone()
        for j in range(c.width):  # entries 0..7 get the code 2^w − 1 > o + s in every plane
            bad[2, 12 + j * 125] = 0xFF
        bad[3, 8:12].copy_(torch.tensor([-1.0]).view(torch.uint8))
        expect_row_error(c, out, bad, 2, "outside")
        bad[2] = block[2]
        expect_row_error(c, out, bad, 3, "negative")
        return
    if spec == "natural":
        bad = block.clone()
        bad[3, 9] = 255
        bad[2, 500] = 255
        expect_row_error(c, out, bad, 2, "255")
        return
    # a NaN in row 1's first floating value (values or scale right after the header)
    bad = block.clone()
    dt = torch.float32
    bad[1, 8:12].copy_(torch.tensor([float("nan")], dtype=dt).view(torch.uint8))
    if spec in ("fp16", "bf16"):
        half = torch.float16 if spec == "fp16" else torch.bfloat16
        bad[1, 8:10].copy_(torch.tensor([float("nan")], dtype=half).view(torch.uint8))
    bad[3, 0] ^= 0xFF
    expect_row_error(c, out, bad, 1, "NaN/Inf")
    if spec == "sign":
        bad = block.clone()
        bad[2, 8:12].copy_(torch.tensor([-1.0]).view(torch.uint8))
        expect_row_error(c, out, bad, 2, "negative")


@pytest.mark.parametrize("numpy_path", [True, False])
def test_topk_corrupt_indices_and_bitmaps(numpy_path, monkeypatch):
    monkeypatch.setattr(dispatch, "NUMPY", numpy_path)
    X = blocks(torch.float32)["4x1000"]
    out = torch.zeros(4, 1000)
    c = make("topk:0.01")  # int32 indices
    block = c.encode_rows(X)
    k = 10
    off = 8 + 4 * k
    idx = lambda b, r: b[r, off : off + 4 * k].view(torch.int32)  # noqa: E731
    bad = block.clone()
    idx(bad, 2)[3] = 1000
    expect_row_error(c, out, bad, 2, "out of range")
    bad = block.clone()
    idx(bad, 1)[4] = idx(bad, 1)[3]
    idx(bad, 3)[0] = -1
    expect_row_error(c, out, bad, 1, "increasing")
    c = make("topk:0.5")  # bitmap
    block = c.encode_rows(X)
    bad = block.clone()
    bad[3, -1] ^= 0x01
    expect_row_error(c, out, bad, 3, "set bits")
    Y = blocks(torch.float32)["3x13"]
    c = make("topk:0.5")
    block = c.encode_rows(Y)
    bad = block.clone()
    bad[1, -1] |= 0x80  # past d = 13, and one bit too many
    expect_row_error(c, torch.zeros(3, 13), bad, 1)


@pytest.mark.parametrize("numpy_path", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_duplicate_rows_add_in_order(dtype, numpy_path, monkeypatch):
    monkeypatch.setattr(dispatch, "NUMPY", numpy_path)
    X = blocks(dtype)["4x1000"]
    for spec in ("none", "sign", "topk:0.1", "qsgd:4", "lead:2", "natural"):
        c = make(spec)
        block = c.encode_rows(X, Stream(SEED, range(4)) if c.randomized else None)
        for check in (True, False):
            if not check and not c.ordered_rows:
                continue
            for kind in ("contiguous", "strided"):
                base = torch.randn(2, 2000, dtype=dtype)
                view = (lambda t: t[:, :1000].contiguous()) if kind == "contiguous" else (
                    lambda t: t[:, ::2])
                out, ref = view(base), view(base.clone())
                rows = torch.tensor([1, 0, 1, 1])
                for r, t in enumerate(rows.tolist()):
                    c.decode_add_(ref[t], c.from_bytes(block[r], ref[t]), WEIGHTS[r].item())
                c.decode_add_rows_(out, block, WEIGHTS[:4], rows=rows, check=check)
                assert same(out, ref), (spec, check, kind)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", VECTORIZED)
def test_cuda_rows_equal_single_messages(spec, dtype):
    dev = torch.device("cuda")
    for name, X in blocks(dtype).items():
        if too_small(spec, name):
            continue
        X = X.to(dev)
        c = make(spec)
        block = c.encode_rows(X)
        assert torch.equal(block, per_row_bytes(make(spec), X)), (spec, name)
        m, d = X.shape
        out = torch.randn(m, d, dtype=dtype, device=dev)
        ref = out.clone()
        w = WEIGHTS[:m].tolist() if m <= 6 else [0.5] * m
        for r in range(m):
            c.decode_add_(ref[r], c.from_bytes(block[r], ref[r]), w[r])
        c.decode_add_rows_(out, block, torch.tensor(w[:m], dtype=torch.float64))
        assert same(out, ref), (spec, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", VECTORIZED + VECTORIZED_DECODE)
def test_vectorized_specs_never_loop(spec, dtype, monkeypatch):
    """The overrides serve these blocks themselves (the default loop is never entered): in
    every dtype for the dense ones, in float32/float64 for the others (half-precision models
    take the reference, row by row)."""
    if dtype not in make(spec).fast_dtypes:
        pytest.skip(f"{spec}'s block kernels serve float32/float64")
    from gossip.compress.base import Compressor

    def loop(*args, **kwargs):
        raise AssertionError("fell back to the per-row loop")

    monkeypatch.setattr(Compressor, "encode_rows", loop)
    monkeypatch.setattr(Compressor, "decode_add_rows_", loop)
    for name, X in blocks(dtype).items():
        if too_small(spec, name) or not dispatch.batch_encode(X):  # a single row: the loop's job
            continue
        decode_case(spec, dtype, X, WEIGHTS, True, "padded")
        decode_case(spec, dtype, X, 1.0, False, "contiguous")


LOOPED = ["topk:0.01", "topk:3", "sign", "sign_l2"]


@pytest.mark.parametrize("spec", LOOPED)
@pytest.mark.parametrize("shape", [(1, 5000), (3, dispatch.LOOP_FROM), (2, dispatch.LOOP_FROM + 77)])
def test_single_and_long_rows_encode_one_by_one(spec, shape, monkeypatch):
    """On CPU a single row, or rows of at least LOOP_FROM entries, go through the per-row
    single-message encoder, straight into the block's rows, with the batched path's bytes."""
    g = torch.Generator().manual_seed(5)
    X = torch.randn(*shape, generator=g)
    X[-1, 100:140] = 0.5  # ties at the threshold of top-k
    c = make(spec)
    out = torch.empty((shape[0], row_stride(c.nbytes_rows(X[0]))), dtype=torch.uint8)
    calls = []
    single = type(c).encode

    def counted(self, x, generator=None, *, out=None):
        calls.append(out is not None)
        return single(self, x, generator, out=out)

    monkeypatch.setattr(type(c), "encode", counted)
    block = c.encode_rows(X, out=out)
    assert calls == [True] * shape[0]  # one call per row, each into its row of ``out``
    assert block.data_ptr() == out.data_ptr()
    monkeypatch.setattr(dispatch, "LOOP_FROM", 1 << 40)
    calls.clear()
    if shape[0] > 1:  # the batched torch ops give the same bytes
        assert torch.equal(make(spec).encode_rows(X), block)
        assert calls == []
    assert torch.equal(per_row_bytes(make(spec), X), block)


def test_finite_rows_whose_sum_overflows_are_accepted():
    X = torch.tensor([[1e308, 1e308, -1.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    c = make("none")
    block = c.encode_rows(X)
    assert torch.equal(block, per_row_bytes(c, X))
    decode_case("none", torch.float64, X, WEIGHTS, False, "contiguous")


@pytest.mark.parametrize("d", [70_001, 300_007])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_long_rows_add_in_chunks_bit_for_bit(dtype, d):
    """Rows of 2^15 entries or more are multiplied and added a chunk (2^17) at a time (one
    short chunk, or several and a tail); repeated targets add in row order, as the per-row
    loop does."""
    g = torch.Generator().manual_seed(9)
    X = torch.randn(3, d, generator=g, dtype=dtype)
    c = make("none")
    block = c.encode_rows(X)
    w = torch.tensor([0.3, -1.7, 0.25], dtype=torch.float64)
    rows = torch.tensor([1, 0, 1])
    out = torch.randn(2, d, generator=g, dtype=dtype)
    ref = out.clone()
    for r in range(3):
        c.decode_add_(ref[int(rows[r])], c.from_bytes(block[r], ref[0]), float(w[r]))
    c.decode_add_rows_(out, block, w, rows=rows, check=False)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "sign", "sign_l2", "qsgd:4", "lead:2",
                                  "natural", "topk:0.01"])
@pytest.mark.parametrize("out_kind", ["contiguous", "strided"])
def test_long_rows_into_a_repeated_target_decode_as_single_messages(spec, out_kind):
    """Rows longer than LOOP_FROM (and than sign's table limit) decoded into one target row,
    as under MPI with one node per rank: in place row after row, the single messages' bits."""
    d = (1 << 18) + 13
    g = torch.Generator().manual_seed(3)
    X = torch.randn(3, d, generator=g)
    c = make(spec)
    ours, ref_rng = streams(c, 3)
    block = c.encode_rows(X, ours)
    base = torch.randn(2, 2 * d, generator=g)
    view = (lambda t: t[:, :d].contiguous()) if out_kind == "contiguous" else (lambda t: t[:, ::2])
    got, ref = view(base.clone()), view(base.clone())
    targets, w = [0, 0, 1], WEIGHTS[1:4]
    for r, t in enumerate(targets):
        c.decode_add_(ref[t], c.from_bytes(block[r], ref[t]), float(w[r]))
    c.decode_add_rows_(got, block, w, rows=torch.tensor(targets))
    assert same(got, ref), (spec, out_kind)


@pytest.mark.parametrize("numba", [True, False])
@pytest.mark.parametrize("spec", ["sign", "qsgd:4", "qsgd:16", "lead:2", "topk:0.01", "topk:0.05"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d", [1 << 15, (1 << 15) + 3, (1 << 18) + 5, 300_017])
def test_long_rows_add_as_each_message(spec, d, dtype, numba, monkeypatch):
    """Long rows decode-add row by row (sign: ``sign_add`` or the chunked table; the
    quantizers: ``level_add`` or ``LevelQuantizer._add_codes_chunked``; top-k: a gather-add-
    scatter per row, int32 indices or a bitmap), bit for bit the single-message
    ``decode_add_`` of each row (sign: on both sides of its rounding switch at 2^18), with
    float and per-row weights, a repeated target adding in row order."""
    monkeypatch.setattr(dispatch, "JIT", numba)
    c = make(spec)
    g = torch.Generator().manual_seed(d)
    X = torch.randn(3, d, generator=g, dtype=dtype)
    block = c.encode_rows(X, Stream(SEED, [0, 1, 2]) if c.randomized else None)
    for weight in (1.0, 0.37, torch.rand(3, generator=g)):
        for rows in (None, torch.tensor([1, 0, 1])):
            start = torch.randn(3, d, generator=g, dtype=dtype)
            got = c.decode_add_rows_(start.clone(), block, weight, rows=rows)
            want = start.clone()
            ws = weight.tolist() if isinstance(weight, torch.Tensor) else [weight] * 3
            for r, t in enumerate(range(3) if rows is None else rows.tolist()):
                c.decode_add_(want[t], c.from_bytes(block[r], want[t]), ws[r])
            assert torch.equal(got, want)


@pytest.mark.parametrize("spec", ["topk:0.01", "topk:0.5", "qsgd:4", "lead:2"])
def test_the_reference_refuses_what_only_the_row_length_tells(spec):
    """Index ranges, a bitmap's tail and the codes of the first d entries depend on the row's
    length d, which the bodies do not say: the batch form's check gets it, so the reference
    (``check_rows`` and ``decode_add_rows_`` under ``reference_kernels``) refuses the row the
    kernels refuse, with the single message's error."""
    X = blocks(torch.float32)["3x13"] if spec == "topk:0.5" else blocks(torch.float32)["4x1000"]
    c = make(spec)
    ours, _ = streams(c, X.shape[0])
    block = c.encode_rows(X, ours)
    bad = block.clone()
    if spec == "topk:0.01":  # an index past d = 1000
        bad[2, 8 + 40 + 4 * 9 : 8 + 40 + 4 * 10].copy_(torch.tensor([1000], dtype=torch.int32).view(torch.uint8))
        row, match = 2, "out of range"
    elif spec == "topk:0.5":  # a bit past d = 13 instead of one below it
        first = int(bad[1, -2])
        bad[1, -2] = first & (first - 1)  # clear the lowest set bit of the first byte
        bad[1, -1] |= 0x80
        row, match = 1, "past d"
    else:  # entry 999 (the last) gets the code 2^w - 1 > o + s in every plane
        n8 = 125
        for j in range(c.width):
            bad[1, 12 + j * n8 + n8 - 1] |= 0x80  # codes after the header and the step
        row, match = 1, "outside"
    out = torch.zeros(X.shape)
    with reference_kernels():
        with pytest.raises(CompressionError, match=match) as info:
            make(spec).check_rows(bad, X[0])
        assert info.value.row == row
        expect_row_error(make(spec), out, bad, row, match)
