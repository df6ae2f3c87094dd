"""Scaled sign: one bit per entry and one scale."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gossip.compress import bits
from gossip.compress.checks import check_scalar
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of


class ScaledSign(Codec):
    """``C(x) = (‖x‖₁/d)·sign(x)`` with sign(0) = +1 (−0.0 included).

    Deterministic, biased, contractive with δ(x) = ‖x‖₁²/(d‖x‖²) ≥ 1/d (≈ 2/π on Gaussian
    data); ``delta`` is None, ``delta_for(d)`` = 1/d. Wire: the scale in the input dtype then
    one bit per entry (set = negative) packed 8 per byte: ``8 + itemsize + ⌈d/8⌉`` bytes,
    e.g. 125,012 bytes for d = 10⁶ float32 (d + 32 bits plus the 8-byte header).

    Encoding packs ``x < 0`` (numpy's ``packbits`` on the CPU, one int64 multiply per 8 entries
    elsewhere); decoding is one lookup of a 256 × 8 table of ±scale per byte. The NaN/Inf
    check reads ‖x‖₁, which the scale needs anyway.
    """

    kind: ClassVar[int] = 6

    def delta_for(self, numel: int) -> float | None:
        return 1.0 / numel

    def _sections(self, shape, dtype) -> Sections:
        d = numel_of(shape)
        return Sections.build(("scale", dtype, 1), ("bits", torch.uint8, bits.nbytes_bits(d)))

    def _encode_body(self, x, generator, v) -> dict[str, Any]:
        xf = x.view(-1)
        d, dev = xf.numel(), xf.device
        a = self.ws.get("abs", d, xf.dtype, dev)
        l1 = torch.abs(xf, out=a).sum()
        if self.check_finite:
            check_scalar(l1, xf, self.spec, "‖x‖₁")
        v["scale"].copy_(l1 / d)
        bits.pack_negative(xf, v["bits"], self.ws)
        return v

    def _decode_body(self, parts, shape, dtype, out) -> None:
        self._expand(parts, out.view(-1), parts["scale"])

    def _decode_add_body(self, parts, shape, dtype, out, weight) -> None:
        of = out.view(-1)
        tmp = self.ws.get("decode_add", of.numel(), dtype, of.device)
        self._expand(parts, tmp, parts["scale"])
        of.add_(tmp, alpha=weight)

    def _expand(self, parts, out: torch.Tensor, scale: torch.Tensor) -> None:
        """``out = scale·(±1)`` from the packed bits, 8 entries per table row."""
        d, dev = out.numel(), out.device
        table = bits.pm1_table(out.dtype, dev) * scale  # (256, 8), no host sync
        packed = parts["bits"]
        full = d // 8
        idx = self.ws.get("unpack.idx", packed.numel(), torch.int32, dev)
        if full:
            bits.rows(packed[:full], table, idx[:full], out[: 8 * full].view(full, 8))
        if d % 8:
            last = table[packed[full:].long()].view(-1)
            out[8 * full :].copy_(last[: d % 8])
