"""Every registered compressor's fast kernels against its reference, property-based.

A compressor's reference is the code its author wrote (the batch form, or the per-tensor
torch hooks with blocks as a loop over rows); its fast kernels (numpy twins, block kernels)
are optional and registered per compressor. :func:`gossip.compress.reference_kernels`
switches every kernel off, so one generic test compares them: the same bytes for every row
and single message, the same decoded values, the weighted adds of a block (repeated targets
included) up to the rounding of ``w·C(q)``, and the same refused row.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gossip.compress import make, reference_kernels
from gossip.compress.wire import HEADER_NBYTES
from gossip.errors import CompressionError
from gossip.rng import Stream
from tests.helpers.compressor_specs import concrete_specs

#: every registered form, and the batch-form example of docs/extending.md
SPECS = concrete_specs() + ["examples.my_parts:StochasticInt8"]
STATELESS = [s for s in SPECS if not make(s).stateful]
#: row lengths around the kernels' switch points (bytes of bits, a block of 8, long rows)
LENGTHS = st.one_of(st.integers(1, 40), st.sampled_from([255, 256, 1000, 2001, 40_000]))
DTYPES = st.sampled_from([torch.float32, torch.float64])


def draw_rows(seed: int, m: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(m, d, generator=g, dtype=dtype) * torch.rand(m, 1, generator=g, dtype=dtype) * 10
    X[:, :: max(1, d // 5)] = 0.0  # exact zeros: ties of top-k, sign(0), empty quantizer levels
    return X


def compressible(spec: str, x: torch.Tensor) -> bool:
    """Whether ``spec`` takes a tensor like ``x`` (top-k:3 refuses d < 3)."""
    try:
        make(spec).max_nbytes(x)
    except CompressionError:
        return False
    return True


def encode_both(spec: str, X: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode_rows`` of ``X`` with the fast kernels and with the reference only."""
    out = []
    for ref in (False, True):
        c = make(spec)
        rng = Stream(seed, list(range(X.shape[0]))) if c.randomized else None
        if rng is not None:
            rng.begin_round(3)
        if ref:
            with reference_kernels():
                out.append(c.encode_rows(X, rng).clone())
        else:
            out.append(c.encode_rows(X, rng).clone())
    return out[0], out[1]


@pytest.mark.parametrize("spec", STATELESS)
@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 5), d=LENGTHS, dtype=DTYPES)
def test_block_kernels_match_the_reference(spec, seed, m, d, dtype):
    X = draw_rows(seed, m, d, dtype)
    assume(compressible(spec, X[0]))
    fast, ref = encode_both(spec, X, seed)
    assert torch.equal(fast, ref), f"{spec}: encode_rows bytes differ from the reference"

    c = make(spec)
    rng = Stream(seed, list(range(m))) if c.randomized else None
    for r in range(m):  # a row is its own single message, on either path
        row_rng = None
        if rng is not None:
            rng.begin_round(3)
            row_rng = rng.row(r)
        assert torch.equal(c.encode(X[r], row_rng).to_bytes(), ref[r]), f"{spec}: row {r}"
        with reference_kernels():
            decoded_ref = c.decode(c.from_bytes(ref[r], X[r]))
        assert torch.equal(c.decode(c.from_bytes(ref[r], X[r])), decoded_ref), f"{spec}: decode"

    g = torch.Generator().manual_seed(seed + 1)
    k = max(1, m - 1)  # fewer targets than rows: some repeat, and must add in row order
    rows = torch.randint(0, k, (m,), generator=g)
    weight = torch.rand(m, generator=g, dtype=torch.float64) * 2 - 0.5
    base = torch.randn(k, d, generator=g, dtype=dtype)
    got, want = base.clone(), base.clone()
    c.decode_add_rows_(got, fast, weight, rows=rows)
    with reference_kernels():
        make(spec).decode_add_rows_(want, ref, weight, rows=rows)
    eps = torch.finfo(dtype).eps
    bound = (base.abs() + X.abs().amax() * 4 * m).amax()
    assert (got - want).abs().max() <= 8 * m * eps * bound, f"{spec}: decode_add_rows_"


@pytest.mark.parametrize("spec", STATELESS)
@settings(max_examples=6, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), m=st.integers(2, 5), d=st.integers(1, 300))
def test_a_corrupt_row_is_refused_alike(spec, seed, m, d):
    """Both paths refuse the same row of a block with a wrong header byte."""
    X = draw_rows(seed, m, d, torch.float32)
    assume(compressible(spec, X[0]))
    _, ref = encode_both(spec, X, seed)
    bad = seed % m
    ref[bad, 2] ^= 0x7F  # the compressor kind
    rows = []
    for use_ref in (False, True):
        c = make(spec)
        with pytest.raises(CompressionError) as info:
            if use_ref:
                with reference_kernels():
                    c.check_rows(ref, X[0])
            else:
                c.check_rows(ref, X[0])
        rows.append(getattr(info.value, "row", None))
    assert rows == [bad, bad]


@pytest.mark.parametrize("spec", [s for s in SPECS if make(s).stateful])
@settings(max_examples=6, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), d=st.sampled_from([4, 36, 100, 1000]), dtype=DTYPES)
def test_single_message_kernels_match_the_reference(spec, seed, d, dtype):
    """Stateful compressors (low-rank) encode one node at a time: same bytes, same values."""
    x = draw_rows(seed, 1, d, dtype)[0]
    assume(compressible(spec, x))
    fast, ref = make(spec), make(spec)
    a = fast.encode(x).to_bytes().clone()
    with reference_kernels():
        b = ref.encode(x).to_bytes().clone()
        vb = ref.decode(ref.from_bytes(b, x))
    assert torch.equal(a[:HEADER_NBYTES], b[:HEADER_NBYTES])
    assert torch.equal(a, b), f"{spec}: bytes differ from the reference"
    assert torch.equal(fast.decode(fast.from_bytes(a, x)), vb)


SPLITTING = [s for s in SPECS if make(s).splits]


def test_the_entry_wise_compressors_split():
    assert set(SPLITTING) >= {"none", "fp16", "bf16", "sign", "sign_l1", "sign_l2", "vote", "vote:ties"}
    assert not any(make(s).splits for s in ("topk:0.1", "randk:0.1", "qsgd:4", "lowrank:2"))


@pytest.mark.parametrize("spec", SPLITTING)
@settings(max_examples=8, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 4), n=st.integers(1, 6),
       per=st.sampled_from([8, 16, 40, 800]), dtype=DTYPES)
def test_a_split_message_is_the_messages_of_its_chunks(spec, seed, m, n, per, dtype):
    """Chunk j of a row's message (``split_rows``), framed again, is a valid message that
    decodes to chunk j of the row's decoded value, bit for bit, on either kernel path."""
    c, d = per, per * n
    X = draw_rows(seed, m, d, dtype)
    for ref in (False, True):
        comp = make(spec)
        with reference_kernels() if ref else _nothing():
            block = comp.encode_rows(X)
            whole = torch.zeros(m, d, dtype=dtype)
            comp.decode_add_rows_(whole, block)
            bodies = comp.split_rows(block, X[0], n)
            assert bodies.shape == (m, n, comp.body_nbytes((c,), dtype))
            msgs = comp.framed_rows(m * n, X[0, :c])
            msgs[:, HEADER_NBYTES:].copy_(bodies.reshape(m * n, -1))
            comp.check_rows(msgs, X[0, :c])
            parts = torch.zeros(m * n, c, dtype=dtype)
            comp.decode_add_rows_(parts, msgs)
        assert torch.equal(parts.view(m, d), whole), f"{spec}: chunks decode to the whole"


@pytest.mark.parametrize("spec", SPLITTING)
@settings(max_examples=8, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 4), n=st.integers(1, 6),
       per=st.sampled_from([8, 16, 40, 800, 8000]), dtype=DTYPES)
def test_the_chunk_kernels_match_their_references(spec, seed, m, n, per, dtype):
    """``encode_split_rows`` writes the bytes of ``split_rows(encode_rows(X))`` into the
    caller's rows, and ``decode_bodies`` / ``decode_add_bodies_`` give, bit for bit (signed
    zeros included), what the framed messages decode to, from strided bodies into strided
    rows as from contiguous ones."""
    c = per
    X = draw_rows(seed, m, c * n, dtype)
    comp = make(spec)
    with reference_kernels():
        ref = comp.encode_split_rows(X, n)
    nb = ref.shape[2]
    pitch = -(-nb // 8) * 8 + 8  # staging rows: 8-aligned, wider than a body
    rows = torch.zeros(m, n, pitch, dtype=torch.uint8)
    fast = comp.encode_split_rows(X, n, out=rows)
    assert fast.data_ptr() == rows.data_ptr() and torch.equal(fast, ref)
    bodies = fast.reshape(m * n, nb)  # strided rows
    base = torch.randn(m * n, c, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    for kernels in (reference_kernels, _nothing):
        with kernels():
            wide = torch.zeros(m * n, c + 3, dtype=dtype)
            dec = comp.decode_bodies(bodies, wide[:, 1 : c + 1])
            add = comp.decode_add_bodies_(base.clone(), bodies.contiguous())
        if kernels is reference_kernels:
            want_dec, want_add = dec.clone(), add
        else:
            assert torch.equal(dec, want_dec) and torch.equal(dec.signbit(), want_dec.signbit())
            assert torch.equal(add, want_add), f"{spec}: decode_add_bodies_"
    framed = comp.framed_rows(m * n, X[0, :c])
    framed[:, HEADER_NBYTES:].copy_(bodies)
    whole = torch.zeros(m * n, c, dtype=dtype)
    comp.decode_add_rows_(whole, framed)
    assert torch.equal(want_dec, whole)


def test_values_sent_as_they_are_are_encoded_in_place():
    """``none`` given staging rows that hold the vector already writes nothing (no copy)."""
    Z = torch.randn(2, 48)
    rows = Z.view(torch.uint8).view(2, 3, -1)
    version = Z._version  # bumped by any write into Z or a view of it
    out = make("none").encode_split_rows(Z, 3, out=rows)
    assert out.data_ptr() == Z.data_ptr() and Z._version == version


def _nothing():
    from contextlib import nullcontext

    return nullcontext()


@pytest.mark.parametrize(("spec", "d", "n", "message"), [
    ("topk:0.5", 16, 2, "do not cut into the messages of their chunks"),
    ("topk:3", 16, 2, "do not cut"),
    ("sign", 15, 2, "15 entries do not cut into 2 equal chunks"),
    ("sign", 12, 3, "does not cut into 3 chunks"),  # 4-entry chunks: a bit plane of half bytes
    ("vote:ties", 12, 2, "does not cut into 2 chunks"),
])
def test_split_rows_refuses_what_does_not_cut(spec, d, n, message):
    c = make(spec)
    x = torch.randn(1, d)
    with pytest.raises(CompressionError, match=message):
        c.split_rows(c.encode_rows(x), x[0], n)
