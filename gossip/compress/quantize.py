"""Stochastic quantizers: QSGD (2-norm), LEAD's ∞-norm quantizer, natural compression."""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch

from gossip.compress import bits, dispatch, jit
from gossip.compress import rows as _rows
from gossip.compress.checks import check_scalar, nonfinite, quiet, tame
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of
from gossip.errors import CompressionError

_TORCH_OF = {np.float32: torch.float32, np.float64: torch.float64}
_NP_FLOAT = {torch.float32: np.float32, torch.float64: np.float64}
_TORCH_INT = {np.uint8: torch.uint8, np.uint16: torch.uint16, np.int32: torch.int32}
_I23, _CARRY, _F0 = np.int32(23), np.int32((1 << 22) + (1 << 6)), np.float32(0)


#: entries per chunk of the CPU encoders (a multiple of 64): a chunk's words, dither, codes and
#: planes stay in cache, where a whole-vector pass would stream through memory; smaller chunks
#: cost more in per-call numpy overhead than they save
CHUNK = 1 << 18

#: uint64 table entries per lookup of the block decoders' unpacking (256 KiB: in cache)
_UNPACK_TILE = 1 << 15

#: entries per chunk of the long-row decode-add (64 KiB of float32: in cache)
_CHUNK_ADD = 1 << 14


class LevelQuantizer(Codec):
    """Unbiased stochastic rounding to ``s`` levels of a norm: shared by QSGD and LEAD.

    With ``n = norm(x)`` and ``y_i = s·x_i/n ∈ [−s, s]``, each entry becomes the integer
    ``ŷ_i = ⌊y_i + u_i⌋``, u_i ~ U[0, 1): ``E ŷ_i = y_i``, and ŷ_i is ⌊y_i⌋ or ⌈y_i⌉, so
    ``sign(x_i)·|ŷ_i|`` has exactly QSGD's law (level ⌊s|x_i|/n⌋ plus Bernoulli(frac)).
    The decoded value is ``ŷ_i · n/s``; n = 0 gives 0.

    Wire: the step ``q = n/s`` (input dtype; times the scale factor of a ``biased`` variant),
    then codes ``ŷ_i + 2^{w−1}`` of ``w = ⌈log2(2s+1)⌉`` bits (sign and level jointly: 2s + 1
    symbols; equal to 1 + ⌈log2(s+1)⌉) in bit planes (:mod:`.bits`):
    ``8 + itemsize + w·⌈d/8⌉`` bytes. The receiver needs only w (header parameter) and q.

    Randomness (:mod:`gossip.rng`): u is a 16-bit dither ``(k + ½)·2⁻¹⁶``, k uniform on
    {0, …, 2¹⁶ − 1}, four per hashed 64-bit word of the caller's stream; P(round up) is then
    the fraction of y rounded to a multiple of 2⁻¹⁶, so ``E ŷ_i = y_i`` up to 2⁻¹⁷ of a level.
    ``t = (o + u) + x·(s/n)`` truncates to the code directly; float32 math resolves t to
    2^{w−24}, so for w > 10 the arithmetic runs in float64.

    Speed (CPU): the numpy path streams the draw in chunks of :data:`CHUNK` entries
    (:meth:`gossip.rng.Draw16.chunks`), each chunk's words hashed right before its dither, codes
    and planes (all planes of a chunk in one ``bitwise_and`` and one ``packbits``), so the
    passes stay in cache instead of streaming through memory (timings: docs/performance.md).
    ``decode_add_rows_`` is vectorized (all rows' codes at once).
    """

    randomized: ClassVar[bool] = True
    uses_stream: ClassVar[bool] = True
    unbiased: ClassVar[bool] = True
    param_name: ClassVar[str] = "bit width"
    scale_sections: ClassVar[tuple[str, ...]] = ("scale",)

    def __init__(self, spec: str, levels: int, scale: str = "none") -> None:
        super().__init__(spec)
        self.s = int(levels)
        self.width = math.ceil(math.log2(2 * self.s + 1))
        self.offset = 1 << (self.width - 1)
        self.biased = scale == "biased"
        self._offsets: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    @property
    def param(self) -> int:
        return self.width

    def _sections(self, shape, dtype) -> Sections:
        d = numel_of(shape)
        return Sections.build(
            ("scale", dtype, 1), ("codes", torch.uint8, bits.packed_nbytes(d, self.width))
        )

    @abstractmethod
    def _norm(self, xf: torch.Tensor) -> torch.Tensor:
        """The norm (0-dim tensor); raises on NaN/Inf when ``check_finite``."""
        ...

    def _factor(self, d: int) -> float:
        """Multiplier of the decoded value (1, or 1/(1+ω) for a ``biased`` variant)."""
        return 1.0 / (1.0 + self.omega_for(d)) if self.biased else 1.0

    def _dither_(self, t: torch.Tensor) -> None:
        """``t = (o + ½ + 2⁻¹⁷) + 2⁻¹⁶·t`` in place, t holding the stream's int16 lanes
        i16 = k − 2¹⁵ (copied exactly): one fused add (2⁻¹⁶·i16 is exact, so the result is
        rounded once, to the nearest value of t's dtype; exact for w ≤ 7 in float32)."""
        torch.add(self._dither_offset(t), t, alpha=2.0**-16, out=t)

    def _dither_offset(self, t: torch.Tensor) -> torch.Tensor:
        key = (t.dtype, t.device)
        c = self._offsets.get(key)
        if c is None:
            c = self._offsets[key] = torch.tensor(self.offset + 0.5 + 2.0**-17, dtype=t.dtype,
                                                  device=t.device)
        return c

    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        """The dither ``o + u`` from every row's stream, plus ``y = s·x/n``, truncated to the
        codes and packed in bit planes, for the block at once. A row's norm and its scaled
        add ``t += (s/n)·x`` are torch calls on the row alone: a reduction over a block's
        row sums in another order than over the row, and ``add(alpha=)`` rounds as a
        broadcast product need not (the numpy twin and numba's kernel match the row's)."""
        m, d = X.shape
        dev, s = X.device, self.s
        norms = []
        for r in range(m):
            try:
                norms.append(self._norm(X[r]))
            except CompressionError as exc:
                exc.row = r
                raise
        n = torch.stack(norms)
        v["scale"].copy_(n.view(m, 1) * (self._factor(d) / s))
        work = torch.float64 if self.width > 10 else X.dtype
        t = _rows.scratch(self, "t", (m, d), work, dev)
        t.copy_(rng.bits16(d, dev, out=self.ws.get("rng.words", m * -(-d // 4), torch.int64, dev)))
        self._dither_(t)
        if dev.type == "cpu" or self.check_finite:  # the norms are on the host anyway
            for r, nv in enumerate(n.tolist()):
                self._add_levels(t[r], X[r], nv)
        else:  # no host sync: n = 0 means x = 0, any finite step gives codes o
            t.addcdiv_(X, torch.where(n > 0, n / s, torch.ones_like(n)).to(work).view(m, 1))
        self._pack_rows(t, v["codes"])

    def _pack_rows(self, t: torch.Tensor, out: torch.Tensor) -> None:
        """Pack the codes ⌊t⌋ (clamped to the 2s + 1 levels) of every row of ``t`` ([m, d])
        into its bit planes ``out`` ([m, w·⌈d/8⌉]; layout :func:`.bits.pack_codes`)."""
        m, d = t.shape
        o, s, w = self.offset, self.s, self.width
        n8 = bits.nbytes_bits(d)
        codes = _rows.scratch(self, "pack", (m, 8 * n8), bits.code_dtype(w), t.device)
        if o + s + 1 > 255 and codes.dtype == torch.uint8:
            t.clamp_(max=o + s)  # a float rounded up to 256 would wrap to 0 in uint8
        bits.cast_into(codes[:, :d], t)  # truncation = floor (t > 0)
        codes[:, :d].clamp_(o - s, o + s)  # float rounding at |y| = s
        codes[:, d:].zero_()
        first = 0
        if w >= 8:
            out[:, : 8 * n8].copy_(codes)  # the low byte of every code
            first = 8
        for j in range(first, w):
            _rows.pack_rows(torch.bitwise_and(codes, 1 << j) != 0, d, out[:, j * n8 : (j + 1) * n8])

    def _decode_batch(self, v: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        codes = self._unpack_rows(v["codes"], out.shape[1])
        out.copy_(torch.from_numpy(codes) if isinstance(codes, np.ndarray) else codes)
        out.sub_(self.offset).mul_(v["scale"])  # (code - o)·q

    def _check_batch(self, v: dict[str, torch.Tensor], d: int) -> None:
        lo, hi = _row_range(self._unpack_rows(v["codes"], d))
        if bool(((lo < self.offset - self.s) | (hi > self.offset + self.s)).any()):
            raise self._bad_codes()

    def _bad_codes(self) -> CompressionError:
        lo, hi = self.offset - self.s, self.offset + self.s
        return CompressionError(
            f"{self.spec}: the message holds codes outside the {2 * self.s + 1} levels "
            f"[{lo}, {hi}] of its {self.width}-bit codes (the message is corrupt)")

    # ------------------------------------------------------- numpy fast path (CPU)
    @abstractmethod
    def _norm_host(self, x: torch.Tensor, xn: np.ndarray) -> float:
        """The norm as a Python float (the value :meth:`_norm` gives); checks NaN/Inf."""
        ...

    def _encode_host(self, plan, x, xn, generator, v) -> dict[str, Any]:
        d = xn.size
        nv = self._norm_host(x, xn)
        factor = plan.extra.get("factor")
        if factor is None:
            factor = plan.extra["factor"] = self._factor(d) / self.s
        dt = v["scale"].dtype.type
        v["scale"][0] = dt(nv) * dt(factor)  # as torch: in the input dtype
        draw = generator.draw16(d)[0]
        if self._encode_jit(xn, draw, nv, v["codes"]):
            return v
        work = torch.float64 if self.width > 10 else x.dtype
        xs = (x.view(-1) if x.dim() != 1 else x).split(CHUNK)
        for (a, b, lanes), xc in zip(draw.chunks(CHUNK), xs):
            tt, t = self.ws.pair("t", b - a, work)  # every pass below stays in cache
            np.copyto(t, lanes)
            self._dither_(tt)
            self._add_levels(tt, xc, nv)  # in torch, as the torch path (fused a + αb: same bytes)
            bits.pack_codes_np(self._codes_host(tt, t), self.width, v["codes"], self.ws, a, d)
        return v

    def _encode_jit(self, xn: np.ndarray, draw, nv: float, out: np.ndarray) -> bool:
        """The codes of :meth:`_encode_host`'s loop by the numba kernel ``level_codes``
        (:mod:`.jit`: hash, dither, levels, codes and planes in one pass over x); False where
        it does not serve (no numba, too few entries (:func:`.dispatch.jit_kernel`), widths of 8 and
        more, lanes given rather than keyed, a norm below 1e-30 or not finite, torch's
        ``add(alpha=)`` rounding not identified): the caller runs the loop."""
        key = draw.key
        if (self.width >= 8 or key is None or not (nv == 0 or 1e-30 <= nv < math.inf)
                or xn.dtype.type not in (np.float32, np.float64)):
            return False
        fn = dispatch.jit_kernel("level_codes", xn.size)
        mode = jit.torch_rounding("add_alpha", xn.dtype.type) if fn is not None else 0
        if mode == 0:
            return False
        dt = xn.dtype.type
        o, s = self.offset, self.s
        words = self.ws.host("jit.words", jit.LEVEL_CHUNK // 4, torch.int64).view(np.uint64)
        codes = self.ws.host("jit.codes", jit.LEVEL_CHUNK, torch.uint8)
        planes = out[: self.width * bits.nbytes_bits(xn.size)].reshape(self.width, -1)
        fn(xn, np.uint64(key[0]), np.uint64(key[1]), dt(o + 0.5 + 2.0**-17),
           dt(s / nv) if nv else dt(0), mode if nv else 0, o - s, o + s, planes, words, codes)
        return True

    def _codes_host(self, tt: torch.Tensor, t: np.ndarray) -> np.ndarray:
        """codes = ⌊t⌋ clamped to [o − s, o + s] (float rounding at |y| = s), as the torch
        path (a workspace array of ``host_code_dtype(width)``)."""
        o, s, n = self.offset, self.s, t.size
        if self.width <= 8:  # clamp the uint8 codes (a quarter of the bytes of t)
            if o + s + 1 > 255:
                tt.clamp_(max=o + s)  # a float rounded up to 256 would wrap to 0 in uint8
            codes = self.ws.host("codes", n, torch.uint8)
            np.copyto(codes, t, casting="unsafe")  # truncation = floor (t > 0)
            codes.clip(np.uint8(o - s), np.uint8(o + s), out=codes)
        else:  # wider codes (uint16: no torch clamp): clamp t, the same codes
            tt.clamp_(o - s, o + s)
            codes = self.ws.host("codes", n, _TORCH_INT[bits.host_code_dtype(self.width)])
            np.copyto(codes, t, casting="unsafe")
        return codes

    def _parse_host(self, v: dict[str, Any], numel: int) -> dict[str, Any]:
        """numpy twin of :meth:`_check_batch`: refuse codes outside the 2s + 1 levels."""
        lo, hi = self.offset - self.s, self.offset + self.s
        if not bits.codes_within_np(v["codes"], numel, self.width, lo, hi, self.ws):
            raise self._bad_codes()
        return v

    def _expand_host(self, packed: np.ndarray, step, out: np.ndarray) -> None:
        """``out = (c − o)·step`` from the packed codes c (the torch path's arithmetic)."""
        codes = bits.unpack_codes_np(packed, out.size, self.width, self.ws)
        np.copyto(out, codes, casting="unsafe")
        out -= self.offset
        out *= step

    def _decode_host(self, host, out: np.ndarray) -> None:
        q = host["scale"][0]
        if tame(q, 1 << self.width):
            self._expand_host(host["codes"], q, out)
        else:  # a corrupt step: Inf/NaN, as torch gives, without warnings
            with quiet():
                self._expand_host(host["codes"], q, out)

    def _decode_add_host(self, host, out: np.ndarray, weight: float) -> None:
        q = host["scale"][0]
        if not tame(q, weight, 1 << self.width):
            with quiet():
                return self._decode_add_host_(host["codes"], q, out, weight)
        return self._decode_add_host_(host["codes"], q, out, weight)

    def _decode_add_host_(self, packed, q, out: np.ndarray, weight: float) -> None:
        tmp = self.ws.host("decode_add", out.size, _TORCH_OF[out.dtype.type])
        self._expand_host(packed, q * q.dtype.type(weight), tmp)
        out += tmp

    # ------------------------------------------------------------ blocks of nodes
    ordered_rows: ClassVar[bool] = True

    #: CPU blocks of one row or of long rows one row at a time through the numpy twin (the
    #: draw hashed chunk by chunk in cache, or numba's one pass)
    _fast_encode_rows = _rows.encode_rows_looped

    def _fast_decode_add_rows(self, out, block, weight=1.0, *, rows=None, check=True):
        """Rows the single message's numpy twin would add (:func:`.dispatch.host_decode`: CPU
        float32/float64 rows numpy can write), with its rounding, ``(c − o)·(q·w)`` rounded,
        then added: long rows by numba's ``level_add`` or in cache-sized chunks, row after
        row, others for the block at once. ``check``: header, scale (finite, ≥ 0) and codes
        within the 2s + 1 levels of every row, the first bad row raising its error. Other
        rows: the reference."""
        st = _rows.start_decode(self, out, block, weight, rows, check)
        if st is None or not dispatch.host_decode(self, out):
            return self._decode_add_rows_ref(out, block, weight, rows, check)
        plan, block, tgt, w, bad = st
        m, d = block.shape[0], out.shape[1]
        scale = _rows.section(block, plan, "scale")  # [m, 1] of out's dtype
        t = None if rows is None else tgt
        if self._add_rows_jit(out, t, block, plan, scale, w, bad):
            return out
        codes = self._unpack_rows(_rows.section(block, plan, "codes"), d)
        if check:
            lo, hi = _row_range(codes)
            bad = _rows.value_mask(self, {"scale": scale}, bad)
            bad = bad | (lo < self.offset - self.s) | (hi > self.offset + self.s)
            _rows.bad_row(self, out, block, tgt, bad, "codes outside the levels")
        step = scale if w is None else scale * w.to(out.dtype)  # q·w in the dtype: one product
        if dispatch.loop_rows(d):
            self._add_codes_chunked(out.numpy(), t, codes, step.numpy())
            return out
        vals = _rows.scratch(self, "vals", (m, d), out.dtype, out.device)
        np.copyto(vals.numpy(), codes, casting="unsafe")
        vals.sub_(self.offset)  # exact
        _rows.add_rows_(out, t, vals.mul_(step), None, fused=False)  # rounded twice, as numpy
        return out

    def _add_rows_jit(self, out: torch.Tensor, tgt: torch.Tensor | None, block: torch.Tensor,
                      plan, scale: torch.Tensor, w: torch.Tensor | None,
                      bad: torch.Tensor | None) -> bool:
        """Long CPU rows of :meth:`_fast_decode_add_rows` by the numba kernel ``level_add``
        (:mod:`.jit`), row after row, after every row's checks passed (header, scale, codes
        within the levels: a bad row leaves ``out`` untouched and returns False, so the caller
        raises its error); False where the kernel does not serve (no numba, widths of 8 and
        more, rows too short for :func:`.dispatch.loop_rows`, the torch path)."""
        d = out.shape[1]
        if self.width >= 8 or not dispatch.loop_rows(d) or not dispatch.host_decode(self, out):
            return False
        fn = dispatch.jit_kernel("level_add")
        if fn is None:
            return False
        m, n8 = block.shape[0], bits.nbytes_bits(d)
        planes = _rows.section(block, plan, "codes").numpy()[:, : self.width * n8]
        planes = planes.reshape(m, self.width, n8)
        table, on = bits._bytes_table(), out.numpy()
        codes = self.ws.host("jit.codes", jit.LEVEL_CHUNK, torch.uint8)
        o = on.dtype.type(self.offset)
        step = (scale if w is None else scale * w.to(out.dtype)).numpy()  # q·w in the dtype
        if bad is not None:
            bad = _rows.value_mask(self, {"scale": scale}, bad)
            if bool(bad.any()):
                return False
            lo, hi = self.offset - self.s, self.offset + self.s
            if not all(fn(planes[r], table, o, o, lo, hi, False, codes, on[0]) for r in range(m)):
                return False
        for r, t in enumerate(range(m) if tgt is None else tgt.tolist()):
            fn(planes[r], table, o, step[r, 0], 0, 0, True, codes, on[t])  # (numba never warns)
        return True

    def _add_codes_chunked(self, out: np.ndarray, tgt: torch.Tensor | None, codes: np.ndarray,
                           step: np.ndarray) -> None:
        """``out[tgt[r]] += (c − o)·step[r]`` for the [m, d] codes of long rows, row after row
        in chunks of :data:`_CHUNK_ADD` entries: the float values never leave the cache (one
        pass over ``out`` instead of four over [m, d] floats), with the whole-row numpy path's
        roundings (each op elementwise and correctly rounded: the same bits)."""
        m, d = codes.shape
        tmp = self.ws.host("decode_add.chunk", min(d, _CHUNK_ADD), _TORCH_OF[out.dtype.type])
        offset = out.dtype.type(self.offset)
        for r, t in enumerate(range(m) if tgt is None else tgt.tolist()):
            q = step[r, 0]
            for a in range(0, d, _CHUNK_ADD):
                b = min(a + _CHUNK_ADD, d)
                v = tmp[: b - a]
                np.copyto(v, codes[r, a:b], casting="unsafe")
                v -= offset  # exact
                v *= q
                out[t, a:b] += v

    def _unpack_rows(self, packed: torch.Tensor, d: int) -> np.ndarray | torch.Tensor:
        """The [m, d] codes of the packed rows ``packed`` ([m, nbytes]): a numpy array on the
        numpy path, else a tensor."""
        m, w = packed.shape[0], self.width
        n8 = bits.nbytes_bits(d)
        if dispatch.numpy_path(packed.device):
            pn = packed.numpy()
            dt = bits.host_code_dtype(w)
            codes = _rows.scratch(self, "codes", (m, d), _TORCH_INT[dt], packed.device).numpy()
            if w < 8:  # 8 entries per table lookup, in cache-sized tiles of rows × bytes
                table = bits._bytes_table()
                shifts = bits._plane_shifts(w)
                planes = pn[:, : w * n8].reshape(m, w, n8)
                c8 = min(n8, max(1, _UNPACK_TILE // w))  # packed bytes of a plane per tile
                group = max(1, _UNPACK_TILE // (w * c8))
                for a in range(0, m, group):
                    b = min(a + group, m)
                    for c in range(0, n8, c8):
                        e = min(c + c8, n8)
                        g = table.take(planes[a:b, :, c:e])
                        g <<= shifts
                        words = np.bitwise_or.reduce(g, axis=1)  # [rows, e − c] uint64
                        hi = min(8 * e, d)
                        codes[a:b, 8 * c : hi] = words.view(np.uint8)[:, : hi - 8 * c]
            else:
                for r in range(m):
                    codes[r] = bits.unpack_codes_np(pn[r], d, w, self.ws)[:d]
            return codes
        codes = _rows.scratch(self, "codes", (m, d), bits.code_dtype(w), packed.device)
        for r in range(m):
            codes[r] = bits.unpack_codes(packed[r], d, w, self.ws, packed.device)[:d]
        return codes

    def _add_levels(self, t: torch.Tensor, xf: torch.Tensor, nv: float) -> None:
        """``t += y``, y = s·x/n in [−s, s]: o + u + y in [o − s, o + s + 1) (both paths)."""
        if nv >= 1e-30:
            t.add_(xf, alpha=self.s / nv)
        elif nv > 0:  # s/n would overflow float32: divide instead
            t.addcdiv_(xf, torch.full((), nv / self.s, dtype=t.dtype, device=t.device))


def _row_range(codes: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The [m] int64 minima and maxima of the rows of ``codes`` (numpy or torch)."""
    if isinstance(codes, np.ndarray):
        return (torch.from_numpy(codes.min(1).astype(np.int64)),
                torch.from_numpy(codes.max(1).astype(np.int64)))
    lo, hi = torch.aminmax(codes.to(torch.int32) if codes.dtype == torch.uint8 else codes, dim=1)
    return lo.long(), hi.long()


class QSGD(LevelQuantizer):
    """QSGD with ``s`` levels of the 2-norm (Alistarh et al. 2017); see LevelQuantizer.

    Unbiased, ω = min(d/s², √d/s) (``omega_for(d)``). ``biased`` variant ("qsgd-biased",
    BEER's torch ``gsgd``): decoded value / (1 + ω), contractive with δ = 1/(1+ω), not
    unbiased. ``qsgd:BITS`` means s = 2^{BITS−1} (BEER/NDA's ``gsgd_b``), i.e. BITS + 1 bits
    per entry on the wire; ``qsgd:s=LEVELS`` gives s directly.
    Bytes: ``8 + itemsize + w·⌈d/8⌉`` with w = ⌈log2(2s+1)⌉ = 1 + ⌈log2(s+1)⌉
    (docs/compressors.md's fixed-length 32 + d·(1 + ⌈log2(s+1)⌉) bits, up to w − 1 bytes of plane padding).
    The NaN/Inf check reads ‖x‖₂ (computed anyway).
    """

    kind: ClassVar[int] = 7

    def __init__(self, spec: str, levels: int, scale: str = "none") -> None:
        super().__init__(spec, levels, scale)
        if self.biased:
            self.unbiased = False

    def omega_for(self, numel: int) -> float | None:
        return min(numel / self.s**2, math.sqrt(numel) / self.s)

    def delta_for(self, numel: int) -> float | None:
        return 1.0 / (1.0 + self.omega_for(numel)) if self.biased else None

    def _norm(self, xf: torch.Tensor) -> torch.Tensor:
        n = torch.linalg.vector_norm(xf)
        if self.check_finite:
            check_scalar(n, xf, self.spec, "‖x‖₂")
        return n

    def _norm_host(self, x: torch.Tensor, xn: np.ndarray) -> float:
        n = torch.linalg.vector_norm(x)  # torch on both paths: the same bytes
        nv = n.item()
        if self.check_finite and not math.isfinite(nv):
            check_scalar(n, x, self.spec, "‖x‖₂")
        return nv


class LeadQuantizer(LevelQuantizer):
    """LEAD's unbiased b-bit ∞-norm quantizer (docs/compressors.md): s = 2^{b−1} levels of ‖x‖_∞.

    ``C(x) = (‖x‖_∞/2^{b−1})·sign(x)⊙⌊2^{b−1}|x|/‖x‖_∞ + u⌋``; the largest entry is sent
    exactly. Unbiased, ω ≤ min(d/4^b, √d/2^{b−1}). 2^b + 1 symbols in ⌈log2(2^b + 1)⌉ = b + 1
    bits: ``8 + itemsize + (b+1)·⌈d/8⌉`` bytes (the paper counts 32 + b·d bits).
    The NaN/Inf check reads ``aminmax(x)`` (computed anyway for ‖x‖_∞).
    """

    kind: ClassVar[int] = 8

    def __init__(self, spec: str, bits_: int) -> None:
        super().__init__(spec, 1 << (bits_ - 1))
        self.b = bits_

    def omega_for(self, numel: int) -> float | None:
        return min(numel / 4.0**self.b, math.sqrt(numel) / 2.0 ** (self.b - 1))

    def _norm(self, xf: torch.Tensor) -> torch.Tensor:
        lo, hi = torch.aminmax(xf)
        n = torch.maximum(-lo, hi)
        if self.check_finite and not bool(torch.isfinite(torch.stack((lo, hi))).all()):
            raise nonfinite(self.spec)  # aminmax propagates NaN
        return n

    def _norm_host(self, x: torch.Tensor, xn: np.ndarray) -> float:
        lo, hi = (float(v) for v in torch.aminmax(x))  # one pass over x; propagates NaN
        finite = math.isfinite(lo) and math.isfinite(hi)
        if self.check_finite and not finite:
            raise nonfinite(self.spec)
        if not finite or lo == hi == 0:  # a NaN or zero step: its sign bit as numpy's min and
            lo, hi = float(xn.min()), float(xn.max())  # max give it (the wire's, always)
        return max(-lo, hi)


class Natural(Codec):
    """Natural compression (Horváth et al. 2019): round |x_i| to a neighbouring power of two.

    ``C(x)_i = sign(x_i)·2^a`` w.p. 1 − p, ``sign(x_i)·2^{a+1}`` w.p. p, with
    a = ⌊log2|x_i|⌋ and p = |x_i|/2^a − 1; 0 ↦ 0. Unbiased, ω = 1/8 (entries with
    |x_i| ≥ 2⁻¹²⁶). Entries below 2⁻¹²⁶ (subnormal in float32) round unbiasedly to 0 or 2⁻¹²⁶;
    magnitudes above 2¹²⁷ raise :class:`CompressionError`.
    Wire: an 8-bit exponent code per entry (0 = zero, c ↦ 2^{c−127}, i.e. float32's biased
    exponent), then the sign bits: ``8 + d + ⌈d/8⌉`` bytes = 9 bits per entry.

    Encoding works on the float bits: for float32, the low byte of ``(bits + r) >> 23`` with r
    uniform on [0, 2²³) *is* the rounded exponent code (the mantissa carries into the exponent
    with probability mantissa/2²³ = p), and on zeros and subnormals it gives exactly the rule
    above; the sign bits are packed apart. r is a 16-bit dither of the caller's stream
    (:mod:`gossip.rng`), ``r = 2⁷·k + 2⁶``, k uniform on {0, …, 2¹⁶ − 1}: the carry happens
    with probability p rounded to a multiple of 2⁻¹⁶, i.e. unbiased up to 2⁻¹⁷·2^a.
    float64 inputs are first scaled by 2⁻⁸⁹⁶ so their exponent field lines up with float32's.
    The NaN/Inf and range check is one ``aminmax`` of x; the numpy path runs in chunks of
    :data:`CHUNK` entries, as :class:`LevelQuantizer`; ``decode_add_rows_`` is vectorized.
    """

    kind: ClassVar[int] = 9
    randomized: ClassVar[bool] = True
    uses_stream: ClassVar[bool] = True
    fused_add: ClassVar[bool] = True  # w·C(x) is exact (a power of two) short of under/overflow
    unbiased: ClassVar[bool] = True
    omega = 1.0 / 8.0

    def _sections(self, shape, dtype) -> Sections:
        d = numel_of(shape)
        return Sections.build(("exps", torch.uint8, d), ("signs", torch.uint8, bits.nbytes_bits(d)))

    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        m, d = X.shape
        dev = X.device
        if self.check_finite:
            lo, hi = torch.aminmax(X, dim=1)  # one pass; a host sync on CUDA
            big = torch.maximum(-lo, hi)
            bad = ~torch.isfinite(big) | (big > 2.0**127)
            if X.dtype == torch.float16:
                bad |= big > 2.0**15
            r = _rows.first(bad)
            if r is not None:
                try:
                    self._check_range(float(lo[r]), float(hi[r]), X.dtype)
                except CompressionError as exc:
                    exc.row = r
                    raise
        W = X
        if X.dtype in (torch.float16, torch.bfloat16):  # exact in float32, whose bits we round
            W = _rows.scratch(self, "wide", (m, d), torch.float32, dev).copy_(X)
        if W.dtype == torch.float32:
            ibits, itype, mant = W.view(torch.int32), torch.int32, 23
        else:
            scaled = _rows.scratch(self, "scaled", (m, d), torch.float64, dev)
            torch.mul(W, 2.0**-896, out=scaled)
            ibits, itype, mant = scaled.view(torch.int64), torch.int64, 52
        # (bits + r) >> mant: the mantissa carries into the exponent with probability p. A set
        # sign bit only adds -2^(31 - mant) (resp. -2^(63 - mant)), a multiple of 256 after
        # the shift, so the low byte (kept by the cast) is the exponent code of |x_i|.
        # r = 2^(mant-16)·k + 2^(mant-17), k uniform on {0, …, 2^16 − 1} (the 16-bit lanes
        # i16 = k − 2^15 of the stream's words): r < 2^mant, and the carry happens with
        # probability p rounded to the nearest multiple of 2^-16 (bias ≤ 2^-17 of 2^a)
        b = rng.bits16(d, dev, out=self.ws.get("rng.words", m * -(-d // 4), torch.int64, dev))
        r = _rows.scratch(self, "r", (m, d), itype, dev)
        r.copy_(b)  # widen first: a copy plus a same-dtype add beats one mixed-dtype add
        torch.add(ibits, r, alpha=1 << (mant - 16), out=r)
        r.add_((1 << (mant - 1)) + (1 << (mant - 17))).bitwise_right_shift_(mant)
        bits.cast_into(v["exps"], r)
        _rows.pack_rows(X < 0, d, v["signs"])  # -0.0 and NaN give 0

    def _decode_batch(self, v: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        """float32 values ``(code << 23) | sign << 31`` (then ``out``'s dtype)."""
        m, d = out.shape
        direct = out.dtype == torch.float32 and out.is_contiguous()
        vals = out if direct else _rows.scratch(self, "f32", (m, d), torch.float32, out.device)
        vi = vals.view(torch.int32)
        vi.copy_(v["exps"])
        vi.bitwise_left_shift_(23)
        signs = v["signs"]  # the sign bits at bit 31, 8 entries per byte from a table
        nb = signs.shape[1]
        idx = _rows.scratch(self, "sign.idx", (m, nb), torch.int32, out.device)
        idx.copy_(signs)
        sgn = _rows.scratch(self, "sign32", (m, 8 * nb), torch.int32, out.device)
        torch.index_select(bits.signbit32_table(out.device), 0, idx.view(-1),
                           out=sgn.view(m * nb, 8))
        vi.bitwise_or_(sgn[:, :d])
        if not direct:
            out.copy_(vals)

    def _check_batch(self, v: dict[str, torch.Tensor], d: int) -> None:
        if int(v["exps"].amax()) == 255:
            raise CompressionError(f"{self.spec}: exponent code 255 is invalid (would decode to Inf)")

    def _parse_host(self, v: dict[str, Any], d: int) -> dict[str, Any]:
        """The numpy twin of :meth:`_check_batch` for a CPU message (one ``max`` over the
        codes, a fraction of a torch reduction's call cost)."""
        if int(v["exps"].max()) == 255:
            raise CompressionError(f"{self.spec}: exponent code 255 is invalid (would decode to Inf)")
        return v

    def _encode_host(self, plan, x, xn, generator, v) -> dict[str, Any]:
        """The numpy twin of :meth:`_encode_batch` for float32 (the same integer ops, chunk by
        chunk); float64 runs the batch form on views of the same message."""
        if xn.dtype != np.float32:
            self._encode_body(x, generator, {k: torch.from_numpy(a) for k, a in v.items()})
            return v
        if self.check_finite:
            lo, hi = torch.aminmax(x)  # one pass over x
            self._check_range(float(lo), float(hi))
        d = xn.size
        ibits = x.view(-1).view(torch.int32).split(CHUNK)
        exps, signs = v["exps"], v["signs"]
        for (a, b, lanes), ib in zip(generator.draw16(d)[0].chunks(CHUNK), ibits):
            rt, r = self.ws.pair("r", b - a, torch.int32)
            # r = bits + 2^7·i16 + (2^22 + 2^6), then >> 23: the torch path's integer ops
            np.copyto(r, lanes)
            torch.add(ib, rt, alpha=1 << 7, out=rt)
            np.add(r, _CARRY, out=r)
            np.right_shift(r, _I23, out=r)
            np.copyto(exps[a:b], r, casting="unsafe")  # the low byte
            neg = self.ws.host("neg", b - a, torch.bool)
            np.less(xn[a:b], _F0, out=neg)
            signs[a // 8 : a // 8 + bits.nbytes_bits(b - a)] = np.packbits(neg, bitorder="little")
        return v

    #: CPU blocks of one row or of long rows one row at a time through the numpy twin
    _fast_encode_rows = _rows.encode_rows_looped

    def _check_range(self, lo: float, hi: float, dtype: torch.dtype = torch.float32) -> None:
        big = max(-lo, hi)
        if not math.isfinite(big):
            raise nonfinite(self.spec)
        if big > 2.0**127:
            raise CompressionError(
                f"{self.spec}: |x_i| up to {big:.4g} exceeds 2^127, the largest power of "
                "two the 8-bit exponent code holds; the model diverged"
            )
        if dtype == torch.float16 and big > 2.0**15:
            raise CompressionError(
                f"{self.spec}: |x_i| up to {big:.4g} may round up to 2^16, beyond float16's "
                "largest value 65504; use bfloat16 or float32 models"
            )
