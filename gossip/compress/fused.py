"""The mix of dense messages on CPU in one pass over memory (the kernel: numba's ``mix`` of
:mod:`gossip.compress.jit`, compiled at first use, then loaded from numba's cache).

``out[t] (+)= w_own[t]·own[t] + Σ_k w[k]·vals[src[k]]`` over the terms of target row ``t`` in
order, with each product rounded and then added: the roundings of the numpy path
(:func:`gossip.compress.rows.add_rows_`), so the result is bit-identical to it, while the sum
stays in a cache-sized buffer instead of streaming ``out`` through memory once per term. With
``alpha`` the sum is then added as torch's ``out.add_(sum, alpha=alpha)`` adds it (one fused
multiply-add where torch's CPU kernels use one, :func:`gossip.compress.jit.torch_rounding`),
so a model's whole update ``x ← x + α·(mix)`` is one pass too, in place. The
kernel also reports which rows of the result are finite, which is what lets a receiver skip a
separate pass over every dense message to look for NaN/Inf (a non-finite term always makes the
sum non-finite). Without numba (or off CPU) callers keep the numpy/torch path: where the
kernel serves is :func:`gossip.compress.dispatch.fused_mix`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gossip.compress import dispatch, jit

CHUNK_ENTRIES = 1 << 14
"""Entries summed at a time over all rows (64 KiB of float32: the partial sums stay in L2)."""


def kernel() -> Any:
    """The numba kernel (:mod:`gossip.compress.jit`'s ``mix``), None without numba."""
    return dispatch.jit_kernel("mix")


def _alpha_mode(dtype: Any) -> int:
    """The kernel's mode for ``out + alpha·sum``: 2 where torch's ``add_(alpha=)`` rounds once
    here, 3 where it rounds ``alpha·sum`` first, 0 where neither holds everywhere."""
    return {1: 2, 2: 3}.get(jit.torch_rounding("add_alpha", dtype), 0)


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


def _flat(rows: torch.Tensor, dtype: np.dtype) -> tuple[np.ndarray, int]:
    """The [m, d] rows (each contiguous, any row stride) as one flat 1-D array from the first
    entry of row 0 to the last of row m − 1, and the row pitch in entries."""
    m, d = rows.shape
    if m == 0 or d == 0:
        return np.zeros(0, dtype), 0
    pitch = rows.stride(0) if m > 1 else d
    flat = torch.as_strided(rows, ((m - 1) * pitch + d,), (1,))
    return flat.numpy(), pitch


class DenseMix:
    """One dense mix's kernel arguments for fixed tensors (their flat views and pitches, the
    terms, the scratch), prepared once: a round then pays the kernel and its dispatch only.
    Callers keep one per layout (the engine: per phase's staging rows, in the plan's cache)."""

    __slots__ = ("args", "m", "has_own", "dtype", "wo", "kernel", "_calls", "_w_last")

    def __init__(self, out: torch.Tensor, own: torch.Tensor | None, terms: Terms | None,
                 vals_own: torch.Tensor, vals_recv: torch.Tensor | None):
        m, d = out.shape
        dtype = out.numpy().dtype
        o, po = _flat(out, dtype)
        x, pw = _flat(own, dtype) if own is not None else (o, po)
        vo, pvo = _flat(vals_own, dtype)
        vr, pvr = _flat(vals_recv, dtype) if vals_recv is not None else (vo[:0], 0)
        if terms is None:
            terms = Terms(m, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                          torch.zeros(0, dtype=torch.float64), out.dtype)
        chunk = min(max(64, min(4096, CHUNK_ENTRIES // max(m, 1))), d)
        self.m, self.has_own, self.dtype = m, own is not None, dtype
        self.wo = np.zeros(m, dtype=dtype)
        self.args = (o, po, x, pw, own is not None, self.wo, vo, pvo, vr, pvr, vals_own.shape[0],
                     d, terms.indptr, terms.src, terms.w.astype(dtype, copy=False),
                     np.empty(m * chunk, dtype=dtype), chunk, np.empty(m, dtype=np.bool_))
        self.kernel = kernel()
        self._calls: dict[tuple[bool, float | None], tuple] = {}  # the kernel's arguments per mode
        self._w_last: tuple[torch.Tensor, int] | None = None  # the own weights in wo: (tensor, version)

    def __call__(self, w_own: Any, *, add: bool, alpha: float | None = None) -> np.ndarray:
        """Run the mix (:func:`mix_rows_`'s contract) with own weights ``w_own`` ([m] tensor
        or array; ignored without an own term); returns the finite mask (valid until the next
        call)."""
        if self.has_own:  # (a list, or one float: faster than a numpy view of a small tensor)
            last = self._w_last
            if not isinstance(w_own, torch.Tensor):
                self.wo[:] = w_own
                self._w_last = None
            elif last is None or last[0] is not w_own or last[1] != w_own._version:
                if self.m == 1:  # (the same tensor unchanged, a round that repeats: in wo)
                    self.wo[0] = w_own.item()
                else:
                    self.wo[:] = w_own.tolist()
                self._w_last = (w_own, w_own._version)
        args = self._calls.get((add, alpha))
        if args is None:  # the whole argument tuple of this mode, made once
            dtype = self.dtype
            mode = 1 if add and alpha is None else _alpha_mode(dtype.type) if add else 0
            (o, po, x, pw, has_own, wo, vo, pvo, vr, pvr, m_own, d, indptr, src, w, buf, chunk,
             ok) = self.args
            args = self._calls[(add, alpha)] = (
                o, po, x, pw, has_own, wo, vo, pvo, vr, pvr, m_own, d, indptr, src, w, mode,
                dtype.type(1.0 if alpha is None else alpha), buf, chunk, ok)
        self.kernel(*args)
        return args[-1]


def mix_rows_(out: torch.Tensor, own: torch.Tensor | None, w_own: torch.Tensor | None,
              terms: Terms | None, vals_own: torch.Tensor, vals_recv: torch.Tensor | None,
              *, add: bool, alpha: float | None = None) -> np.ndarray:
    """``out[t] = (out[t] if add else 0) + w_own[t]·own[t] + Σ w·vals[src]`` for every row;
    with ``alpha`` (and ``add``) ``out[t] += alpha·(0 + w_own[t]·own[t] + Σ w·vals[src])``,
    the sum rounded first. Returns the [m] bool mask of rows whose result is finite.

    ``own`` ([m, d] values, or None for no own term) and ``vals_own`` / ``vals_recv`` (the
    value sections of the staging rows below / from ``m`` on, where ``terms.src`` points) are
    strided views into message rows; nothing is copied. ``out`` may be ``own`` or share memory
    with the staging rows (a model sent from its own memory, mixed in place): every row's
    chunk is summed before any is written. A mix run every round keeps its :class:`DenseMix`."""
    call = DenseMix(out, own, terms, vals_own, vals_recv)
    return call(None if w_own is None else w_own.to(torch.float64).reshape(-1), add=add,
                alpha=alpha)
