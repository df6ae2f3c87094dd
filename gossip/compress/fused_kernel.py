"""The numba kernel behind :mod:`gossip.compress.fused` (imported, and compiled or loaded from
numba's on-disk cache, on the first dense mix of a run: importing numba costs ~0.3 s).

Rows are passed as flat 1-D arrays with a row pitch (``row t`` = ``a[t·pitch : t·pitch + d]``),
not as 2-D strided views: a slice of a contiguous 1-D array is contiguous to numba, so the
inner loops compile to SIMD code, where a 2-D view of unknown strides ('A' layout) does not.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types as nt
from numba.extending import intrinsic

WRITE, ADD, ADD_SCALED = 0, 1, 2
"""Modes: ``out = 0 + Σ``; ``out = out + Σ`` (the terms added to ``out`` in order);
``out = fma(alpha, 0 + Σ, out)`` (the sum rounded, then one fused multiply-add: the bits of
torch's ``out.add_(sum, alpha=alpha)``, whose CPU kernels use ``fmadd``)."""


@intrinsic
def fma(typingctx, a, b, c):  # noqa: ARG001 (numba's intrinsic signature)
    """``a·b + c`` rounded once (LLVM's fma: the FMA instruction where the CPU has one)."""
    def codegen(context, builder, signature, args):  # noqa: ARG001
        return builder.fma(*args)
    return a(a, b, c), codegen


def _signature(f):
    a1, i1 = nt.Array(f, 1, "C"), nt.Array(nt.int64, 1, "C")
    return nt.void(a1, nt.int64, a1, nt.int64, nt.boolean, a1, a1, nt.int64, a1, nt.int64,
                   nt.int64, nt.int64, i1, i1, a1, nt.int64, f, a1, nt.int64,
                   nt.Array(nt.boolean, 1, "C"))


@numba.njit([_signature(nt.float32), _signature(nt.float64)], cache=True, nogil=True,
            boundscheck=False)
def mix(out, po, own, pw, has_own, w_own, vo, pvo, vr, pvr, m_own, d, indptr, src, w, mode,
        alpha, buf, chunk, ok):
    """Every row ``t`` of ``out`` (pitch ``po``), for ``mode``: ``b = (out_t if ADD else 0) +
    w_own[t]·own_t + Σ_k w[k]·v_src[k]`` (rows ``src < m_own`` of ``vo``, the others of ``vr``),
    each product rounded and added in order, then ``out_t = b`` (or ``fma(alpha, b, out_t)``).
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
            if mode == ADD:
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
            if mode == ADD_SCALED:
                for i in range(n):
                    o[i] = fma(alpha, b[i], o[i])
            else:
                for i in range(n):
                    o[i] = b[i]
            good = True
            for i in range(n):
                good &= abs(o[i]) < inf
            ok[t] &= good
