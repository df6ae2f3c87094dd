"""Shared pieces of the vectorized block methods (``encode_rows`` / ``decode_add_rows_``).

A block is a [m, nbytes] uint8 view whose row ``r`` is node ``r``'s message, rows 8-aligned
(``base.row_stride``), so a message section (``Plan.slots``: byte range and dtype) of every row
at once is the typed view ``block[:, a:b].view(dtype)``: a [m, count] tensor. The compressors
that override the block methods (``none``, ``fp16``/``bf16``, ``topk``, ``sign``/``sign_l2``)
write and read those views with a few torch ops for the whole block and use the helpers here for
what they share: the header rows, the per-row weights, the check of ``rows=``, and raising the
per-row error of the first bad row (by running the single-message method on it, so the message
and the ``row`` attribute are exactly those of the default loop).

Bit equality with the per-row methods is the contract. Where it depends on the path the
single-message ``decode_add_`` takes (the numpy host path rounds ``w·v`` before the add, the
torch path fuses ``out + w·v``), :func:`gossip.compress.dispatch.host_decode` says which one
a row would take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.compress import bits, dispatch
from gossip.compress.base import Compressor, _row_block
from gossip.compress.wire import HEADER_NBYTES, Plan
from gossip.errors import CompressionError

#: at and above this many entries a 1-D CPU reduction splits across threads (torch's
#: ``at::internal::GRAIN_SIZE``), so a row of a block reduces in another order than the row alone
GRAIN_SIZE = 32768


def is_block(X: Any) -> bool:
    """A 2-D tensor with at least one row and one column (others take the default loop)."""
    return isinstance(X, torch.Tensor) and X.dim() == 2 and X.shape[0] > 0 and X.shape[1] > 0


def start_encode(comp: Any, X: torch.Tensor, out: torch.Tensor | None) -> tuple[Plan, torch.Tensor, torch.Tensor]:
    """The plan of a row, ``X`` detached, and the block (header rows written)."""
    plan = comp.plan(X[0])  # dtype and size checks of a single message
    if X.requires_grad:
        X = X.detach()
    block = _row_block(out, X.shape[0], plan.nbytes, X.device)
    # through .data (a version counter of its own): a model that lives in its message rows
    # (``none`` sends it in place) keeps its version, which says its values did not change
    framing = block.data
    framing[:, :HEADER_NBYTES].view(torch.int64).fill_(header_int64(plan))
    plan.zero_gaps(framing)
    return plan, X, block


def encode_rows_looped(comp: Any, X: torch.Tensor, rng: Any = None, *,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """A ``_fast_encode_rows`` for compressors whose numpy twin (``_encode_host``) beats their
    batch form on the CPU blocks :func:`.dispatch.batch_encode` does not batch (one row, long
    rows): those one row at a time through the single-message path, others the reference."""
    if is_block(X) and X.is_cpu and not dispatch.batch_encode(X):
        return Compressor.encode_rows(comp, X, rng, out=out)
    return comp._encode_rows_ref(X, rng, out)


def header_int64(plan: Plan) -> int:
    """The 8 header bytes as one little-endian int64 (a row's header is one int64 store)."""
    h = plan.extra.get("rows.header")
    if h is None:
        h = plan.extra["rows.header"] = int.from_bytes(plan.header, "little", signed=True)
    return h


def section(block: torch.Tensor, plan: Plan, name: str) -> torch.Tensor:
    """The [m, count] typed view of section ``name`` in every row of ``block``."""
    where = plan.extra.get("rows.sections")
    if where is None:
        where = plan.extra["rows.sections"] = {n: (a, b, dt) for n, a, b, _, dt in plan.slots}
    a, b, dt = where[name]
    return block[:, a:b].view(dt)


def arange(m: int, device: torch.device) -> torch.Tensor:
    """``torch.arange(m)`` on ``device``, cached (the row indices of a block)."""
    key = (m, device)
    t = _ARANGE.get(key)
    if t is None:
        if len(_ARANGE) > 64:
            _ARANGE.clear()
        t = _ARANGE[key] = torch.arange(m, device=device)
    return t


_ARANGE: dict[tuple[int, torch.device], torch.Tensor] = {}


def first(mask: torch.Tensor) -> int | None:
    """The first row where ``mask`` ([m] bool) is set, else None (one host sync)."""
    if not bool(mask.any()):
        return None
    return int(mask.nonzero()[0, 0])


def raise_row(r: int, single: Callable[[], Any], why: str) -> None:
    """Raise the error ``single()`` (the single-message method on row ``r``) raises, with
    ``.row = r``; if it passes (it should not), a :class:`CompressionError` saying ``why``."""
    try:
        single()
    except CompressionError as exc:
        exc.row = r
        raise
    exc = CompressionError(f"row {r}: {why}")
    exc.row = r
    raise exc


def encode_error(comp: Any, X: torch.Tensor, bad: torch.Tensor, why: str) -> None:
    """Raise the per-row ``encode`` error of the first row where ``bad`` ([m] bool) is set."""
    r = first(bad)
    if r is not None:
        raise_row(r, lambda: comp.encode(X[r]), why)


# ------------------------------------------------------------------ decoding
def start_decode(
    comp: Any, out: Any, block: Any, weight: Any, rows: Any, check: bool = True
) -> tuple[Plan, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Check what the vectorized decode needs; None sends the caller to the default loop.

    Returns the plan of an ``out`` row, the block (8-aligned rows, on ``out``'s device), the
    target row indices, the [m, 1] float64 weights (``float(weight[r])``; None for the float
    weight 1: a plain add) and the [m] mask of
    rows whose header is wrong (the caller ORs its body checks in and calls :func:`bad_row`, so
    the first bad row is the one the loop would stop at; None with ``check=False``: rows the
    caller encoded itself). A wrong size raises here.
    """
    if not (
        isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] > 0 and out.shape[1] > 0
        and isinstance(block, torch.Tensor) and block.dim() == 2 and block.dtype == torch.uint8
        and block.shape[0] > 0 and block.device == out.device
    ):  # fmt: skip
        return None
    m = block.shape[0]
    if rows is None:
        if m > out.shape[0]:
            return None
        tgt = arange(m, out.device)
    else:
        if not isinstance(rows, torch.Tensor) or rows.shape != (m,):
            return None
        tgt = rows.to(out.device, torch.int64)
        if check and torch.unique(tgt).numel() != m:  # a row added twice: the loop's order
            return None
    if isinstance(weight, torch.Tensor):
        if weight.numel() != m:
            return None
        w = weight.detach().reshape(m).to(out.device, torch.float64)
    elif float(weight) == 1.0:
        w = None  # a plain add: what both single-message paths do for weight 1
    else:
        w = torch.full((m,), float(weight), dtype=torch.float64, device=out.device)
    if w is not None:
        w = w.view(m, 1)
    plan = comp.plan(out[0])
    if block.shape[1] != plan.nbytes:
        t0 = int(tgt[0])
        raise_row(0, lambda: comp.from_bytes(block[0], out[t0]), "wrong message size")
    if block.stride(1) != 1 or block.stride(0) % 8 or block.storage_offset() % 8:
        block = _row_block(None, m, plan.nbytes, out.device).copy_(block)
    if not check:
        return plan, block, tgt, w, None
    head = block[:, :HEADER_NBYTES].view(torch.int64).view(m)
    return plan, block, tgt, w, head != header_int64(plan)


def start_values_decode(comp: Any, out: Any, block: Any, weight: Any, rows: Any,
                        check: bool) -> tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor] | None:
    """:func:`start_decode` for a message whose body is one ``values`` section (``none``,
    ``fp16``/``bf16``), the rows checked when ``check``: (block, targets, weights, values)."""
    st = start_decode(comp, out, block, weight, rows, check)
    if st is None:
        return None
    plan, block, tgt, w, bad = st
    vals = section(block, plan, "values")
    if check:
        bad_row(comp, out, block, tgt, value_mask(comp, {"values": vals}, bad), "bad row")
    return block, tgt, w, vals


def bad_row(comp: Any, out: torch.Tensor, block: torch.Tensor, tgt: torch.Tensor,
            mask: torch.Tensor, why: str) -> None:
    """Raise the ``from_bytes`` error of the first row where ``mask`` is set, if any."""
    r = first(mask)
    if r is not None:
        t = int(tgt[r])
        raise_row(r, lambda: comp.from_bytes(block[r], out[t]), why)


def value_mask(comp: Any, views: dict[str, torch.Tensor], bad: torch.Tensor) -> torch.Tensor:
    """``bad`` OR the value checks of ``Codec._check_received`` on every row: NaN/Inf in a
    floating section, a negative scale (skipped when ``check_finite`` is off, as there)."""
    if not comp.check_finite:
        return bad
    for name, v in views.items():
        if not v.is_floating_point():
            continue
        fin = torch.isfinite(v.sum(1))  # one pass, no [m, d] temporary
        if not bool(fin.all()):  # NaN/Inf, or a sum of finite values overflowing
            look = (~fin).nonzero().view(-1)
            rowbad = torch.zeros_like(bad)
            rowbad[look] = ~torch.isfinite(v.index_select(0, look)).all(1)
            bad = bad | rowbad
        if name in comp.scale_sections:
            bad = bad | (v < 0).any(1)
    return bad


def scratch(comp: Any, tag: str, shape: tuple[int, int], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    """A [m, d] workspace temporary (reused memory: no first-touch page faults)."""
    return comp.ws.get("rows." + tag, shape[0] * shape[1], dtype, device).view(shape)


def add_rows_(out: torch.Tensor, tgt: torch.Tensor | None, vals: torch.Tensor,
              w: torch.Tensor | None, fused: bool, tmp: torch.Tensor | None = None) -> None:
    """``out[tgt[r]] += w[r]·vals[r]`` for r = 0, 1, … in order (``w`` [m, 1] float64; ``tgt``
    None: rows 0..m−1 of ``out``, in place). A target may repeat: its adds happen in row order.

    ``fused`` rounds once, as ``add_(v, alpha=w)`` does (here bit for bit ``addcmul``); else
    ``w·vals`` is rounded first, as numpy's ``out += vals * w`` and ``index_add_`` do (in
    ``out``'s dtype, as numpy multiplies a float32 array by a Python float). ``w`` None: plain
    ``out += vals``. ``tmp``: a [m, d] scratch for ``w·vals``."""
    m = vals.shape[0]
    if (not fused and w is not None and dispatch.chunked_add(vals.shape[1]) and out.is_cpu and vals.is_cpu
            and out.stride(1) == 1 and vals.stride(1) == 1 and out.dtype == vals.dtype
            and out.dtype in (torch.float32, torch.float64)):
        _add_rows_chunked(out, tgt, vals, w)
        return
    if tgt is None:
        cur = out[:m]
        if w is None:
            cur.add_(vals)
        elif fused:
            cur.addcmul_(vals, w.to(out.dtype))  # as add_ casts alpha to out's dtype
        else:
            cur.add_(_product(vals, w, out.dtype, tmp))
        return
    if w is None or not fused:
        prod = vals if w is None else _product(vals, w, out.dtype, tmp)
        if out.dtype in (torch.float32, torch.float64):
            out.index_add_(0, tgt, prod)  # row after row (a repeated target adds in order)
            return
        for level in levels(tgt):  # half types: index_add_ sums a repeated target in float32
            out.index_add_(0, tgt if level is None else tgt[level],
                           prod if level is None else prod[level])
        return
    if dispatch.loop_rows(vals.shape[1]):  # long rows: in place, one row after another (no copies)
        wd = w.to(out.dtype)
        for r, t in enumerate(tgt.tolist()):
            out[t : t + 1].addcmul_(vals[r : r + 1], wd[r : r + 1])
        return
    for level in levels(tgt):  # one rounding per add needs distinct targets per call
        t = tgt if level is None else tgt[level]
        cur = out.index_select(0, t)
        cur.addcmul_(vals if level is None else vals[level],
                     (w if level is None else w[level]).to(out.dtype))
        out.index_copy_(0, t, cur)


def product_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the weights a ``dtype`` block is multiplied by, as torch takes a Python
    float in ``mul_``: the block's own, float32 for the half types."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _product(vals: torch.Tensor, w: torch.Tensor, dtype: torch.dtype,
             tmp: torch.Tensor | None) -> torch.Tensor:
    """``w·vals`` rounded to ``dtype``, as ``vals.mul_(w)`` with a Python float rounds it: the
    weight in ``dtype``, but float32 for the half types, whose products torch takes in float32
    (``add_``'s ``alpha``, by contrast, is cast to the half type: the fused paths do that)."""
    wd = w.to(product_dtype(dtype))
    if tmp is not None:
        return torch.mul(vals, wd, out=tmp)
    prod = vals * wd
    return prod if prod.dtype == dtype else prod.to(dtype)


_CHUNK = 1 << 17
"""Rows long enough for :func:`gossip.compress.dispatch.chunked_add` are multiplied and added
``_CHUNK`` entries at a time, the product staying in cache (2¹⁷ float32 entries, 512 KiB: small enough for the cache,
large enough to keep the numpy calls per row few)."""


def _add_rows_chunked(out: torch.Tensor, tgt: torch.Tensor | None, vals: torch.Tensor,
                      w: torch.Tensor) -> None:
    """``out[tgt[r]] += w[r]·vals[r]`` row after row, rounding ``w·v`` first, in numpy chunks
    whose product never leaves the cache (the same two roundings as the whole-row ops)."""
    import numpy as np

    on, vn = out.numpy(), vals.numpy()
    ws = w.to(out.dtype).view(-1).numpy()
    targets = list(range(vals.shape[0])) if tgt is None else tgt.tolist()
    d = vn.shape[1]
    tmp = np.empty(min(d, _CHUNK), dtype=vn.dtype)
    for a in range(0, d, _CHUNK):  # chunk-major: a target's chunk stays in cache across rows
        b = min(a + _CHUNK, d)
        p = tmp[: b - a]
        for r, t in enumerate(targets):  # rows in order: a repeated target adds in row order
            np.multiply(vn[r, a:b], ws[r], out=p)
            on[t, a:b] += p


def levels(tgt: torch.Tensor) -> list[torch.Tensor | None]:
    """Split row positions so each part has distinct targets and a target's k-th occurrence is
    in part k (parts in order keep every target's adds in row order); [None]: all distinct."""
    seen: dict[int, int] = {}
    level = [seen.__setitem__(t, seen.get(t, -1) + 1) or seen[t] for t in tgt.tolist()]
    if max(level, default=0) == 0:
        return [None]
    lv = torch.tensor(level, device=tgt.device)
    return [(lv == k).nonzero().view(-1) for k in range(max(level) + 1)]


# ------------------------------------------------------------------- bits
def pack_rows(flags: torch.Tensor, d: int, out: torch.Tensor) -> None:
    """Pack every row of ``flags`` ([m, ≥d] bool; only the first d columns are read, the
    padding bits are 0) into ``out`` ([m, ⌈d/8⌉] uint8 view), bit i of byte j = entry 8j+i."""
    m, n8 = out.shape
    if dispatch.numpy_path(flags.device):
        import numpy as np

        out.numpy()[:] = np.packbits(flags[:, :d].numpy(), axis=1, bitorder="little")
        return
    if flags.shape[1] != 8 * n8 or not flags.is_contiguous() or d % 8:
        padded = torch.zeros((m, 8 * n8), dtype=torch.bool, device=flags.device)
        padded[:, :d] = flags[:, :d]
        flags = padded
    v = flags.view(torch.uint8).view(torch.int64)  # [m, n8]
    t = torch.bitwise_and(v, bits._MASK[0])
    t.mul_(bits._MAGIC[0])
    t.bitwise_right_shift_(56)
    out.copy_(t)  # keeps the low byte


def pack_compare_rows(X: torch.Tensor, equal: bool, out: torch.Tensor, ws: Any) -> None:
    """:func:`pack_rows` of ``X == 0`` (``equal``) or ``X < 0`` ([m, d]): sign's and vote's
    bit planes. On the numpy path numpy compares into a workspace, several times faster than
    torch's CPU comparison (exact either way)."""
    m, d = X.shape
    if dispatch.numpy_path(X.device, X.dtype) and X.stride(1) == 1:
        import numpy as np

        flags = ws.host("rows.flags", m * d, torch.bool).reshape(m, d)
        (np.equal if equal else np.less)(X.numpy(), 0, out=flags)
        out.numpy()[:] = np.packbits(flags, axis=1, bitorder="little")
        return
    pack_rows(X == 0 if equal else X < 0, d, out)


def pack_bits(flags: torch.Tensor, out: torch.Tensor) -> None:
    """Pack every row of ``flags`` ([m, d] bool) into ``out`` ([m, ⌈d/8⌉] uint8, e.g. a
    message section): bit i of byte j is entry 8j + i, the padding bits 0. For batch codecs."""
    pack_rows(flags, flags.shape[1], out)


def unpack_bits(packed: torch.Tensor, d: int) -> torch.Tensor:
    """[m, d] uint8 0/1 from ``packed`` ([m, ⌈d/8⌉]), the inverse of :func:`pack_bits`."""
    return unpack_rows(packed, d)


def unpack_rows(packed: torch.Tensor, d: int) -> torch.Tensor:
    """[m, d] uint8 0/1 from the packed rows ``packed`` ([m, ⌈d/8⌉])."""
    if dispatch.numpy_path(packed.device):
        import numpy as np

        return torch.from_numpy(np.unpackbits(packed.numpy(), axis=1, count=d, bitorder="little"))
    m = packed.shape[0]
    tab = bits._table("bytes", torch.int64, packed.device)
    return tab[packed.long()].view(torch.uint8).view(m, -1)[:, :d]


def pm1_rows(packed: torch.Tensor, out: torch.Tensor, ws: Any) -> torch.Tensor:
    """``out`` ([k, 8·nb], contiguous) = ±1 for every bit of ``packed`` ([k, nb] uint8, rows
    may be strided; set bit -> −1): one table row per byte, one pass."""
    k, nb = packed.shape
    idx = ws.get("rows.pm1.idx", k * nb, torch.int32, packed.device)
    idx.view(k, nb).copy_(packed)
    torch.index_select(bits.pm1_table(out.dtype, out.device), 0, idx, out=out.view(k * nb, 8))
    return out


def chunk_rows(X: torch.Tensor, n: int) -> torch.Tensor:
    """[m·n, d/n]: the ``n`` equal chunks of every row of ``X`` ([m, d]) as rows (a view of
    contiguous rows, else a copy; for reading)."""
    m, d = X.shape
    return X.reshape(m * n, d // n)


def popcount_rows(packed: torch.Tensor) -> torch.Tensor:
    """Set bits of every row of ``packed`` ([m, n] uint8): [m] int64."""
    return bits._table("popcount", torch.int64, packed.device)[packed.long()].sum(1)
