"""Scaled sign: one bit per entry and one scale."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from gossip.compress import bits, dispatch, jit
from gossip.compress import rows as _rows
from gossip.compress.checks import check_scalar, no_grad, quiet, tame
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of

_TORCH_OF = {np.float32: torch.float32, np.float64: torch.float64}
_CHUNK = 1 << 16  # entries per chunk of the long-row decode-add (a multiple of 64; in cache)
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

    splits: ClassVar[bool] = True
    ordered_rows: ClassVar[bool] = True
    fused_add: ClassVar[bool] = True
    checks_finite: ClassVar[bool] = True  # the norm sees NaN/Inf
    kind: ClassVar[int] = 6
    scale_sections: ClassVar[tuple[str, ...]] = ("scale",)

    def delta_for(self, numel: int) -> float | None:
        return 1.0 / numel

    def _sections(self, shape, dtype) -> Sections:
        d = numel_of(shape)
        return Sections.build(("scale", dtype, 1), ("bits", torch.uint8, bits.nbytes_bits(d)))

    norm_name: ClassVar[str] = "‖x‖₁"
    #: the norm is torch's sum of ``|x|`` (:meth:`_norm`), so the numba kernel ``sign_bits``
    #: may write that ``|x|`` while it packs the bits
    abs_norm: ClassVar[bool] = True

    def _norm(self, xf: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """The norm the scale is made of (0-dim, in the input dtype, float32 for a half one,
        whose sum overflows long before its mean): here ‖x‖₁."""
        return torch.abs(xf, out=scratch).sum(dtype=_accumulator(xf.dtype))

    def _scale_of(self, norm, d: int):
        """The scale from the norm (tensor or host scalar): here ‖x‖₁/d."""
        return norm / d

    def _encode_batch(self, X, rng, v) -> None:
        """The row norms (:meth:`_norm_rows`), the scales, ``X < 0`` packed per row."""
        m, d = X.shape
        norms = self._norm_rows(X)
        if self.check_finite:
            self._refuse_encode(~torch.isfinite(norms),
                                lambda r: check_scalar(norms[r], X[r], self.spec, self.norm_name))
        v["scale"].copy_(self._scale_of(norms, d).view(m, 1))
        _rows.pack_compare_rows(X, False, v["bits"], self.ws)

    def _decode_batch(self, v, out) -> None:
        """±1 from the table straight into ``out`` (when its rows are contiguous whole bytes),
        times the scale: ``scale·(±1)``, exact."""
        k, d = out.shape
        full = out if out.is_contiguous() and d % 8 == 0 else \
            _rows.scratch(self, "pm1", (k, 8 * v["bits"].shape[1]), out.dtype, out.device)
        _rows.pm1_rows(v["bits"], full, self.ws).mul_(v["scale"])
        if full is not out:
            out.copy_(full[:, :d])

    # ------------------------------------------------------- numpy fast path (CPU)
    def _encode_host(self, plan, x, xn, generator, v) -> dict[str, Any]:
        # the norm by torch on both paths: numpy sums in another order (other bytes)
        xf = x if x.dim() == 1 else torch.from_numpy(xn)
        scratch, absx = self.ws.pair("abs", xn.size, x.dtype)
        fn = dispatch.jit_kernel("sign_bits", xn.size) if self.abs_norm else None
        if fn is not None:  # |x| and the bits in one pass; torch sums |x| as _norm does
            fn(xn, absx, v["bits"], self.ws.host("jit.flags", jit.SIGN_CHUNK, torch.uint8))
            norm = scratch.sum(dtype=_accumulator(x.dtype))
        else:
            norm = self._norm(xf, scratch)
        nv = norm.item()
        if self.check_finite and not math.isfinite(nv):
            check_scalar(norm, x, self.spec, self.norm_name)
        dt = v["scale"].dtype.type
        v["scale"][0] = self._scale_of(dt(nv), xn.size)  # as torch: in the input dtype
        if fn is None:
            neg = self.ws.host("flags", xn.size, torch.bool)
            np.less(xn, 0, out=neg)
            v["bits"][:] = np.packbits(neg, bitorder="little")
        return v

    def _decode_host(self, host, out: np.ndarray) -> None:
        scale = host["scale"][0]
        if dispatch.table_decode(out.size):
            self._expand_table(host, torch.from_numpy(out))
        elif tame(scale):
            _expand_host(host["bits"], scale, out)
        else:
            with quiet():
                _expand_host(host["bits"], scale, out)

    def _decode_add_host(self, host, out: np.ndarray, weight: float) -> None:
        scale = host["scale"][0]
        tmp = self.ws.host("decode_add", out.size, _TORCH_OF[out.dtype.type])
        if dispatch.table_decode(out.size):
            tt = torch.from_numpy(tmp)
            self._expand_table(host, tt)
            torch.from_numpy(out).add_(tt, alpha=weight)
        elif tame(scale, weight):
            _expand_host(host["bits"], scale * scale.dtype.type(weight), tmp)
            out += tmp
        else:
            with quiet():
                _expand_host(host["bits"], scale * scale.dtype.type(weight), tmp)
                out += tmp

    def _expand_table(self, host, out: torch.Tensor) -> None:
        """:meth:`_expand` on numpy parts: one table row per byte, one pass over ``out``."""
        self._expand({"bits": torch.from_numpy(host["bits"])}, out, torch.from_numpy(host["scale"]))

    # ----------------------------------------------------- blocks of nodes (rows)
    #: CPU blocks of one row or of long rows: each row by the numpy/numba encoder
    _fast_encode_rows = _rows.encode_rows_looped

    def _norm_rows(self, X: torch.Tensor) -> torch.Tensor:
        """``_norm`` of every row ([m], bit for bit the single-row value).

        One reduction along dim 1 on the CPU, where it reduces each row in the order the
        row alone is reduced, except when a row alone would split across threads (d at least
        torch's grain size with several threads): then, on CUDA (whose kernels pick their
        reduction order from the shape), for the half types (summed in float32) and for a
        single row, one :meth:`_norm` per row view."""
        m, d = X.shape
        if (m == 1 or not X.is_cpu or X.dtype not in (torch.float32, torch.float64)
                or (d >= _rows.GRAIN_SIZE and torch.get_num_threads() > 1)):
            Xc = X.contiguous()
            scratch = self.ws.get("abs", d, X.dtype, X.device)
            return torch.stack([self._norm(Xc[r], scratch) for r in range(X.shape[0])])
        return self._norm_dim1(X)

    def _norm_dim1(self, X: torch.Tensor) -> torch.Tensor:
        return X.abs().sum(1)

    @no_grad
    def _fast_decode_add_rows(self, out, block, weight=1.0, *, rows=None, check=True):
        """Vectorized: ±scale per row from the bits, added as the single-message path adds it
        (numpy path up to 2^18 entries: ``out += ±(scale·w)``; else fused ``out + w·(±scale)``)."""
        st = _rows.start_decode(self, out, block, weight, rows, check)
        if st is None:
            return self._decode_add_rows_ref(out, block, weight, rows, check)
        plan, block, tgt, w, bad = st
        d = out.shape[1]
        scale = _rows.section(block, plan, "scale")  # [m, 1]
        if check:
            _rows.bad_row(self, out, block, tgt, _rows.value_mask(self, {"scale": scale}, bad),
                          "bad row")
        m = block.shape[0]
        t = None if rows is None else tgt
        numpy_rounding = dispatch.host_decode(self, out) and not dispatch.table_decode(d)
        if dispatch.loop_decode(out) and out.stride(1) == 1:
            self._add_rows_chunked(out, t, _rows.section(block, plan, "bits"), scale, w,
                                   numpy_rounding)
            return out
        pm1 = _rows.scratch(self, "pm1", (m, d), out.dtype, out.device)
        pm1.copy_(_rows.unpack_rows(_rows.section(block, plan, "bits"), d))
        pm1.mul_(-2.0).add_(1.0)  # set bit -> -1, clear -> +1 (exact)
        if numpy_rounding:
            pm1.mul_(scale if w is None else scale * w.to(out.dtype))  # ±(scale·w): one product
            _rows.add_rows_(out, t, pm1, None, fused=False)
        else:
            pm1.mul_(scale)
            _rows.add_rows_(out, t, pm1, w, fused=True)
        return out

    def _add_rows_chunked(self, out: torch.Tensor, tgt: torch.Tensor | None, packed: torch.Tensor,
                          scale: torch.Tensor, w: torch.Tensor | None, numpy_rounding: bool) -> None:
        """Long CPU rows of :meth:`_fast_decode_add_rows`, row after row, :data:`_CHUNK`
        entries at a time: ``±scale`` (or ``±(scale·w)``) from a 256 × 8 table straight into
        an in-cache scratch, then added to the chunk of ``out`` by the same op as the whole-row
        path (plain add, or ``addcmul`` with w), so the same bits in one pass over ``out``
        instead of six. Chunks start at multiples of 64 entries: torch's vector loops split
        each chunk as they split the whole row."""
        m, d = packed.shape[0], out.shape[1]
        wd = None if w is None else w.to(out.dtype)
        factor = scale if wd is None or not numpy_rounding else scale * wd  # [m, 1]
        targets = range(m) if tgt is None else tgt.tolist()
        if self._add_rows_jit(out, targets, packed, factor, None if numpy_rounding else wd):
            return
        tt, tmp = self.ws.pair("rows.chunk", min(d, _CHUNK) + 8, out.dtype)
        base = bits.pm1_table(out.dtype, out.device)
        pn = packed.numpy()
        for r, t in enumerate(targets):
            table = (base * factor[r]).numpy()  # ±scale: exact
            for a in range(0, d, _CHUNK):
                b = min(a + _CHUNK, d)
                nb = -(-(b - a) // 8)
                np.take(table, pn[r, a // 8 : a // 8 + nb], axis=0, out=tmp[: 8 * nb].reshape(nb, 8))
                dst, src = out[t : t + 1, a:b], tt[: b - a].view(1, -1)
                if numpy_rounding or wd is None:
                    dst.add_(src)
                else:
                    dst.addcmul_(src, wd[r : r + 1])

    def _add_rows_jit(self, out: torch.Tensor, targets, packed: torch.Tensor,
                      factor: torch.Tensor, wd: torch.Tensor | None) -> bool:
        """:meth:`_add_rows_chunked` by the numba kernel ``sign_add`` (:mod:`.jit`), one pass
        per row: ``out += ±factor`` (``wd`` None), else ``out.addcmul_(±factor, wd)`` as
        torch rounds it here (:func:`.jit.torch_rounding`); False without numba, or where that
        rounding is not identified."""
        fn = dispatch.jit_kernel("sign_add")
        if fn is None:
            return False
        on, pn = out.numpy(), packed.numpy()
        dt = on.dtype.type
        fused = False
        if wd is not None:
            mode = jit.torch_rounding("addcmul", dt)
            if mode == 0:
                return False
            fused = mode == 1
            if not fused:  # addcmul rounds factor·w, then adds: a plain add of ±(factor·w)
                factor, wd = factor * wd, None
        s, w = factor.numpy(), (wd.numpy() if wd is not None else None)
        table, flags = bits._bytes_table(), self.ws.host("jit.flags", jit.SIGN_CHUNK, torch.uint8)
        for r, t in enumerate(targets):
            fn(pn[r], table, s[r, 0], w[r, 0] if fused else dt(0), fused, flags, on[t])
        return True

    # ------------------------------------------------------------ chunks of messages
    @no_grad
    def _fast_encode_split_rows(self, X, n, *, out=None):
        """The scale of the whole row (:meth:`_norm_rows`) in every chunk's body, and each
        chunk's ``X < 0`` packed into its own body (chunks of a multiple of 8 entries pack
        to the bytes of the whole row)."""
        X = X.detach()
        res = self._split_out(X, n, out)
        m, d = X.shape
        norms = self._norm_rows(X)
        if self.check_finite:
            _rows.encode_error(self, X, ~torch.isfinite(norms), f"{self.norm_name} is not finite")
        part = self.chunk_sections(X[0], n)
        scale = self._scale_of(norms, d).to(X.dtype).view(m, 1).view(torch.uint8)  # its bytes
        at, size = part.offsets[0], scale.shape[1]
        res[:, :, at : at + size].copy_(scale.unsqueeze(1).expand(m, n, size))
        at, nb = part.offsets[1], part.counts[1]
        _rows.pack_rows(_rows.chunk_rows(X, n) < 0, d // n, res[:, :, at : at + nb].view(m * n, nb))
        return res

    def _fast_decode_add_bodies(self, out, bodies):
        """±1 from the table, added times the scale in one pass (``addcmul``: the product
        ±scale is exact, so this rounds as ``out + C(x)`` does)."""
        v = self.body_views(bodies, out)
        k, d = out.shape
        pm1 = _rows.scratch(self, "pm1", (k, 8 * v["bits"].shape[1]), out.dtype, out.device)
        out.addcmul_(_rows.pm1_rows(v["bits"], pm1, self.ws)[:, :d], v["scale"])
        return out

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


class ScaledSignL2(ScaledSign):
    """``C(x) = (‖x‖₂/√d)·sign(x)`` with sign(0) = +1: the norm-preserving scale of DeepSpeed's
    1-bit Adam (‖C(x)‖ = ‖x‖).

    Not contractive in the worst case (a 10-sparse vector in R^2000 comes back with relative
    error ≈ 1.37, ‖C(x) − x‖ > ‖x‖), hence ``delta_for`` is None; on Gaussian data it is ≈ 0.64 (ℓ1: 0.61).
    Prefer ``sign`` (ℓ1 scale) with error-feedback gossip; use this one for parity with 1-bit
    Adam. Same wire format and size as ``sign``.
    """

    kind: ClassVar[int] = 21
    norm_name: ClassVar[str] = "‖x‖₂"
    abs_norm: ClassVar[bool] = False

    def delta_for(self, numel: int) -> float | None:
        return None

    def _norm(self, xf: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(xf, dtype=_accumulator(xf.dtype))

    def _norm_dim1(self, X: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(X, dim=1)

    def _scale_of(self, norm, d: int):
        return norm / math.sqrt(d)


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype a norm of ``dtype`` entries is summed in: float32 for the half types."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _expand_host(packed: np.ndarray, scale, out: np.ndarray) -> None:
    """``out = scale·(±1)`` from the packed sign bits: ``scale − 2·scale·bit``, exact."""
    b = np.unpackbits(packed, count=out.size, bitorder="little")
    np.multiply(b, -2 * scale, out=out, dtype=out.dtype)  # -2·scale: exact
    out += scale
