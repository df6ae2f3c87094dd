"""The mix of dense messages on CPU in one pass over memory: a numba kernel (compiled at first
use, then loaded from numba's on-disk cache).

``out[t] (+)= w_own[t]·own[t] + Σ_k w[k]·vals[src[k]]`` over the terms of target row ``t`` in
order, with each product rounded and then added: the roundings of the numpy path
(:func:`gossip.compress.rows.add_rows_`), so the result is bit-identical to it, while the sum
stays in a cache-sized buffer instead of streaming ``out`` through memory once per term. The
kernel also reports which rows of the result are finite, which is what lets a receiver skip a
separate pass over every dense message to look for NaN/Inf (a non-finite term always makes the
sum non-finite). Without numba (or off CPU) callers keep the numpy/torch path.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

CHUNK = 4096
"""Entries of a row summed at a time (16 KiB of float32: the partial sum stays in L1)."""

_kernel: Any = None  # the compiled dispatcher; False when numba is not available


def kernel() -> Any:
    """The numba kernel, compiled (or loaded from the cache) on first use; None without numba."""
    global _kernel
    if _kernel is None:
        try:
            _kernel = _compile()
        except ImportError:
            log.debug("numba is not installed: dense mixes take the numpy path")
            _kernel = False
    return _kernel or None


def usable(out: torch.Tensor) -> bool:
    """Whether :func:`mix_rows_` serves ``out``: a CPU float32/float64 [m, d] tensor numpy can
    write, with contiguous rows, when numba is there."""
    return (out.device.type == "cpu" and out.dtype in (torch.float32, torch.float64)
            and out.dim() == 2 and out.stride(1) == 1 and not out.requires_grad
            and kernel() is not None)


class Terms:
    """The neighbor terms of a mix in the kernel's form: for target row ``t``, staging rows
    ``src[indptr[t]:indptr[t+1]]`` with weights ``w[...]``, in the order they add."""

    __slots__ = ("indptr", "src", "w")

    def __init__(self, m: int, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                 dtype: torch.dtype):
        order = np.argsort(dst.cpu().numpy(), kind="stable")  # per target, in the given order
        self.src = np.ascontiguousarray(src.cpu().numpy()[order], dtype=np.int64)
        self.w = np.ascontiguousarray(w.cpu().to(dtype).numpy()[order])
        counts = np.bincount(dst.cpu().numpy(), minlength=m)
        self.indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def mix_rows_(out: torch.Tensor, own: torch.Tensor | None, w_own: torch.Tensor | None,
              terms: Terms | None, vals_own: torch.Tensor, vals_recv: torch.Tensor | None,
              *, add: bool) -> np.ndarray:
    """``out[t] = (out[t] if add else 0) + w_own[t]·own[t] + Σ w·vals[src]`` for every row;
    returns the [m] bool mask of rows whose result is finite.

    ``own`` ([m, d] values, or None for no own term) and ``vals_own`` / ``vals_recv`` (the
    value sections of the staging rows below / from ``m`` on, where ``terms.src`` points) are
    strided views into message rows; nothing is copied."""
    fn = kernel()
    m, d = out.shape
    dtype = out.dtype
    o = out.numpy()
    has_own = own is not None
    own_np = own.numpy() if has_own else o
    wo = (w_own.to(dtype).reshape(m).numpy() if has_own else np.zeros(m, dtype=o.dtype))
    vo = vals_own.numpy()
    vr = vals_recv.numpy() if vals_recv is not None and vals_recv.shape[0] else vo[:0]
    if terms is None:
        indptr, src, w = np.zeros(m + 1, np.int64), np.zeros(0, np.int64), np.zeros(0, o.dtype)
    else:
        indptr, src, w = terms.indptr, terms.src, terms.w
    ok = np.empty(m, dtype=np.bool_)
    buf = np.empty(min(CHUNK, d), dtype=o.dtype)
    fn(o, own_np, wo, has_own, vo, vr, vals_own.shape[0], indptr, src, w, not add,
       o.dtype.type(0), buf, ok)
    return ok


def _compile() -> Any:
    """Build the kernel (numba is imported here: it costs nothing to runs that never mix)."""
    import numba
    from numba import types as nt

    def signature(f: Any) -> Any:  # 2-D views of any strides ('A'), 1-D contiguous arrays
        a2, c1 = nt.Array(f, 2, "A"), nt.Array(f, 1, "C")
        i1 = nt.Array(nt.int64, 1, "C")
        return nt.void(a2, a2, c1, nt.boolean, a2, a2, nt.int64, i1, i1, c1, nt.boolean, f, c1,
                       nt.Array(nt.boolean, 1, "C"))

    @numba.njit([signature(nt.float32), signature(nt.float64)], cache=True, nogil=True,
                boundscheck=False)
    def mix(out, own, w_own, has_own, vo, vr, m_own, indptr, src, w, write, zero, buf, ok):
        m, d = out.shape
        chunk = buf.shape[0]
        inf = np.inf
        for t in range(m):
            good = True
            wt = w_own[t]
            for c0 in range(0, d, chunk):
                c1 = min(c0 + chunk, d)
                n = c1 - c0
                o = out[t, c0:c1]
                b = buf[:n]
                if has_own:
                    x = own[t, c0:c1]
                    if write:
                        for i in range(n):
                            b[i] = zero + wt * x[i]
                    else:
                        for i in range(n):
                            b[i] = o[i] + wt * x[i]
                elif write:
                    b[:] = zero
                else:
                    b[:] = o
                for k in range(indptr[t], indptr[t + 1]):
                    s = src[k]
                    wk = w[k]
                    v = vo[s, c0:c1] if s < m_own else vr[s - m_own, c0:c1]
                    for i in range(n):
                        b[i] = b[i] + wk * v[i]
                for i in range(n):
                    o[i] = b[i]
                for i in range(n):
                    good &= abs(b[i]) < inf
            ok[t] = good

    return mix
