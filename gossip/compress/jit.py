"""Optional numba kernels of the CPU compressors: which exist and when they serve. The kernels
live in :mod:`gossip.compress.jitkernels`, imported on first use (numba's import, ~0.3 s,
and the kernels compiled once into numba's on-disk cache, then loaded from it).

Each kernel has a numpy/torch twin that gives the same bytes: the callers run the twin when
:func:`gossip.compress.dispatch.jit_kernel` returns None (numba missing, ``dispatch.JIT``
off, which the tests use to compare both paths, or a message below its size threshold).
CUDA tensors never come here: their path is pure torch.

* ``topk_candidates``: one pass over the float bits of x (no ``|x|`` array, no mask): the
  indices whose ``|x_i|`` reaches a threshold, every NaN/Inf among them. Top-k's exact
  selection then runs on the ~1.3·k candidates (``topk_keep``: the tie rule in one pass).
* ``level_codes``: QSGD's / LEAD's whole encode after the norm (hash, dither, levels, codes,
  bit planes) in one pass over x, a cache-sized chunk at a time; ``level_add`` its
  decode-add (codes unpacked in cache, added with the numpy path's two roundings).
* ``sign_bits``: sign's ``|x|`` (summed by torch afterwards, for the scale's bits) and its
  packed ``x < 0`` bits in one pass; ``sign_add`` its decode-add in one pass over ``out``.

Where a kernel stands in for torch's ``t + a·x`` (``add(alpha=)``, ``addcmul``), which a CPU
build may or may not fuse into one rounding, :func:`torch_rounding` finds out on a probe and
the kernel rounds the same way (or does not serve).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_kernels: Any = None  # the module gossip.compress.jitkernels; False when numba is not there


def get(name: str) -> Any:
    """The kernel ``name`` of :mod:`.jitkernels` (imported on first use), or None without
    numba. Callers ask :func:`gossip.compress.dispatch.jit_kernel`, which applies the switch
    and the size threshold."""
    global _kernels
    if _kernels is None:
        try:
            from gossip.compress import jitkernels as _kernels
        except ImportError:
            log.debug("numba is not installed: the compressors take their numpy paths")
            _kernels = False
    return getattr(_kernels, name) if _kernels else None


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


#: entries per chunk of ``level_codes`` (a multiple of 64: whole words and plane bytes)
LEVEL_CHUNK = 4096

#: entries per chunk of ``sign_bits`` (a multiple of 64)
SIGN_CHUNK = 4096


_ROUNDING: dict[tuple[str, Any], int] = {}


def torch_rounding(op: str, dtype: Any) -> int:
    """How torch rounds ``t + a·x`` on this machine for numpy dtype ``dtype``, ``op``
    ``"add_alpha"`` (``t.add_(x, alpha=a)``) or ``"addcmul"`` (``t.addcmul_(x, a)``, [1, n]
    rows and a [1, 1] weight, as the block decoders call it): 1 fused (one rounding, an FMA),
    2 ``a·x`` rounded first, 0 neither everywhere (its vector body and scalar tail differ: no
    kernel may stand in for it). Measured once per (op, dtype) on a probe."""
    probe = get("fma_and_plain")
    if probe is None:
        return 0
    mode = _ROUNDING.get((op, dtype))
    if mode is None:
        import torch

        rng = np.random.default_rng(0)
        t, x = (rng.standard_normal(1013).astype(dtype) for _ in range(2))
        a = dtype(0.3183098861837907)
        fused, plain = np.empty_like(t), np.empty_like(t)
        probe(t, x, a, fused, plain)
        tt, xt = torch.from_numpy(t.copy()), torch.from_numpy(x)
        if op == "add_alpha":
            got = tt.add_(xt, alpha=float(a)).numpy()
        else:
            got = tt.view(1, -1).addcmul_(xt.view(1, -1), torch.tensor([[a]])).numpy().reshape(-1)
        mode = 1 if np.array_equal(got, fused) else 2 if np.array_equal(got, plain) else 0
        _ROUNDING[(op, dtype)] = mode
    return mode
