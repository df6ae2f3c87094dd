"""Optional numba kernels of the CPU compressors (compiled at first use, then loaded from
numba's on-disk cache).

Each kernel has a numpy/torch twin that gives the same bytes: the callers run the twin when
:func:`get` returns None (numba missing, or :data:`ENABLED` off, which the tests use to
compare both paths). CUDA tensors never come here: their path is pure torch.

* ``topk_candidates``: one pass over the float bits of x (no ``|x|`` array, no mask): the
  indices whose ``|x_i|`` reaches a threshold, and the largest ``|x_i|`` bit pattern (a
  NaN/Inf check for free). Top-k's exact selection then runs on the ~1.3·k candidates.
* ``level_codes``: QSGD's / LEAD's whole encode after the norm (hash, dither, levels, codes,
  bit planes) in one pass over x, a cache-sized chunk at a time; ``level_add`` its
  decode-add (codes unpacked in cache, added with the numpy path's two roundings).
* ``sign_bits``: sign's ``|x|`` (summed by torch afterwards, for the scale's bits) and its
  packed ``x < 0`` bits in one pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: run the numba kernels where they serve (False: every caller takes its numpy/torch twin)
ENABLED = True

_compiled: dict[str, Any] = {}  # name -> dispatcher, or False when numba is not there

_U = np.uint64
_C1, _C2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)  # SplitMix64's (gossip.rng)
_LOW_BITS = _U(0x0101010101010101)  # bit 0 of each byte of a word
_GATHER = _U(sum(1 << (56 - 7 * i) for i in range(8)))  # byte i's bit 0 -> bit 56 + i


def get(name: str) -> Any:
    """The compiled kernel ``name`` (built on first use), or None without numba or when
    :data:`ENABLED` is off."""
    if not ENABLED:
        return None
    fn = _compiled.get(name)
    if fn is None:
        try:
            fn = _BUILDERS[name]()
        except ImportError:
            log.debug("numba is not installed: %s takes the numpy path", name)
            fn = False
        _compiled[name] = fn
    return fn or None


#: entries of x flagged at a time by ``topk_candidates`` (its flags stay in L1)
TOPK_CHUNK = 2048


def _positions() -> tuple[np.ndarray, np.ndarray]:
    """For every 8-bit mask: its set bit positions, lowest first (padded with 0), and count."""
    pos, cnt = np.zeros((256, 8), np.int64), np.zeros(256, np.int64)
    for mask in range(256):
        bits = [i for i in range(8) if mask >> i & 1]
        pos[mask, : len(bits)], cnt[mask] = bits, len(bits)
    return pos, cnt


#: (positions, counts) of the set bits of each byte value (``topk_candidates``' tables)
BYTE_POSITIONS = _positions()


def _topk_candidates() -> Any:
    """``(bits, t, mag, idx, flags, pos, cnt) -> count``: ``bits`` the int32/int64 view of a
    float32/float64 vector, ``t`` the bit pattern of a finite threshold ≥ +0, ``mag`` all bits
    but the sign (0x7f…f of the same width: numba would widen a constant), ``flags`` a bool
    scratch of :data:`TOPK_CHUNK` entries, ``(pos, cnt)`` :data:`BYTE_POSITIONS`. Writes the
    increasing indices i with ``|x_i| ≥ t`` to ``idx[:count]`` (``idx`` needs d + 8 entries),
    comparing sign-cleared bit patterns, which order as the magnitudes, with +inf and NaN
    above every finite value: every NaN/Inf of x is among them.

    Per chunk: one vectorized loop flags the entries, then the flags are read 8 at a time as
    a uint64 word; a nonzero word (~10 % at 1.3 % candidates) becomes an 8-bit mask (one
    multiply) whose positions are stored from the table, branch-free."""
    import numba
    from numba import types as nt

    i1, i2, b1 = nt.Array(nt.int64, 1, "C"), nt.Array(nt.int64, 2, "C"), nt.Array(nt.boolean, 1, "C")
    sigs = [nt.int64(nt.Array(it, 1, "C"), it, it, i1, b1, i2, i1) for it in (nt.int32, nt.int64)]

    @numba.njit(sigs, cache=True, nogil=True, boundscheck=False)
    def topk_candidates(bits, t, mag, idx, flags, pos, cnt):
        n, chunk = bits.shape[0], flags.shape[0]
        words = flags.view(np.uint64)
        c = 0
        for s in range(0, n, chunk):
            size = min(chunk, n - s)
            x = bits[s : s + size]
            for j in range(size):
                flags[j] = (x[j] & mag) >= t
            for j in range(size, (size + 7) // 8 * 8):
                flags[j] = False
            for w in range((size + 7) // 8):
                v = words[w]
                if v != 0:
                    mask = (v * _GATHER) >> _U(56)  # bytes are 0/1: byte i -> bit i
                    base = s + 8 * w
                    for j in range(8):
                        idx[c + j] = base + pos[mask, j]
                    c += cnt[mask]
        return c

    return topk_candidates


#: entries per chunk of ``level_codes`` (a multiple of 64: whole words and plane bytes)
LEVEL_CHUNK = 4096



def _fma() -> Any:
    """A numba intrinsic for ``a·b + c`` rounded once (``llvm.fma``: exact on every target)."""
    from numba.core.extending import intrinsic

    @intrinsic
    def fma(typingctx, a, b, c):  # noqa: ARG001 (numba's intrinsic signature)
        def codegen(context, builder, sig, args):
            return builder.fma(*args)

        return a(a, b, c), codegen

    return fma


def _level_codes() -> Any:
    """``(x, k, g, c, alpha, mode, lo, hi, planes, words, codes) -> None``: the codes of
    :class:`gossip.compress.quantize.LevelQuantizer` (widths below 8) packed into ``planes``
    ([width, ⌈d/8⌉] uint8, the message's bit planes), :data:`LEVEL_CHUNK` entries at a time:
    the words ``fmix64(k + i·g)`` of :mod:`gossip.rng` (four 16-bit lanes each), the dither
    ``t = c + 2⁻¹⁶·lane`` (one rounding), ``t += alpha·x`` (``mode`` 1: fused, 2: the product
    rounded first, 0: no add), ``⌊t⌋`` clipped to [lo, hi], then bit p of 8 codes per plane
    byte by one multiply. The roundings of the numpy path (torch's ``add(alpha=)``, which
    :func:`torch_rounding` identifies); ``words`` / ``codes`` are uint64 / uint8 scratches of
    ``LEVEL_CHUNK / 4`` and ``LEVEL_CHUNK`` entries."""
    import numba
    from numba import types as nt

    fma = _fma()
    u2, i64 = nt.Array(nt.uint8, 2, "C"), nt.int64
    sigs = [nt.void(nt.Array(f, 1, "C"), nt.uint64, nt.uint64, f, f, i64, i64, i64, u2,
                    nt.Array(nt.uint64, 1, "C"), nt.Array(nt.uint8, 1, "C"))
            for f in (nt.float32, nt.float64)]

    @numba.njit(sigs, cache=True, nogil=True, boundscheck=False)
    def level_codes(x, k, g, c, alpha, mode, lo, hi, planes, words, codes):
        d, chunk = x.shape[0], codes.shape[0]
        width = planes.shape[0]
        step16 = x.dtype.type(2.0**-16)
        lo32, hi32 = np.int32(lo), np.int32(hi)
        lanes = words.view(np.int16)
        packed = codes.view(np.uint64)
        for a in range(0, d, chunk):
            n = min(chunk, d - a)
            base = k + _U(a // 4) * g
            for w in range((n + 3) // 4):
                z = base + _U(w) * g
                z ^= z >> _U(30)
                z *= _C1
                z ^= z >> _U(27)
                z *= _C2
                words[w] = z ^ (z >> _U(31))
            xs = x[a : a + n]
            for i in range(n):
                t = c + x.dtype.type(lanes[i]) * step16  # exact product: one rounding
                if mode == 1:
                    t = fma(alpha, xs[i], t)
                elif mode == 2:
                    t = t + alpha * xs[i]
                q = min(max(np.int32(t), lo32), hi32)  # 0 < t < 2^31: truncation = floor
                codes[i] = np.uint8(q)
            nb = (n + 7) // 8
            for i in range(n, 8 * nb):
                codes[i] = 0
            for p in range(width):
                row = planes[p, a // 8 : a // 8 + nb]
                for b in range(nb):
                    row[b] = np.uint8((((packed[b] >> _U(p)) & _LOW_BITS) * _GATHER) >> _U(56))

    return level_codes


def _level_add() -> Any:
    """``(planes, table, offset, step, lo, hi, add, codes, out) -> bool``: the inverse of
    ``level_codes`` for one message, :data:`LEVEL_CHUNK` entries at a time (``codes``: a uint8
    scratch of that size): the codes c from ``planes`` ([width, ⌈d/8⌉] uint8; 8 per plane byte
    through ``table``, the 256 uint64 words whose byte i is bit i of the index), then
    ``add`` False: only whether every c lies in [lo, hi]; True: ``out[i] += (c − offset)·step``
    with the numpy path's roundings (the product rounded, then the sum; no contraction). The
    codes stay in cache instead of streaming through [d] arrays. True after an add."""
    import numba
    from numba import types as nt

    u2, u1, i64 = nt.Array(nt.uint8, 2, "C"), nt.Array(nt.uint64, 1, "C"), nt.int64
    sigs = [nt.boolean(u2, u1, f, f, i64, i64, nt.boolean, nt.Array(nt.uint8, 1, "C"),
                       nt.Array(f, 1, "C"))
            for f in (nt.float32, nt.float64)]

    @numba.njit(sigs, cache=True, nogil=True, boundscheck=False)
    def level_add(planes, table, offset, step, lo, hi, add, codes, out):
        d = out.shape[0]
        width = planes.shape[0]
        chunk = codes.shape[0]
        words = codes.view(np.uint64)
        low, high = np.uint8(255), np.uint8(0)
        for a in range(0, d, chunk):
            n = min(chunk, d - a)
            a8, nb = a // 8, (n + 7) // 8
            row = planes[0, a8 : a8 + nb]
            for b in range(nb):  # plane by plane: simple loops the compiler vectorizes
                words[b] = table[row[b]]
            for p in range(1, width):
                row = planes[p, a8 : a8 + nb]
                for b in range(nb):
                    words[b] |= table[row[b]] << _U(p)
            if add:
                o = out[a : a + n]
                for i in range(n):
                    o[i] += (out.dtype.type(codes[i]) - offset) * step
            else:
                for i in range(n):
                    low = min(low, codes[i])
                    high = max(high, codes[i])
        return add or (np.int64(low) >= lo and np.int64(high) <= hi)

    return level_add


#: entries per chunk of ``sign_bits`` (a multiple of 64)
SIGN_CHUNK = 4096


def _sign_bits() -> Any:
    """``(x, absx, out, flags) -> None``: ``absx = |x|`` (exact: the sign bit cleared, as
    torch's ``abs``) and bit i of ``out`` (⌈d/8⌉ bytes, the padding bits 0) set when
    ``x_i < 0`` (so ±0.0 give 0), in one pass over x, :data:`SIGN_CHUNK` entries at a time
    (``flags``: a uint8 scratch of that size; 8 flags per byte by one multiply)."""
    import numba
    from numba import types as nt

    u1 = nt.Array(nt.uint8, 1, "C")
    sigs = [nt.void(nt.Array(f, 1, "C"), nt.Array(f, 1, "C"), u1, u1)
            for f in (nt.float32, nt.float64)]

    @numba.njit(sigs, cache=True, nogil=True, boundscheck=False)
    def sign_bits(x, absx, out, flags):
        d, chunk = x.shape[0], flags.shape[0]
        words = flags.view(np.uint64)
        zero = x.dtype.type(0)
        for a in range(0, d, chunk):
            n = min(chunk, d - a)
            xs, ax = x[a : a + n], absx[a : a + n]
            for i in range(n):
                v = xs[i]
                ax[i] = abs(v)
                flags[i] = v < zero
            nb = (n + 7) // 8
            for i in range(n, 8 * nb):
                flags[i] = 0
            o = out[a // 8 : a // 8 + nb]
            for b in range(nb):
                o[b] = np.uint8(((words[b] & _LOW_BITS) * _GATHER) >> _U(56))

    return sign_bits


def _sign_add() -> Any:
    """``(packed, table, s, w, fused, flags, out) -> None``: sign's decode-add of one message,
    :data:`SIGN_CHUNK` entries at a time (``flags``: a uint8 scratch of that size; 8 bits per
    byte unpacked through ``table``, see ``level_add``): with v = −s for a set bit, +s else,
    ``out[i] = fma(v, w, out[i])`` (``fused``: one rounding, torch's ``addcmul`` where
    :func:`torch_rounding` finds it fused) or ``out[i] += v`` (the caller passes s = scale·w
    rounded, or the scale for weight 1)."""
    import numba
    from numba import types as nt

    fma = _fma()
    u1 = nt.Array(nt.uint8, 1, "C")
    sigs = [nt.void(u1, nt.Array(nt.uint64, 1, "C"), f, f, nt.boolean, u1, nt.Array(f, 1, "C"))
            for f in (nt.float32, nt.float64)]

    @numba.njit(sigs, cache=True, nogil=True, boundscheck=False)
    def sign_add(packed, table, s, w, fused, flags, out):
        d, chunk = out.shape[0], flags.shape[0]
        words = flags.view(np.uint64)
        for a in range(0, d, chunk):
            n = min(chunk, d - a)
            row = packed[a // 8 : a // 8 + (n + 7) // 8]
            for b in range(row.shape[0]):
                words[b] = table[row[b]]
            o = out[a : a + n]
            if fused:
                for i in range(n):
                    o[i] = fma(-s if flags[i] else s, w, o[i])
            else:
                for i in range(n):
                    o[i] += -s if flags[i] else s

    return sign_add


_ROUNDING: dict[tuple[str, Any], int] = {}


def torch_rounding(op: str, dtype: Any) -> int:
    """How torch rounds ``t + a·x`` on this machine for numpy dtype ``dtype``, ``op``
    ``"add_alpha"`` (``t.add_(x, alpha=a)``) or ``"addcmul"`` (``t.addcmul_(x, a)``, [1, n]
    rows and a [1, 1] weight, as the block decoders call it): 1 fused (one rounding, an FMA),
    2 ``a·x`` rounded first, 0 neither everywhere (its vector body and scalar tail differ: no
    kernel may stand in for it). Measured once per (op, dtype) on a probe."""
    mode = _ROUNDING.get((op, dtype))
    if mode is None:
        import numba
        import torch

        fma = _fma()

        @numba.njit
        def both(t, x, a, fused, plain):
            for i in range(t.shape[0]):
                fused[i] = fma(a, x[i], t[i])
                plain[i] = t[i] + a * x[i]

        rng = np.random.default_rng(0)
        t, x = (rng.standard_normal(1013).astype(dtype) for _ in range(2))
        a = dtype(0.3183098861837907)
        fused, plain = np.empty_like(t), np.empty_like(t)
        both(t, x, a, fused, plain)
        tt, xt = torch.from_numpy(t.copy()), torch.from_numpy(x)
        if op == "add_alpha":
            got = tt.add_(xt, alpha=float(a)).numpy()
        else:
            got = tt.view(1, -1).addcmul_(xt.view(1, -1), torch.tensor([[a]])).numpy().reshape(-1)
        mode = 1 if np.array_equal(got, fused) else 2 if np.array_equal(got, plain) else 0
        _ROUNDING[(op, dtype)] = mode
    return mode


_BUILDERS: dict[str, Callable[[], Any]] = {"topk_candidates": _topk_candidates,
                                           "level_codes": _level_codes,
                                           "level_add": _level_add,
                                           "sign_bits": _sign_bits,
                                           "sign_add": _sign_add}
