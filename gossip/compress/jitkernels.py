"""The numba kernels of :mod:`gossip.compress.jit` (imported by it on first use: importing
this module imports numba; the kernels compile once into numba's on-disk cache).

Each kernel is compiled for the argument types of its first call (float32 or float64 data),
then loaded from the cache in later processes, so a process pays only for what it runs; each
has a numpy/torch twin in its compressor that gives the same bytes (:mod:`gossip.compress.jit`
says which serves).
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core.extending import intrinsic

_U = np.uint64
_C1, _C2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)  # SplitMix64's (gossip.rng)
_LOW_BITS = _U(0x0101010101010101)  # bit 0 of each byte of a word
_GATHER = _U(sum(1 << (56 - 7 * i) for i in range(8)))  # byte i's bit 0 -> bit 56 + i


@intrinsic
def fma(typingctx, a, b, c):  # noqa: ARG001 (numba's intrinsic signature)
    """``a·b + c`` rounded once (``llvm.fma``: exact on every target, with or without an FMA
    instruction)."""

    def codegen(context, builder, sig, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@numba.njit(cache=True, nogil=True, boundscheck=False)
def topk_candidates(bits, t, mag, idx, flags, pos, cnt):
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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def level_codes(x, k, g, c, alpha, mode, lo, hi, planes, words, codes):
    """``(x, k, g, c, alpha, mode, lo, hi, planes, words, codes) -> None``: the codes of
    :class:`gossip.compress.quantize.LevelQuantizer` (widths below 8) packed into ``planes``
    ([width, ⌈d/8⌉] uint8, the message's bit planes), :data:`LEVEL_CHUNK` entries at a time:
    the words ``fmix64(k + i·g)`` of :mod:`gossip.rng` (four 16-bit lanes each), the dither
    ``t = c + 2⁻¹⁶·lane`` (one rounding), ``t += alpha·x`` (``mode`` 1: fused, 2: the product
    rounded first, 0: no add), ``⌊t⌋`` clipped to [lo, hi], then bit p of 8 codes per plane
    byte by one multiply. The roundings of the numpy path (torch's ``add(alpha=)``, which
    :func:`torch_rounding` identifies); ``words`` / ``codes`` are uint64 / uint8 scratches of
    ``LEVEL_CHUNK / 4`` and ``LEVEL_CHUNK`` entries."""
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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def level_add(planes, table, offset, step, lo, hi, add, codes, out):
    """``(planes, table, offset, step, lo, hi, add, codes, out) -> bool``: the inverse of
    ``level_codes`` for one message, :data:`LEVEL_CHUNK` entries at a time (``codes``: a uint8
    scratch of that size): the codes c from ``planes`` ([width, ⌈d/8⌉] uint8; 8 per plane byte
    through ``table``, the 256 uint64 words whose byte i is bit i of the index), then
    ``add`` False: only whether every c lies in [lo, hi]; True: ``out[i] += (c − offset)·step``
    with the numpy path's roundings (the product rounded, then the sum; no contraction). The
    codes stay in cache instead of streaming through [d] arrays. True after an add."""
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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def sign_bits(x, absx, out, flags):
    """``(x, absx, out, flags) -> None``: ``absx = |x|`` (exact: the sign bit cleared, as
    torch's ``abs``) and bit i of ``out`` (⌈d/8⌉ bytes, the padding bits 0) set when
    ``x_i < 0`` (so ±0.0 give 0), in one pass over x, :data:`SIGN_CHUNK` entries at a time
    (``flags``: a uint8 scratch of that size; 8 flags per byte by one multiply)."""
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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def sign_add(packed, table, s, w, fused, flags, out):
    """``(packed, table, s, w, fused, flags, out) -> None``: sign's decode-add of one message,
    :data:`SIGN_CHUNK` entries at a time (``flags``: a uint8 scratch of that size; 8 bits per
    byte unpacked through ``table``, see ``level_add``): with v = −s for a set bit, +s else,
    ``out[i] = fma(v, w, out[i])`` (``fused``: one rounding, torch's ``addcmul`` where
    :func:`torch_rounding` finds it fused) or ``out[i] += v`` (the caller passes s = scale·w
    rounded, or the scale for weight 1)."""
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


@numba.njit(cache=True)
def fma_and_plain(t, x, a, fused, plain):
    """``fused = fma(a, x, t)`` and ``plain = t + a·x`` (two roundings), for
    :func:`gossip.compress.jit.torch_rounding`'s probe."""
    for i in range(t.shape[0]):
        fused[i] = fma(a, x[i], t[i])
        plain[i] = t[i] + a * x[i]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def topk_keep(cand, ca, t, k, out):
    """``out`` (k entries) = the candidates ``cand`` (increasing indices, their magnitudes
    ``ca``, at least k of them ≥ t) with ``ca > t``, then the lowest-index ones with ``ca == t``
    (k in all, in increasing order): top-k's tie rule, :func:`.sparse._resolve_ties` in one
    pass."""
    ties = k
    for i in range(ca.shape[0]):
        ties -= ca[i] > t
    j = 0
    for i in range(ca.shape[0]):
        v = ca[i]
        if v > t or (v == t and ties > 0):
            ties -= v == t
            out[j] = cand[i]
            j += 1


# -- dense mixes (gossip.compress.fused) ----------------------------------------------------
# Rows come as flat 1-D arrays with a row pitch (row t = a[t·pitch : t·pitch + d]), not as 2-D
# views of unknown strides: a slice of a contiguous 1-D array is contiguous to numba, so the
# inner loops compile to SIMD code.


@numba.njit(cache=True, nogil=True, boundscheck=False)
def mix(out, po, own, pw, has_own, w_own, vo, pvo, vr, pvr, m_own, d, indptr, src, w, mode,
        alpha, buf, chunk, ok):
    """:func:`gossip.compress.fused.mix_rows_`'s kernel. Every row ``t`` of ``out`` (pitch
    ``po``): ``b = (out_t if mode == 1 else 0) + w_own[t]·own_t + Σ_k w[k]·v_src[k]`` (rows
    ``src < m_own`` of ``vo``, the others of ``vr``), each product rounded and added in order,
    then ``out_t = b`` (modes 0, 1) or ``out_t + alpha·b`` rounded once (mode 2, an FMA) or
    twice (mode 3), as torch's ``add_(b, alpha=alpha)`` rounds on this machine
    (:func:`gossip.compress.jit.torch_rounding`).
    Column chunks go in order and every row's chunk is summed into ``buf`` before any is written,
    so ``out`` may be one of the inputs (a model mixed in place with its neighbors' rows of the
    same tensor). ``ok[t]``: whether row t's result is finite."""
    m = ok.shape[0]
    zero = buf.dtype.type(0)
    inf = np.inf
    for t in range(m):
        ok[t] = True
    for c0 in range(0, d, chunk):
        n = min(chunk, d - c0)
        for t in range(m):
            b = buf[t * chunk : t * chunk + n]
            if mode == 1:
                o = out[t * po + c0 : t * po + c0 + n]
                for i in range(n):
                    b[i] = o[i]
            else:
                for i in range(n):
                    b[i] = zero
            if has_own:
                x = own[t * pw + c0 : t * pw + c0 + n]
                wt = w_own[t]
                for i in range(n):
                    b[i] = b[i] + wt * x[i]
            for k in range(indptr[t], indptr[t + 1]):
                s = src[k]
                wk = w[k]
                if s < m_own:
                    v = vo[s * pvo + c0 : s * pvo + c0 + n]
                else:
                    v = vr[(s - m_own) * pvr + c0 : (s - m_own) * pvr + c0 + n]
                for i in range(n):
                    b[i] = b[i] + wk * v[i]
        for t in range(m):
            b = buf[t * chunk : t * chunk + n]
            o = out[t * po + c0 : t * po + c0 + n]
            if mode == 2:
                for i in range(n):
                    o[i] = fma(alpha, b[i], o[i])
            elif mode == 3:
                for i in range(n):
                    o[i] = o[i] + alpha * b[i]
            else:
                for i in range(n):
                    o[i] = b[i]
            good = True
            for i in range(n):
                good &= abs(o[i]) < inf
            ok[t] &= good


# -- top-k over a block of short rows (gossip.compress.sparse) -------------------------------
@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _keep_largest(best, filled, j, v):
    """Insert ``v`` into ``best[:filled]`` (the ``j`` largest values so far, decreasing) and
    return the new count: a value at or below the j-th is dropped at one compare."""
    if filled == j and v <= best[j - 1]:
        return filled
    p = filled if filled < j else j - 1
    while p > 0 and best[p - 1] < v:
        best[p] = best[p - 1]
        p -= 1
    best[p] = v
    return min(filled + 1, j)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def topk_rows(keys, k, top, stats):
    """For every row of ``keys`` ([m, d] order keys ≥ 0, :func:`.sparse._order_key`; k < d):
    ``top[r]`` the positions of its k largest keys in increasing order, a tie at the k-th
    value going to the lowest positions (top-k's rule, :func:`.sparse._resolve_ties`), and
    ``stats[r]`` its largest, k-th and (k+1)-th largest key.

    Per row: a threshold from a strided sample of up to 256 keys (its j-th largest, j chosen
    so that about 2(k+1) keys reach it; j grows 4x while fewer do), one pass collecting the
    positions at or above it, then the k + 1 largest of those few kept by insertion: no
    selection or sort over the whole row."""
    m, d = keys.shape
    need = k + 1
    s = min(d, 256)
    step = d // s
    best = np.empty(max(s, need), keys.dtype)
    cand = np.empty(d, np.int64)
    for r in range(m):
        row = keys[r]
        j = min(s, 2 * need * s // d + 2)
        while True:
            if j >= s:  # every key a candidate
                t = row[0]
                for i in range(d):
                    t = min(t, row[i])
            else:
                filled = 0
                for i in range(s):
                    filled = _keep_largest(best, filled, j, row[i * step])
                t = best[j - 1]
            n = 0
            for i in range(d):
                if row[i] >= t:
                    cand[n] = i
                    n += 1
            if n >= need:
                break
            j = min(s, 4 * j)
        filled = 0
        for i in range(n):
            filled = _keep_largest(best, filled, need, row[cand[i]])
        kth = best[k - 1]
        ties = k
        for i in range(n):
            ties -= row[cand[i]] > kth
        o = 0
        for i in range(n):
            v = row[cand[i]]
            if v > kth or (v == kth and ties > 0):
                ties -= v == kth
                top[r, o] = cand[i]
                o += 1
        stats[r, 0] = best[0]
        stats[r, 1] = kth
        stats[r, 2] = best[k]


# -- a channel's gap summed in a wider dtype (gossip.core.channel._WideMix) -----------------
@numba.njit(cache=True, nogil=True, boundscheck=False)
def wide_gap(dec, own_w, indptr, src, w, hat, gap, d, add, chunk):
    """``_WideMix``'s sums over flat rows of ``d`` entries: for every row ``r`` the own decoded
    message ``v = dec[r]`` (converted exactly to the wider dtype) gives ``hat[r] (+)= v`` and
    ``gap[r] (+)= own_w[r]·v`` (``add``: added, else written), then its terms
    ``indptr[r]..indptr[r+1]`` in order give ``gap[r] += w[k]·dec[src[k]]``: each product
    rounded, then each sum (the torch twin's two roundings), a cache-sized column chunk of the
    row at a time."""
    m = own_w.shape[0]
    for r in range(m):
        a = own_w[r]
        base = r * d
        for c0 in range(0, d, chunk):
            n = min(chunk, d - c0)
            h = hat[base + c0 : base + c0 + n]
            g = gap[base + c0 : base + c0 + n]
            own = dec[base + c0 : base + c0 + n]
            if add:
                for i in range(n):
                    v = np.float64(own[i])
                    h[i] = h[i] + v
                    g[i] = g[i] + a * v
            else:
                for i in range(n):
                    v = np.float64(own[i])
                    h[i] = v
                    g[i] = a * v
            for k in range(indptr[r], indptr[r + 1]):
                row = dec[src[k] * d + c0 : src[k] * d + c0 + n]
                wk = w[k]
                for i in range(n):
                    g[i] = g[i] + wk * np.float64(row[i])
