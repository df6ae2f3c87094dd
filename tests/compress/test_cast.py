"""The half-precision casts ``bf16`` / ``fp16`` as the low-precision training's dense message:
exact on representable values, the documented error bound, 2 bytes per entry, clear range errors."""

from __future__ import annotations

import pytest
import torch

from gossip.compress import make
from gossip.errors import CompressionError
from gossip.layout import Layout

WIRE = {"bf16": (torch.bfloat16, 2.0**-8), "fp16": (torch.float16, 2.0**-11)}
"""spec -> (wire dtype, bound on the relative error of one entry in the normal range)"""


def sample(d: int = 4099, seed: int = 0) -> torch.Tensor:
    """Entries spread over many binades (1e-4 .. 1e4), both signs: float32."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.pow(10.0, torch.empty(d).uniform_(-4.0, 4.0, generator=g))
    return mag * torch.where(torch.rand(d, generator=g) < 0.5, -1.0, 1.0)


def roundtrip(spec: str, x: torch.Tensor, layout: Layout | None = None) -> torch.Tensor:
    c = make(spec, layout)
    return c.decode(c.from_bytes(c.encode(x).to_bytes(), like=x))


@pytest.mark.parametrize("spec", sorted(WIRE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_representable_values_decode_exactly(spec, dtype):
    """A value the wire type holds comes back bit for bit, in the model's dtype."""
    wire, _ = WIRE[spec]
    x = sample().to(wire).to(dtype)
    y = roundtrip(spec, x)
    assert y.dtype == dtype and torch.equal(y, x)


@pytest.mark.parametrize("spec", sorted(WIRE))
def test_error_is_round_to_nearest_within_the_bound(spec):
    """|C(x)_i − x_i| ≤ 2^-8 |x_i| (bf16) / 2^-11 |x_i| (fp16), C(x) is torch's nearest
    rounding, and ‖C(x) − x‖² ≤ (1 − δ)‖x‖² with the compressor's δ."""
    wire, rel = WIRE[spec]
    x = sample()
    y = roundtrip(spec, x)
    assert torch.equal(y, x.to(wire).float())  # deterministic round to nearest (even)
    err = (y.double() - x.double()).abs()
    assert bool((err <= rel * x.double().abs()).all())
    assert float(err.max()) > 0.5 * rel * float(x.abs().min())  # not exact: the bound is met, not idle
    c = make(spec)
    assert float(err.pow(2).sum()) <= (1.0 - c.delta) * float(x.double().pow(2).sum())
    assert not c.unbiased and not c.randomized and 0.0 < c.delta < 1.0


@pytest.mark.parametrize("spec", sorted(WIRE))
def test_two_bytes_per_entry_plus_the_header(spec):
    """Half of ``none``'s float32 body: 8 + 2d bytes, for a vector and for a model's layout."""
    for d in (1, 7, 4099):
        x = sample(d)
        assert make(spec).encode(x).nbytes == 8 + 2 * d
        assert make("none").encode(x).nbytes == 8 + 4 * d
    layout = Layout([(64, 64), (64,), (10, 64), (10,)])  # the digits MLP, 64-64-10
    x = sample(layout.numel)
    assert make(spec, layout).encode(x).nbytes == 8 + 2 * layout.numel == 9628
    assert make("none", layout).encode(x).nbytes == 8 + 4 * layout.numel
    assert torch.equal(roundtrip(spec, x, layout), x.to(WIRE[spec][0]).float())


def test_fp16_range_is_refused_with_the_fix():
    """fp16's largest finite value is 65504: an entry that would round to Inf is refused,
    naming the value and what to do; entries that round to ±65504 pass."""
    x = torch.tensor([1.0, -7.0e4, 3.0])
    with pytest.raises(CompressionError, match=r"fp16: \|x_i\| up to 7e\+04 exceeds the range of "
                                              r"torch.float16 .*use 'none' or scale the input"):
        make("fp16").encode(x)
    rows = torch.stack([torch.ones(3), x])
    with pytest.raises(CompressionError, match="range of torch.float16") as info:
        make("fp16").encode_rows(rows)
    assert info.value.row == 1
    ok = torch.tensor([65504.0, -65519.0, 1e-3])
    assert roundtrip("fp16", ok)[:2].tolist() == [65504.0, -65504.0]
    assert torch.equal(roundtrip("bf16", x), x.to(torch.bfloat16).float())  # bf16: float32's range


@pytest.mark.parametrize("spec", sorted(WIRE))
def test_nan_in_a_message_is_refused(spec):
    """A received body holding NaN is refused by from_bytes (the framework's value check)."""
    wire, _ = WIRE[spec]
    x = sample(16)
    buf = make(spec).encode(x).to_bytes().clone()
    buf[8:10] = torch.tensor([float("nan")], dtype=wire).view(torch.uint8)
    with pytest.raises(CompressionError, match="NaN"):
        make(spec).from_bytes(buf, like=x)


@pytest.mark.parametrize("spec", sorted(WIRE))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models(spec, dtype):
    """A half model is taken: its own type's message is exact, the other half type rounds
    (bf16 -> fp16 within fp16's range), 2 bytes per entry either way; the block decode-add
    equals the single-message one."""
    wire, _ = WIRE[spec]
    x = (sample(1000) / 1e3).to(dtype)
    y = roundtrip(spec, x)
    assert y.dtype == dtype and make(spec).encode(x).nbytes == 8 + 2 * 1000
    assert torch.equal(y, x.to(wire).to(dtype))
    if wire == dtype:
        assert torch.equal(y, x)
    c = make(spec)
    X = torch.stack([x, -x, 2 * x])
    block = c.encode_rows(X)
    out, ref = torch.ones_like(X), torch.ones_like(X)
    c.decode_add_rows_(out, block, torch.tensor([[0.5], [0.25], [1.0]], dtype=torch.float64))
    for r, w in enumerate((0.5, 0.25, 1.0)):
        c.decode_add_(ref[r], c.from_bytes(block[r], like=x), w)
    assert torch.equal(out, ref)


def test_bf16_gossip_of_a_bf16_model_equals_uncompressed():
    """CHOCO gossip of bfloat16 models: the bf16 message is the model's own bytes, so the run
    equals the one with ``none``, bit for bit."""
    import topologies
    from gossip import Engine, make_algorithm

    def run(spec: str) -> torch.Tensor:
        engine = Engine(make_algorithm("choco", gamma=0.5), topologies.build("ring", 6),
                        lambda i: sample(300, seed=i) / 1e3, compressor=spec, dtype=torch.bfloat16)
        engine.run(5, log_every=5)
        return torch.stack([engine.nodes[i].x for i in sorted(engine.nodes)])

    a, b = run("none"), run("bf16")
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    assert not torch.equal(a[0], a[1])  # not yet in consensus: the test sees the mixing
