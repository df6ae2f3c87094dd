"""The declarations that refine a batch-form compressor (``gossip.compress.codec``): how its
decode-add rounds (``fused_add``) and who refuses NaN/Inf input (``checks_finite``)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from gossip.compress import Codec, make, reference_kernels
from gossip.compress.wire import Sections, numel_of
from gossip.errors import CompressionError


class Plain(Codec):
    """The values as they are, in the batch form (rounds ``w·C(x)`` first)."""

    def _sections(self, shape, dtype) -> Sections:
        return Sections.build(("values", dtype, numel_of(shape)))

    def _encode_batch(self, X, rng, v) -> None:
        v["values"].copy_(X)

    def _decode_batch(self, v, out) -> None:
        out.copy_(v["values"])


class Fused(Plain):
    """:class:`Plain` adding ``out + w·C(x)`` with one rounding."""

    fused_add: ClassVar[bool] = True


class OwnCheck(Plain):
    """:class:`Plain` refusing NaN/Inf rows itself, with its own message."""

    checks_finite: ClassVar[bool] = True

    def _encode_batch(self, X, rng, v) -> None:
        if self.check_finite:
            bad = ~torch.isfinite(X.amax(1))
            self._refuse_encode(bad, lambda r: _raise(f"{self.spec}: row max is not finite"))
        super()._encode_batch(X, rng, v)


def _raise(message: str) -> None:
    raise CompressionError(message)


def _rows(seed: int, m: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(m, d, generator=g)
    base = torch.randn(m, d, generator=g) * 3
    w = torch.rand(m, generator=g, dtype=torch.float64) * 0.9 + 0.05
    return X, base, w


@pytest.mark.parametrize("cls", [Plain, Fused])
def test_decode_add_rounds_as_the_class_declares(cls):
    """``fused_add``: ``out.add_(C, alpha=w)`` (one rounding) for a single message and for
    every row of a block; else ``out + (w·C)`` (the product rounded first)."""
    X, base, w = _rows(3, 4, 1000)
    fused = torch.stack([base[r].clone().add_(X[r], alpha=float(w[r])) for r in range(4)])
    plain = torch.stack([base[r] + X[r] * float(w[r]) for r in range(4)])
    assert not torch.equal(fused, plain)  # the two roundings differ on these values
    want = fused if cls.fused_add else plain
    c = cls("test")
    single = torch.stack([c.decode_add_(base[r].clone(), c.encode(X[r]), float(w[r]))
                          for r in range(4)])
    assert torch.equal(single, want)
    block = c.encode_rows(X)
    got = base.clone()
    c.decode_add_rows_(got, block, w)
    assert torch.equal(got, want)
    with reference_kernels():
        got = base.clone()
        c.decode_add_rows_(got, block, w)
    assert torch.equal(got, want)


def test_a_class_that_checks_finite_refuses_nan_itself_naming_the_row():
    X, _, _ = _rows(4, 3, 50)
    X[1, 7] = float("nan")
    c = OwnCheck("own")
    with pytest.raises(CompressionError, match="row max is not finite") as info:
        c.encode_rows(X)
    assert info.value.row == 1
    with pytest.raises(CompressionError, match="row max is not finite") as info:
        c.encode(X[1])
    assert info.value.row is None  # a single tensor is no row of a block
    with pytest.raises(CompressionError, match="NaN/Inf") as info:
        Plain("plain").encode_rows(X)  # the base class's check
    assert info.value.row == 1


@pytest.mark.parametrize("spec", ["fp16", "sign"])
def test_a_single_tensors_encode_error_names_no_row(spec):
    """Built-ins refusing in their batch code: the row in a block, none for one tensor."""
    x = torch.full((40,), 3e38 if spec == "sign" else 1e5)
    c = make(spec)
    with pytest.raises(CompressionError, match="overflows|range") as info:
        c.encode_rows(torch.stack([torch.ones(40), x]))
    assert info.value.row == 1
    with reference_kernels(), pytest.raises(CompressionError, match="overflows|range") as info:
        c.encode(x)
    assert info.value.row is None
