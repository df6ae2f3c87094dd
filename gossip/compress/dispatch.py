"""Which code path serves a compressor call: every threshold and every choice between a
compressor's paths, in one place.

A compressor has one reference (its batch form, or the per-tensor hooks of one written so,
see :mod:`gossip.compress.codec`) and optional fast paths that give the same bytes and the same
decoded values. The compressors, :mod:`gossip.compress.fused` and the block
(:mod:`gossip.core.block`, :mod:`gossip.core.channel`) ask this module which one serves;
none of them tests a size or a switch itself.

=====================  ==========================================  ==============================
path                   serves                                      decided by
=====================  ==========================================  ==============================
torch reference        CUDA, bfloat16/half, everything under       (the default)
                       :func:`reference_kernels`
numpy twin             CPU float32/float64 messages: a numpy call  :func:`numpy_path`,
(``_*_host``)          costs well under a µs against a few µs per  :func:`host_encode`,
                       torch op, what dominates d ~ 10³–10⁵;       :func:`host_layout`,
                       numpy's packbits/unpackbits beat torch's    :func:`host_parse`,
                       CPU kernels on uint8/bool work              :func:`host_tensor`,
                                                                   :func:`host_decode`
block kernels          blocks of rows (``_fast_encode_rows``,      :func:`block_kernel`
(``_fast_*``)          ``_fast_decode_add_rows``, the chunk
                       kernels), in ``fast_dtypes``
per-row loop           CPU blocks of one row, or of rows of at     :func:`batch_encode`,
                       least :data:`LOOP_FROM` entries: the        :func:`loop_rows`,
                       single-message encoders work in cache-      :func:`loop_decode`,
                       (and checks of received rows)               :func:`loop_check`
                       sized numpy chunks, cheaper per entry than
                       their batched torch twins, which only win
                       on short rows (per-call overhead)
chunked add            ``out += w·v`` rows of at least             :func:`chunked_add`
                       :data:`CHUNKED_FROM` entries, the product
                       kept in cache
sign's table decode    sign messages of more than                  :func:`table_decode`
                       :data:`TABLE_FROM` entries: one table
                       gather pass decodes faster
numba kernels          CPU messages of at least :data:`JIT_FROM`   :func:`jit_kernel`,
(:mod:`.jit`)          entries where numba is installed; shorter   :func:`jit_long`,
                       ones gain little, and a process that never  :func:`topk_rows_kernel`
                       meets a long row never pays numba's import
fused decode-and-mix   dense messages mixed into long CPU rows,    :func:`fused_mix`,
(:mod:`.fused`)        or into a single row of at least            :func:`dense_mix`
                       :data:`JIT_FROM` entries (one pass instead
                       of one per term)
=====================  ==========================================  ==============================

The switches :data:`NUMPY` and :data:`JIT` turn the numpy and numba paths off (the tests
compare every path against the torch one); :func:`reference_kernels` turns every fast path
off at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from gossip.compress import jit

#: run the numpy twins on CPU tensors (False: the torch path everywhere, as on CUDA)
NUMPY = True

#: run the numba kernels where they serve (False: every caller takes its numpy/torch twin)
JIT = True

#: every compressor on its reference code only (set by :func:`reference_kernels`)
REFERENCE = False

#: CPU rows of at least this many entries encode faster one at a time through the
#: single-message path (numpy, in cache-sized chunks) than through the batched torch ops; they
#: are decoded one message at a time too (from views: gathering would copy every message once
#: per receiver, and a batched decode gains nothing on rows that long)
LOOP_FROM = 1 << 15

#: rows of at least this many entries are multiplied and added a cache-sized chunk at a time
#: (:func:`gossip.compress.rows.add_rows_`)
CHUNKED_FROM = 1 << 15

#: above this many entries sign's table gather (one pass) decodes faster than numpy's unpack
TABLE_FROM = 1 << 18

#: single messages of at least this many entries are encoded by a numba kernel (shorter ones
#: by numpy's calls: the kernel gains little there, and a process that never meets a long row
#: never pays numba's import)
JIT_FROM = 1 << 12

_FLOATS = (torch.float32, torch.float64)
_NUMPY_OF = {torch.float32: np.float32, torch.float64: np.float64}


@contextmanager
def reference_kernels() -> Iterator[None]:
    """Run every compressor on its reference code only (its batch form, or the per-tensor
    hooks with blocks as a loop over rows): no numpy twin, no fast block kernel.
    What the kernels are checked against; a context manager (not thread-safe)."""
    global REFERENCE, NUMPY
    saved = REFERENCE, NUMPY
    REFERENCE, NUMPY = True, False
    try:
        yield
    finally:
        REFERENCE, NUMPY = saved


# ------------------------------------------------------------------ numpy twins
def switches() -> tuple[bool, bool, bool]:
    """The kernel switches (:data:`NUMPY`, :data:`JIT`, :data:`REFERENCE`) as they are now:
    a choice remembered for a repeated call holds while they do."""
    return NUMPY, JIT, REFERENCE


def numpy_path(device: torch.device, dtype: torch.dtype | None = None) -> bool:
    """Whether the numpy fast path serves tensors on ``device`` (of ``dtype``: numpy has no
    bfloat16)."""
    return NUMPY and device.type == "cpu" and dtype is not torch.bfloat16


def host_encode(comp: Any, plan: Any) -> bool:
    """Whether ``comp.encode`` of a message of ``plan`` runs its numpy twin ``_encode_host``
    (a CPU float32/float64 message)."""
    return plan.host and comp._encode_host is not None and NUMPY


def host_layout(plan: Any) -> bool:
    """Whether the torch encode of a CPU message lays out its buffer through numpy."""
    return plan.cpu and NUMPY


def host_parse(plan: Any, buf: torch.Tensor) -> bool:
    """Whether a received CPU message is parsed on numpy views (then the numpy twins decode
    it where the message is float32/float64)."""
    return plan.cpu and buf.is_cpu and NUMPY


def host_tensor(flat: torch.Tensor) -> bool:
    """Whether the per-tensor wrapper takes the numpy path for ``flat`` (CPU float32/float64)."""
    return flat.is_cpu and NUMPY and flat.dtype in _FLOATS


def host_decode(comp: Any, out: torch.Tensor) -> bool:
    """Whether the single-message ``decode_add_`` of a row of ``out`` takes the numpy path
    (``Codec.decode_add_``: a host payload and an ``out`` numpy can write); the block kernels
    round as it does where it does."""
    return (
        NUMPY
        and out.is_cpu
        and out.dtype in _FLOATS
        and type(comp)._decode_add_host is not None
        and comp._parse_mode != 2
        and not out.requires_grad
        and (out.stride(1) == 1 or out.shape[1] == 1)
    )


def numpy_writable(out: torch.Tensor) -> bool:
    """Whether a block kernel adds into ``out`` with numpy (a contiguous CPU float32/float64
    tensor outside autograd): numpy's unbuffered calls cost a third of torch's per call. Not
    switched by :data:`NUMPY`: the block kernels are off as a whole under
    :func:`reference_kernels`."""
    return (out.is_contiguous() and out.is_cpu and out.dtype in _FLOATS
            and not out.requires_grad)


# ------------------------------------------------------------------ block kernels
def block_kernel(hook: Any, dtype: torch.dtype | None = None,
                 dtypes: tuple[torch.dtype, ...] = ()) -> Any:
    """``hook`` (a compressor's bound ``_fast_*`` block kernel) where it serves: registered,
    not under :func:`reference_kernels`, and (with ``dtype``) for one of ``dtypes``; else None
    (the caller runs the reference)."""
    if hook is None or REFERENCE or (dtype is not None and dtype not in dtypes):
        return None
    return hook


def batch_encode(X: Any) -> bool:
    """Whether a vectorized ``encode_rows`` should batch ``X``; else the per-row loop, which
    gives the same bytes. On CPU a single row, or rows of at least :data:`LOOP_FROM` entries,
    go through the loop: the single-message encoders of top-k and sign are numpy (or numba)
    code working in cache-sized chunks, cheaper per entry than their batched torch twins, which
    only win on short rows, where per-call overhead dominates. Under MPI with one node per rank
    every block is a single row."""
    return (isinstance(X, torch.Tensor) and X.dim() == 2 and X.shape[0] > 0 and X.shape[1] > 0
            and not (X.is_cpu and (X.shape[0] == 1 or loop_rows(X.shape[1]))))


def loop_check(comp: Any, block: torch.Tensor, d: int) -> bool:
    """Whether a received block is validated message by message (``from_bytes`` per row)
    rather than by the batch form's vectorized check: on CPU, for a single row or rows of
    ``d`` entries long enough to loop (as :func:`batch_encode`), when the compressor parses
    on numpy views (a few µs a message, where the vectorized torch check costs ~0.1–0.2 ms a
    call). Under MPI with one node per rank every received block of a neighbor is a single
    row."""
    return (NUMPY and block.is_cpu and comp._parse_mode != 2 and block.dim() == 2
            and (block.shape[0] == 1 or loop_rows(d)))


def loop_rows(d: int) -> bool:
    """Whether rows of ``d`` entries are long enough to go one at a time (in place, from
    views, in cache-sized chunks) rather than as one batched op: :data:`LOOP_FROM`."""
    return d >= LOOP_FROM


def loop_decode(out: torch.Tensor) -> bool:
    """Whether messages decode into ``out`` ([m, d]) one row at a time: long CPU rows."""
    return out.is_cpu and loop_rows(out.shape[1])


def chunked_add(d: int) -> bool:
    """Whether ``out += w·v`` over rows of ``d`` entries runs in cache-sized chunks."""
    return d >= CHUNKED_FROM


def table_decode(numel: int) -> bool:
    """Whether sign decodes ``numel`` entries by its table gather (one pass)."""
    return numel > TABLE_FROM


# ------------------------------------------------------------------ numba kernels
def jit_long(numel: int) -> bool:
    """Whether a message of ``numel`` entries is long enough for a numba kernel."""
    return numel >= JIT_FROM


def jit_kernel(name: str, numel: int | None = None) -> Any:
    """The numba kernel ``name`` (:mod:`.jit`), or None where it does not serve: numba
    missing, :data:`JIT` off, or (with ``numel``) a message shorter than :data:`JIT_FROM`."""
    if not JIT or (numel is not None and not jit_long(numel)):
        return None
    return jit.get(name)


def topk_rows_kernel(k: int, d: int) -> Any:
    """Top-k's ``topk_rows`` kernel for rows of ``d`` entries, where k is at most d/8 (its
    sampled threshold leaves few keys above it), else None (numpy's introselect)."""
    return jit_kernel("topk_rows") if 8 * (k + 1) <= d else None


def fused_mix(out: torch.Tensor, alpha: float | None = None) -> bool:
    """Whether :func:`gossip.compress.fused.mix_rows_` serves ``out``: a CPU float32/float64
    [m, d] tensor numpy can write, with contiguous rows, when numba is there (and, with
    ``alpha``, when the kernel can round ``out + alpha·sum`` as torch does here)."""
    return (out.is_cpu and out.dtype in _FLOATS
            and out.dim() == 2 and out.stride(1) == 1 and not out.requires_grad
            and jit_kernel("mix") is not None
            and (alpha is None or jit.torch_rounding("add_alpha", _NUMPY_OF[out.dtype]) != 0))


def dense_mix(comp: Any, out: torch.Tensor, alpha: float | None = None) -> bool:
    """Whether dense messages of ``comp`` mix into ``out`` by the fused kernel (it gives the
    numpy path's bits): long CPU rows, which the numpy path would add one pass per term, and a
    single row long enough for a numba kernel (:func:`jit_long`; one node per process, as
    under MPI), where the numpy path's per-call work (a few ops per term, and a pass over each
    received message for NaN/Inf) costs several times the kernel, which also tells whether
    the result is finite."""
    return (getattr(comp, "sends_values_in_place", False)
            and (loop_rows(out.shape[-1]) or (out.shape[0] == 1 and jit_long(out.shape[-1])))
            and out.dim() == 2 and fused_mix(out, alpha) and host_decode(comp, out))
