"""Composed compressors ``SPARSIFIER+VALUES`` (gossip/compress/compose.py): the kept values of
a sparsifier sent by a second compressor. A block's rows equal the single messages, bytes and
values; the decode is the value compressor's decode put back at the kept positions; the
constants hold; what cannot be composed is refused."""

from __future__ import annotations

import pytest
import torch

from gossip.compress import make
from gossip.errors import CompressorSpecError
from gossip.layout import Layout
from gossip.rng import Stream

SPECS = ["topk:0.2+qsgd:4:biased", "topk:7+sign", "randk:0.3+qsgd:2", "randk:0.25:unbiased+qsgd:3",
         "topk:0.5+none", "randk:9+lead:3"]


def _stream(nodes, t=1):
    s = Stream(11, nodes)
    s.begin_round(t)
    return s


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_block_equals_its_single_messages(spec, dtype):
    c = make(spec)
    X = torch.randn(5, 40, generator=torch.Generator().manual_seed(2), dtype=dtype)
    block = c.encode_rows(X, _stream(range(5)))
    out = torch.zeros_like(X)
    c.decode_add_rows_(out, block)
    for r in range(5):
        p = c.encode(X[r], _stream([r]))
        assert torch.equal(p.to_bytes(), block[r, :p.nbytes]), r
        assert torch.equal(c.decode(c.from_bytes(p.to_bytes(), like=X[r])), out[r]), r


@pytest.mark.parametrize(("spec", "sparse", "values"), [
    ("topk:6+qsgd:4:biased", "topk:6", "qsgd:4:biased"), ("randk:0.3+sign", "randk:0.3", "sign")])
def test_decodes_to_the_value_compressor_at_the_kept_positions(spec, sparse, values):
    """The positions are the sparsifier's (same stream position), the values the second
    compressor's decode of the kept ones (its draws after the sparsifier's)."""
    x = torch.randn(30, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    s = _stream([0])
    got = make(spec).decode(make(spec).encode(x, s))
    s = _stream([0])
    kept = make(sparse).decode(make(sparse).encode(x, s))
    pos = kept.nonzero().view(-1)
    want = torch.zeros_like(x)
    want[pos] = make(values).decode(make(values).encode(kept[pos].contiguous(), s))
    assert torch.equal(got, want)


def test_sends_fewer_bytes_than_the_sparsifier_alone():
    x = torch.randn(1000, dtype=torch.float32)
    assert make("topk:0.1+qsgd:4").encode(x, _stream([0])).nbytes < \
        0.6 * make("topk:0.1").encode(x).nbytes


def test_constants():
    d = 200
    assert make("topk:0.1+none").delta_for(d) == pytest.approx(0.1)
    qb = make("qsgd:4:biased").delta_for(20)
    assert make("topk:0.1+qsgd:4:biased").delta_for(d) == pytest.approx(0.1 * qb)
    c = make("randk:0.1:unbiased+qsgd:4")
    assert c.unbiased and c.omega_for(d) == pytest.approx(10 * (1 + make("qsgd:4").omega_for(20)) - 1)
    assert make("topk:0.1+qsgd:4").delta_for(d) is None  # biased positions, unbiased values


def test_the_contraction_holds_on_average():
    """E‖C(x) − x‖² ≤ (1 − δ)‖x‖² for top-k then biased QSGD (200 draws of the dither)."""
    c = make("topk:0.25+qsgd:2:biased")
    x = torch.randn(40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    err = sum(float((c.decode(c.encode(x, _stream([0], t))) - x).square().sum())
              for t in range(1, 201)) / 200
    assert err <= (1 - c.delta_for(40)) * float(x.square().sum())


def test_unbiased_when_both_parts_are():
    c = make("randk:0.5:unbiased+qsgd:4")
    x = torch.randn(8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mean = sum(c.decode(c.encode(x, _stream([0], t))) for t in range(1, 4001)) / 4000
    assert float((mean - x).abs().max()) < 0.15 * float(x.abs().max())


def test_per_tensor_of_a_layout():
    layout = Layout([(4, 5), (10,)])
    c = make("topk:0.3+qsgd:4:biased", layout=layout)
    x = torch.randn(30, dtype=torch.float64)
    y = c.decode(c.from_bytes(c.encode(x, _stream([0])).to_bytes(), like=x))
    assert int((y[:20] != 0).sum()) <= 6 and int((y[20:] != 0).sum()) <= 3


def test_a_bad_index_is_refused_on_receipt():
    from gossip.errors import CompressionError

    c = make("topk:3+qsgd:4")
    x = torch.randn(50, dtype=torch.float64)
    buf = c.encode(x, _stream([0])).to_bytes().clone()
    buf[8:12] = torch.tensor([99], dtype=torch.int32).view(torch.uint8)  # index 99 of 50
    with pytest.raises(CompressionError):
        c.from_bytes(buf, like=x)


@pytest.mark.parametrize(("spec", "says"), [
    ("qsgd:4+topk:0.1", "the first part of a composition must be a sparsifier"),
    ("topk:0.1+lowrank:2", "must be a stateless compressor of rows"),
    ("topk:0.1+qsgd:4+sign", "two specs joined by one"),
    ("topk:0.1+", "two specs joined by one"),
])
def test_refused(spec, says):
    with pytest.raises(CompressorSpecError, match=says):
        make(spec)
