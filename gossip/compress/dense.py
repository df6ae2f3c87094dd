"""Dense messages: the identity and the half-precision casts."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from gossip.compress.base import CompressionError
from gossip.compress.checks import all_finite, check_scalar, nonfinite
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of


class Identity(Codec):
    """``C(x) = x``, sent in the tensor's own dtype (float32 or float64; half types too).

    Unbiased, ω = 0, δ = 1. Bytes: ``8 + d·itemsize`` (header + values; 32 d bits for float32).
    The NaN/Inf check is a sum of the copied values (one read pass, no host sync on CPU).
    """

    kind: ClassVar[int] = 1
    unbiased: ClassVar[bool] = True
    omega = 0.0
    delta = 1.0
    dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

    def _sections(self, shape, dtype) -> Sections:
        return Sections.build(("values", dtype, numel_of(shape)))

    def _encode_body(self, x, generator, v) -> dict[str, Any]:
        vals = v["values"]
        vals.copy_(x.view(-1))
        if self.check_finite:
            check_scalar(vals.sum(), vals, self.spec, "the sum", overflow_ok=True)
        return v

    def _decode_body(self, parts, shape, dtype, out) -> None:
        out.view(-1).copy_(parts["values"])

    def _decode_add_body(self, parts, shape, dtype, out, weight) -> None:
        out.view(-1).add_(parts["values"], alpha=weight)

    # ------------------------------------------------------- numpy fast path (CPU)
    def _encode_host(self, plan, x, xn, generator, v) -> dict[str, Any]:
        vals = v["values"]
        np.copyto(vals, xn)
        if self.check_finite and not all_finite(xn, x):
            raise nonfinite(self.spec)
        return v

    def _decode_host(self, host, out: np.ndarray) -> None:
        np.copyto(out, host["values"])

    def _decode_add_host(self, host, out: np.ndarray, weight: float) -> None:
        vals = host["values"]
        if weight == 1.0:
            out += vals
        else:
            tmp = self.ws.host("decode_add", vals.size, _TORCH_OF[vals.dtype.type])
            np.multiply(vals, weight, out=tmp)
            out += tmp


_TORCH_OF = {np.float32: torch.float32, np.float64: torch.float64}


class Cast(Codec):
    """``C(x) = round_to_nearest(x)`` in a 16-bit float type (``fp16`` or ``bf16``).

    Deterministic and biased. Relative error per entry ≤ 2⁻¹¹ (fp16) / 2⁻⁸ (bf16) in the
    normal range, so δ = 1 − 2⁻²² / 1 − 2⁻¹⁶ for entries with |x_i| ≥ 2⁻¹⁴ (fp16's smallest
    normal; bf16 shares float32's range); fp16 flushes |x_i| < 2⁻²⁵ to 0. Entries beyond the
    type's range raise :class:`CompressionError` instead of becoming Inf.
    Bytes: ``8 + 2d``. The check is one ``aminmax`` (one host sync on CUDA).
    """

    unbiased: ClassVar[bool] = False
    wire: ClassVar[torch.dtype]
    limit: ClassVar[float]  # smallest magnitude that rounds to Inf

    def _sections(self, shape, dtype) -> Sections:
        return Sections.build(("values", self.wire, numel_of(shape)))

    def _encode_body(self, x, generator, v) -> dict[str, Any]:
        xf = x.view(-1)
        if self.check_finite:
            lo, hi = (float(t) for t in torch.stack(torch.aminmax(xf)).tolist())
            if not (abs(lo) < float("inf") and abs(hi) < float("inf")) or lo != lo or hi != hi:
                raise nonfinite(self.spec)
            if max(-lo, hi) >= self.limit:
                raise CompressionError(
                    f"{self.spec}: |x_i| up to {max(-lo, hi):.4g} exceeds the range of "
                    f"{self.wire} (< {self.limit:.6g}); use 'none' or scale the input"
                )
        v["values"].copy_(xf)
        return v

    def _decode_body(self, parts, shape, dtype, out) -> None:
        out.view(-1).copy_(parts["values"])

    def _decode_add_body(self, parts, shape, dtype, out, weight) -> None:
        out.view(-1).add_(parts["values"], alpha=weight)


class Fp16(Cast):
    __doc__ = Cast.__doc__
    kind: ClassVar[int] = 2
    wire: ClassVar[torch.dtype] = torch.float16
    limit: ClassVar[float] = 65520.0  # 65504 + half an ulp
    delta = 1.0 - 2.0**-22


class Bf16(Cast):
    __doc__ = Cast.__doc__
    kind: ClassVar[int] = 3
    wire: ClassVar[torch.dtype] = torch.bfloat16
    limit: ClassVar[float] = 3.3961775292304e38  # bf16 max + half an ulp
    delta = 1.0 - 2.0**-16
