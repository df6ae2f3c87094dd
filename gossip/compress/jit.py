"""Optional numba kernels of the CPU compressors (compiled at first use, then loaded from
numba's on-disk cache).

Each kernel has a numpy/torch twin that gives the same bytes: the callers run the twin when
:func:`get` returns None (numba missing, or :data:`ENABLED` off, which the tests use to
compare both paths). CUDA tensors never come here: their path is pure torch.

* ``topk_candidates``: one pass over the float bits of x (no ``|x|`` array, no mask): the
  indices whose ``|x_i|`` reaches a threshold, and the largest ``|x_i|`` bit pattern (a
  NaN/Inf check for free). Top-k's exact selection then runs on the ~1.3·k candidates.
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


def _topk_candidates() -> Any:
    """``(bits, t, mag, idx, flags) -> (count, worst)``: ``bits`` the int32/int64 view of a
    float32/float64 vector, ``t`` the bit pattern of a threshold ≥ +0, ``mag`` all bits but
    the sign (0x7f…f of the same width: numba would widen a constant), ``flags`` a bool
    scratch of :data:`TOPK_CHUNK` entries. Writes the increasing indices i with ``|x_i| ≥ t``
    (compared as sign-cleared bit patterns, which order as the magnitudes, +inf and NaN above
    every finite value) to ``idx[:count]`` (``idx`` needs d + 8 entries); ``worst`` is the
    largest sign-cleared pattern (≥ that of +inf: x holds NaN/Inf).

    Per chunk: one vectorized loop flags the entries (and keeps the maximum), then the flags
    are read 8 at a time as a uint64 word; only nonzero words (~10 % at 1.3 % candidates)
    store their 8 positions, branch-free (a position is kept by advancing the count)."""
    import numba
    from numba import types as nt

    i1, b1 = nt.Array(nt.int64, 1, "C"), nt.Array(nt.boolean, 1, "C")
    sigs = [nt.Tuple((nt.int64, it))(nt.Array(it, 1, "C"), it, it, i1, b1)
            for it in (nt.int32, nt.int64)]

    @numba.njit(sigs, cache=True, nogil=True, boundscheck=False)
    def topk_candidates(bits, t, mag, idx, flags):
        n, chunk = bits.shape[0], flags.shape[0]
        words = flags.view(np.uint64)
        c = 0
        worst = bits.dtype.type(0)
        for s in range(0, n, chunk):
            size = min(chunk, n - s)
            x = bits[s : s + size]
            m = bits.dtype.type(0)
            for j in range(size):
                u = x[j] & mag
                m = max(m, u)
                flags[j] = u >= t
            worst = max(worst, m)
            for j in range(size, (size + 7) // 8 * 8):
                flags[j] = False
            for w in range((size + 7) // 8):
                if words[w] != 0:
                    for j in range(8 * w, 8 * w + 8):
                        idx[c] = s + j
                        c += flags[j]
        return c, worst

    return topk_candidates


_BUILDERS: dict[str, Callable[[], Any]] = {"topk_candidates": _topk_candidates}
