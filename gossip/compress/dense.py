"""Dense messages: the identity and the half-precision casts."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from gossip.compress import dispatch
from gossip.compress import rows as _rows
from gossip.compress.checks import all_finite, no_grad, nonfinite
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of
from gossip.errors import CompressionError


class Identity(Codec):
    """``C(x) = x``, sent in the tensor's own dtype (float32 or float64; half types too).

    Unbiased, ω = 0, δ = 1. Bytes: ``8 + d·itemsize`` (header + values; 32 d bits for float32).
    The NaN/Inf check is a sum of the copied values (one read pass, no host sync on CPU).
    """

    splits: ClassVar[bool] = True
    layout_free: ClassVar[bool] = True
    ordered_rows: ClassVar[bool] = True
    fused_add: ClassVar[bool] = True
    sends_values_in_place: ClassVar[bool] = True
    kind: ClassVar[int] = 1
    is_identity: ClassVar[bool] = True
    unbiased: ClassVar[bool] = True
    omega_exact: ClassVar[bool] = True
    omega = 0.0
    delta = 1.0
    dtypes = fast_dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

    def _sections(self, shape, dtype) -> Sections:
        return Sections.build(("values", dtype, numel_of(shape)))

    def _encode_batch(self, X, rng, v) -> None:
        """The values copied into the messages; no copy when ``X`` already sits in their value
        sections (a tensor allocated in message rows,
        :meth:`gossip.core.block.Block.message_tensor`)."""
        vals = v["values"]
        if not (vals.data_ptr() == X.data_ptr() and vals.stride() == X.stride()):
            vals.copy_(X)

    def _decode_batch(self, v, out) -> None:
        out.copy_(v["values"])

    # ----------------------------------------------------- blocks of nodes (rows)
    @no_grad
    def _fast_decode_add_rows(self, out, block, weight=1.0, *, rows=None, check=True):
        """Vectorized for float32/float64 (``out += w·v`` as the numpy path rounds it, or the
        fused add of the torch path); half types add row by row (their fused add rounds
        differently in torch's vector and scalar loops)."""
        st = _rows.start_values_decode(self, out, block, weight, rows, check)
        if st is None:
            return self._decode_add_rows_ref(out, block, weight, rows, check)
        block, tgt, w, vals = st
        if out.dtype not in (torch.float32, torch.float64):
            for r, t in enumerate(tgt.tolist()):
                out[t].add_(vals[r], alpha=1.0 if w is None else float(w[r, 0]))
            return out
        host = dispatch.host_decode(self, out)
        tmp = None if not host else _rows.scratch(self, "prod", tuple(vals.shape), out.dtype, out.device)
        _rows.add_rows_(out, None if rows is None else tgt, vals, w, fused=not host, tmp=tmp)
        return out

    # ------------------------------------------------------------ chunks of messages
    @no_grad
    def _fast_encode_split_rows(self, X, n, *, out=None):
        """Chunk j's values into body j: one copy, none when ``X`` already sits in ``out``'s
        value rows (a vector allocated in the staging rows of a chunked route)."""
        m, d = X.shape
        res = self._split_out(X, n, out)
        vals = res.view(X.dtype)  # [m, n, d/n]
        src = X.detach().reshape(m, n, d // n)
        if not (vals.data_ptr() == src.data_ptr() and vals.stride() == src.stride()):
            vals.copy_(src)
        if self.check_finite and not bool(torch.isfinite(X.sum(1)).all()):
            _rows.encode_error(self, X, ~torch.isfinite(X).all(1), "NaN/Inf")
        return res

    def _fast_decode_add_bodies(self, out, bodies):
        """One add of the values where they lie (the plain add of weight 1)."""
        out.add_(self.body_views(bodies, out)["values"])
        return out

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
    Bytes: ``8 + 2d``. The check is the minimum and maximum (one host sync on CUDA).
    Models in float16/bfloat16 are taken too (a bf16 model's ``bf16`` message is exact: the
    values as they are; a cast between the two half types rounds or range-checks as above).
    """

    splits: ClassVar[bool] = True
    layout_free: ClassVar[bool] = True
    ordered_rows: ClassVar[bool] = True
    fused_add: ClassVar[bool] = True
    checks_finite: ClassVar[bool] = True  # the range check sees NaN/Inf
    unbiased: ClassVar[bool] = False
    dtypes = fast_dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    wire: ClassVar[torch.dtype]
    limit: ClassVar[float]  # smallest magnitude that rounds to Inf

    def _sections(self, shape, dtype) -> Sections:
        return Sections.build(("values", self.wire, numel_of(shape)))

    def _encode_batch(self, X, rng, v) -> None:
        self._check_range_rows(X)
        v["values"].copy_(X)

    def _decode_batch(self, v, out) -> None:
        out.copy_(v["values"])  # upcast: exact

    def _decode_add_batch(self, v, out, weight) -> None:
        vals = v["values"]  # upcast to float32/float64 inside the fused add: exact
        if out.dtype not in (torch.float32, torch.float64):  # a cast between half types rounds
            vals = vals.to(out.dtype)
        out.add_(vals, alpha=weight)

    def _check_range_rows(self, X: torch.Tensor) -> None:
        """Refuse the first row with NaN/Inf or an entry beyond the range of the wire type,
        when ``check_finite``: the row minima and maxima (one ``aminmax`` pass for a single
        row; two reductions for a block, several times faster than torch's ``aminmax`` along
        a dim on the CPU), compared on the host in float64 (one sync)."""
        if not self.check_finite:
            return
        if X.shape[0] == 1:
            lohi = torch.stack(torch.aminmax(X.view(-1))).view(2, 1)
        else:
            lohi = torch.stack((X.amin(1), X.amax(1)))
        los, his = lohi.tolist()
        for r, (lo, hi) in enumerate(zip(los, his, strict=True)):
            if not (-self.limit < lo and hi < self.limit):  # NaN compares False
                _rows.raise_row(r, lambda: self._refuse_range(lo, hi), "refused")  # noqa: B023

    def _refuse_range(self, lo: float, hi: float) -> None:
        """The error of a row whose smallest and largest entries are ``lo`` and ``hi``."""
        if not (abs(lo) < float("inf") and abs(hi) < float("inf")):
            raise nonfinite(self.spec)
        raise CompressionError(
            f"{self.spec}: |x_i| up to {max(-lo, hi):.4g} exceeds the range of "
            f"{self.wire} (< {self.limit:.6g}); use 'none' or scale the input"
        )

    # ------------------------------------------------------------ chunks of messages
    @no_grad
    def _fast_encode_split_rows(self, X, n, *, out=None):
        """Chunk j's values cast into body j (one cast-copy), the range checked per row."""
        m, d = X.shape
        X = X.detach()
        self._check_range_rows(X)
        res = self._split_out(X, n, out)
        res.view(self.wire).copy_(X.reshape(m, n, d // n))
        return res

    def _fast_decode_add_bodies(self, out, bodies):
        """One add of the values upcast (exactly) where they lie."""
        out.add_(self.body_views(bodies, out)["values"])
        return out


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
