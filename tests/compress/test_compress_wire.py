"""Received bytes are validated: malformed messages raise CompressionError, never crash;
and the registry rejects bad specs with a message listing the valid ones."""

from __future__ import annotations

import pytest
import torch

from gossip.compress import available, make
from gossip.compress.wire import HEADER_NBYTES, MAGIC
from gossip.errors import CompressionError
from gossip.layout import Layout

SPECS = [
    "none",
    "fp16",
    "bf16",
    "topk:0.05",
    "topk:0.3",
    "randk:0.1",
    "randk:0.1:unbiased",
    "sign",
    "qsgd:4",
    "qsgd:12",
    "lead:2",
    "natural",
    "lowrank:2",
]


def gen(seed: int = 5) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def message(spec: str, shape=(24, 10), dtype=torch.float32, layout=None):
    c = make(spec, layout=layout)
    x = torch.randn(shape, generator=gen(1), dtype=dtype)
    if layout is not None:
        x = x.view(-1)
    return c, x, c.encode(x, gen()).to_bytes().clone()


def patched(buf: torch.Tensor, pos: int, value: int) -> torch.Tensor:
    b = buf.clone()
    b[pos] = value
    return b


@pytest.mark.parametrize("layout", [None, Layout([(8, 10), (40,), (12, 10)])])
@pytest.mark.parametrize("spec", SPECS)
def test_malformed_headers_and_lengths(spec, layout):
    c, x, buf = message(spec, layout=layout)
    cases = {
        "truncated": buf[:-1],
        "extended": torch.cat([buf, torch.zeros(1, dtype=torch.uint8)]),
        "header is incomplete": buf[:5],
        "magic": patched(buf, 0, MAGIC ^ 0xFF),
        "version": patched(buf, 1, (9 << 4) | int(buf[1]) & 0xF),
        "carries": patched(buf, 1, (int(buf[1]) & 0xF0) | 2),  # float64 announced
        "compressor": patched(buf, 2, int(buf[2]) ^ 0x0F),
        "header": patched(buf, 3, (int(buf[3]) + 1) % 256),  # the parameter byte
        "entries": patched(buf, 4, (int(buf[4]) + 1) % 256),
    }
    for what, bad in cases.items():
        with pytest.raises(CompressionError, match=what):
            c.from_bytes(bad, x)
    fresh = make(spec, layout=layout)  # (low-rank is stateful: a fresh one repeats the bytes)
    assert torch.equal(c.decode(c.from_bytes(buf, x)), fresh.decode(fresh.encode(x, gen())))


def test_wrong_bit_width_and_wrong_compressor():
    c, x, buf = message("qsgd:4")
    with pytest.raises(CompressionError, match="bit width is 6, expected 5"):
        c.from_bytes(patched(buf, 3, 6), x)
    with pytest.raises(CompressionError, match="bit width"):
        make("qsgd:5").from_bytes(buf, x)
    with pytest.raises(CompressionError, match="'qsgd'"):
        make("lead:4").from_bytes(buf, x)  # same width, other compressor
    with pytest.raises(CompressionError, match="receiving tensor is torch.float64"):
        c.from_bytes(buf, x.double())
    with pytest.raises(CompressionError, match="entries"):
        c.from_bytes(buf, torch.empty(10))


def test_topk_index_corruption():
    c, x, buf = message("topk:0.02", shape=(1000,))  # k = 20 int32 indices after 80 B values
    base = HEADER_NBYTES + 20 * 4
    idx = buf[base:].view(torch.int32)
    for value, what in ((1000, "out of range"), (-1, "out of range"), (2**31 - 1, "out of range")):
        bad = buf.clone()
        bad[base:].view(torch.int32)[7] = value
        with pytest.raises(CompressionError, match=what):
            c.from_bytes(bad, x)
    bad = buf.clone()
    bad[base:].view(torch.int32)[8] = int(idx[7])  # duplicate
    with pytest.raises(CompressionError, match="strictly increasing"):
        c.from_bytes(bad, x)
    c, x, buf = message("topk:0.3", shape=(1001,))  # bitmap
    bm = HEADER_NBYTES + 300 * 4
    bad = buf.clone()
    bad[bm] ^= 0x01  # one bit flipped: popcount != k
    with pytest.raises(CompressionError, match="set bits"):
        c.from_bytes(bad, x)
    bad = buf.clone()
    first = int(torch.nonzero(bad[bm:-1])[0])  # move a set bit into the padding past d
    bad[bm + first] &= bad[bm + first] - 1
    bad[-1] |= 0x80
    with pytest.raises(CompressionError, match="past d"):
        c.from_bytes(bad, x)


def test_other_body_corruption():
    c, x, buf = message("natural", shape=(100,))
    with pytest.raises(CompressionError, match="255"):
        c.from_bytes(patched(buf, HEADER_NBYTES + 3, 255), x)
    c, x, buf = message("randk:0.1", shape=(100,))
    with pytest.raises(CompressionError, match="seed"):
        c.from_bytes(patched(buf, HEADER_NBYTES + 7, 0x80), x)  # negative int64 seed


def test_not_a_message():
    c, x, buf = message("sign")
    for bad, what in (
        (buf.numpy(), "torch.Tensor"),
        (buf.float(), "uint8"),
        (buf.view(1, -1), "1-D"),
    ):
        with pytest.raises(CompressionError, match=what):
            c.from_bytes(bad, x)


@pytest.mark.parametrize("spec", SPECS)
def test_random_bodies_never_crash(spec):
    """Random bytes behind a valid header: an error or a payload that decodes, nothing else."""
    c, x, buf = message(spec, dtype=torch.float64)
    g = gen(3)
    for _ in range(5):
        bad = buf.clone()
        bad[HEADER_NBYTES:] = torch.randint(
            0, 256, (bad.numel() - HEADER_NBYTES,), generator=g, dtype=torch.uint8
        )
        try:
            p = c.from_bytes(bad, x)
        except CompressionError:
            continue
        y = c.decode(p)
        assert y.shape == x.shape


def test_from_bytes_allocates_nothing_before_validation():
    c = make("topk:0.01")
    like = torch.empty(10**7)  # a claimed large tensor: still just an exact-length check
    with pytest.raises(CompressionError, match="truncated"):
        c.from_bytes(c.encode(torch.randn(1000)).to_bytes()[:HEADER_NBYTES], torch.empty(1000))
    with pytest.raises(CompressionError):
        c.from_bytes(torch.zeros(100, dtype=torch.uint8), like)


# ----------------------------------------------------------------------------- registry
def test_available_specs_build():
    forms = available()
    for name in (
        "none",
        "fp16",
        "bf16",
        "topk:RATIO",
        "topk:K",
        "randk:RATIO",
        "randk:RATIO:unbiased",
        "sign",
        "qsgd:BITS",
        "qsgd:s=LEVELS",
        "qsgd:BITS:biased",
        "lead:BITS",
        "natural",
        "lowrank:RANK",
    ):
        assert name in forms
    sub = {"RANK": "1", "RATIO": "0.5", "LEVELS": "5", "BITS": "3", "K": "2"}
    for form in forms:
        spec = form
        for key, val in sub.items():
            spec = spec.replace(key, val)
        c = make(spec)
        assert c.spec == spec
        assert isinstance(c.unbiased, bool)
        x = torch.randn(4, 6, generator=gen())
        c.decode(c.encode(x, gen()))
    assert make("qsgd:4bit").fixed_nbytes(torch.empty(8)) == make("qsgd:4").fixed_nbytes(
        torch.empty(8)
    )
    assert make(" TopK:0.01 ").spec == "topk:0.01"


def test_constants():
    assert make("none").omega == 0 and make("none").unbiased
    assert make("natural").omega == 0.125 and make("natural").unbiased
    assert make("topk:0.01").delta == 0.01 and make("topk:20").delta is None
    assert make("topk:20").delta_for(2000) == 0.01
    assert make("randk:0.1").delta == 0.1 and not make("randk:0.1").unbiased
    u = make("randk:0.1:unbiased")
    assert u.unbiased and u.omega == pytest.approx(9.0) and u.omega_for(1000) == pytest.approx(9.0)
    assert make("qsgd:4").omega is None and make("qsgd:4").omega_for(100) == pytest.approx(
        min(100 / 64, 10 / 8)
    )
    assert make("lead:2").omega_for(100) == pytest.approx(min(100 / 16, 10 / 2))
    assert make("sign").delta is None and make("sign").delta_for(10) == 0.1
    assert make("lowrank:1").delta is None and make("lowrank:1").stateful
    assert make("fp16").delta < 1 and not make("fp16").unbiased


@pytest.mark.parametrize(
    "bad,what",
    [
        ("nope", "unknown compressor 'nope'"),
        ("", "unknown compressor"),
        ("topk", "needs a parameter"),
        ("topk:0", "K = 0"),
        ("topk:1.5", "ratio 1.5"),
        ("topk:-0.1", "ratio -0.1"),
        ("topk:nan", "ratio nan"),
        ("topk:abc", "neither a ratio"),
        ("topk:0.1:x", "one parameter"),
        ("randk:0.1:biased", "only ':unbiased'"),
        ("qsgd:0", "bits = 0"),
        ("qsgd:17", "bits = 17"),
        ("qsgd:s=0", "levels s = 0"),
        ("qsgd:s=x", "not an integer"),
        ("qsgd:4:unbiased", "only ':biased'"),
        ("lead:0", "bits = 0"),
        ("lead:2:biased", "one parameter"),
        ("lowrank:0", "rank 0"),
        ("lowrank:1.5", "not an integer"),
        ("sign:2", "takes no parameters"),
        (3, "a spec is a string"),
    ],
)
def test_registry_errors(bad, what):
    with pytest.raises(CompressionError, match=what) as err:
        make(bad)
    for name in ("none", "topk:RATIO", "qsgd:BITS", "lowrank:RANK", "natural"):
        assert name in str(err.value)


def test_layout_type_checked():
    with pytest.raises(CompressionError, match="Layout"):
        make("sign", layout=[(3, 3)])
