"""Bit packing with plain torch integer ops (no custom kernels), on any device.

Packing 8 one-bit flags into a byte: view 8 flag bytes as one int64, keep the wanted bit of each
byte, and one multiplication by a magic constant moves bit ``b`` of byte ``i`` to bit ``56 + i``
(all partial products land on distinct bits, so nothing carries); ``>> 56`` leaves the packed
byte. That is three int64 ops per 8 entries. Unpacking goes through a 256-entry table whose
entry ``v`` is an int64 holding the 8 bits of ``v`` as 8 bytes (or as 8 signed floats).

Codes wider than one bit are stored as bit planes: plane ``j`` holds bit ``j`` of every code,
⌈d/8⌉ bytes each, so a ``w``-bit code vector takes ``w·⌈d/8⌉`` bytes (at most ``w − 1`` bytes
more than ⌈w·d/8⌉). Codes of 8..24 bits store their low byte raw (the first ``8·⌈d/8⌉``
bytes, the same room as 8 planes) and the high bits as planes.

Flag and code inputs are padded to ``8·⌈d/8⌉`` entries with zeros by the caller (workspaces).
Bit ``i`` of a packed byte is entry ``8·byte + i`` (little-endian bit order).

On the CPU the same bytes are produced with numpy's ``packbits``/``unpackbits``, which beat
torch's CPU kernels on uint8/bool work; set ``gossip.compress.dispatch.NUMPY = False`` to run
the torch path everywhere (the tests check both give identical bytes).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from gossip.compress.dispatch import numpy_path
from gossip.errors import CompressionError

if sys.byteorder != "little":  # pragma: no cover - every torch platform we target
    raise ImportError("gossip.compress assumes a little-endian host")


def _s64(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v


_MASK = [_s64(0x0101010101010101 << b) for b in range(8)]
_MAGIC = [sum(1 << (56 - b - 7 * i) for i in range(8)) for b in range(8)]

_TABLES: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def nbytes_bits(d: int) -> int:
    """Bytes of one bit plane for ``d`` entries."""
    return (d + 7) // 8


def padded(d: int) -> int:
    """``d`` rounded up to a multiple of 8 (room the pack functions read)."""
    return 8 * nbytes_bits(d)


def _table(name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    key = (name, dtype, device)
    t = _TABLES.get(key)
    if t is None:
        v = torch.arange(256, dtype=torch.int64)
        flags = (v[:, None] >> torch.arange(8)) & 1  # (256, 8): bit i of v
        if name == "bytes":  # int64 whose byte i is bit i of v
            t = (flags << (8 * torch.arange(8))).sum(1)
        elif name == "pm1":  # +1 for a clear bit, -1 for a set bit (the sign convention)
            t = (1 - 2 * flags).to(dtype)
        elif name == "signbit32":  # the float32 sign bit for a set bit
            t = torch.where(flags.bool(), -(1 << 31), 0).to(torch.int32)
        elif name == "popcount":
            t = flags.sum(1)
        else:  # pragma: no cover
            raise CompressionError(f"no bit table named {name!r}; the tables are bytes, pm1, signbit32 and "
                                   "popcount")
        t = t.to(device).contiguous()
        _TABLES[key] = t
    return t


def pm1_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(256, 8) table: row v holds ±1 for the 8 bits of v (set bit -> -1)."""
    return _table("pm1", dtype, device)


_NP_TABLES: dict[tuple, np.ndarray] = {}


def signbit32_table(device: torch.device) -> torch.Tensor:
    """(256, 8) int32 table: row v holds the float32 sign bit for each set bit of v."""
    return _table("signbit32", torch.int32, device)


def popcount(packed: torch.Tensor) -> torch.Tensor:
    """Number of set bits in a uint8 tensor (0-dim int64 tensor)."""
    return _table("popcount", torch.int64, packed.device)[packed.long()].sum()


def pack_bit(src: torch.Tensor, bit: int, out: torch.Tensor, tmp: torch.Tensor) -> None:
    """``out[j]`` gets bit ``bit`` of bytes ``src[8j : 8j+8]`` (``src`` uint8, 8-aligned).

    ``tmp`` is an int64 scratch of ``out.numel()`` entries.
    """
    v = src.view(torch.int64)
    torch.bitwise_and(v, _MASK[bit], out=tmp)
    tmp.mul_(_MAGIC[bit])
    tmp.bitwise_right_shift_(56)
    out.copy_(tmp)  # keeps the low byte


def unpack_bytes(packed: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """int64 ``out`` (one per packed byte) whose 8 bytes are the 8 bits (0/1) of that byte.

    ``idx`` is an int32 scratch of ``packed.numel()`` entries.
    """
    idx.copy_(packed)
    return torch.index_select(_table("bytes", torch.int64, packed.device), 0, idx, out=out)


def rows(packed: torch.Tensor, table: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` (n, 8) gets ``table[packed]``: 8 entries per byte from a (256, 8) table."""
    idx.copy_(packed)
    torch.index_select(table, 0, idx, out=out)


def cast_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` with C casting (floats truncate, ints keep their low bits)."""
    if numpy_path(dst.device, src.dtype):  # numpy's float->uint8 cast beats torch's on the CPU
        np.copyto(dst.numpy(), src.numpy(), casting="unsafe")
    else:
        dst.copy_(src)


def pack_flags(flags: torch.Tensor, d: int, out: torch.Tensor, ws) -> None:
    """Pack ``flags`` (bool, ``padded(d)`` entries with a False tail) into ``out`` (⌈d/8⌉ bytes)."""
    if numpy_path(flags.device):
        out.numpy()[:] = np.packbits(flags.numpy(), bitorder="little")
        return
    tmp = ws.get("pack.tmp", out.numel(), torch.int64, flags.device)
    pack_bit(flags.view(torch.uint8), 0, out, tmp)


def pack_negative(x: torch.Tensor, out: torch.Tensor, ws) -> None:
    """Bit i of ``out`` = ``x_i < 0`` (so −0.0 and +0.0 give 0); ``x`` 1-D, ⌈d/8⌉ bytes out."""
    d = x.numel()
    flags = ws.get("flags", padded(d), torch.bool, x.device)
    if numpy_path(x.device, x.dtype):
        np.less(x.numpy(), 0, out=flags.numpy()[:d])
    else:
        torch.lt(x, 0, out=flags[:d])
    flags[d:].zero_()
    pack_flags(flags, d, out, ws)


def code_dtype(width: int) -> torch.dtype:
    """The integer dtype codes of ``width`` bits are held in before packing."""
    return torch.uint8 if width <= 8 else torch.int32


def packed_nbytes(d: int, width: int) -> int:
    """Bytes of ``d`` codes of ``width`` bits in the bit-plane layout: ``width·⌈d/8⌉``."""
    return width * nbytes_bits(d)


def pack_codes(codes: torch.Tensor, width: int, out: torch.Tensor, ws, device) -> None:
    """Pack ``codes`` (``padded(d)`` entries, zero tail, dtype ``code_dtype(width)``) into
    ``out`` (``packed_nbytes(d, width)`` bytes). ``ws`` is a :class:`Workspace`.

    Layout: for width < 8, planes 0..width−1; for width ≥ 8, the low byte of every code raw
    (8·⌈d/8⌉ bytes, the room of 8 planes) then planes 8..width−1.
    """
    n8 = codes.numel() // 8
    first = 0
    if width >= 8:
        out[: 8 * n8].copy_(codes)  # int32 -> uint8 keeps the low byte
        first = 8
    if first == width:
        return
    if numpy_path(device):
        c = codes.numpy()
        sh = ws.get("pack.shift", 8 * n8, codes.dtype, device).numpy()
        fl = ws.get("pack.flag", 8 * n8, torch.uint8, device).numpy()
        o = out.numpy()
        for j in range(first, width):
            np.right_shift(c, j, out=sh)
            np.bitwise_and(sh, 1, out=sh)
            src = sh if sh.dtype == np.uint8 else fl
            if src is fl:
                np.copyto(fl, sh, casting="unsafe")
            o[j * n8 : (j + 1) * n8] = np.packbits(src.view(bool), bitorder="little")
        return
    tmp = ws.get("pack.tmp", n8, torch.int64, device)
    if width < 8:
        for j in range(width):
            pack_bit(codes, j, out[j * n8 : (j + 1) * n8], tmp)
        return
    hi32 = ws.get("pack.hi32", 8 * n8, torch.int32, device)
    hi = ws.get("pack.hi", 8 * n8, torch.uint8, device)
    for j in range(8, width):
        if j % 8 == 0:  # next byte of the code
            torch.bitwise_right_shift(codes, j, out=hi32)
            hi.copy_(hi32)
        pack_bit(hi, j % 8, out[j * n8 : (j + 1) * n8], tmp)


def unpack_codes(packed: torch.Tensor, d: int, width: int, ws, device) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``padded(d)`` codes (a workspace tensor)."""
    n8 = nbytes_bits(d)
    dtype = code_dtype(width)
    if numpy_path(device):
        codes = ws.get("unpack.codes", 8 * n8, dtype, device)
        c = codes.numpy()
        first = 8 if width >= 8 else 0
        if first:
            np.copyto(c, packed.numpy()[: 8 * n8], casting="unsafe")
        else:
            c[:] = 0
        if width > first:
            planes = np.unpackbits(
                packed.numpy()[first * n8 : width * n8], bitorder="little"
            ).reshape(width - first, 8 * n8)
            sh = ws.get("unpack.shift", 8 * n8, dtype, device).numpy()
            for j in range(first, width):  # multiply, not left_shift: numpy's u8 shift is slow
                np.multiply(planes[j - first], sh.dtype.type(1 << j), out=sh, casting="unsafe")
                np.bitwise_or(c, sh, out=c)
        return codes
    idx = ws.get("unpack.idx", n8, torch.int32, device)
    tmp = ws.get("unpack.tmp", n8, torch.int64, device)
    acc = ws.get("unpack.acc", n8, torch.int64, device)
    if width < 8:
        _gather_planes(packed, 0, width, n8, idx, tmp, acc)
        return acc.view(torch.uint8)
    codes = ws.get("unpack.codes", 8 * n8, dtype, device)
    codes.copy_(packed[: 8 * n8])
    if width == 8:
        return codes
    high = ws.get("unpack.high", 8 * n8, torch.int32, device)
    for first in range(8, width, 8):
        _gather_planes(packed, first, min(width, first + 8), n8, idx, tmp, acc)
        high.copy_(acc.view(torch.uint8))
        high.bitwise_left_shift_(first)
        codes.bitwise_or_(high)
    return codes


def _gather_planes(packed, first, stop, n8, idx, tmp, acc) -> None:
    """``acc``'s bytes get bits ``first..stop-1`` of every code (planes ``first..stop-1``)."""
    acc.zero_()
    for j in range(first, stop):
        unpack_bytes(packed[j * n8 : (j + 1) * n8], idx, tmp)
        if j - first:
            tmp.bitwise_left_shift_(j - first)
        acc.bitwise_or_(tmp)


# ----------------------------------------------------------- numpy path for CPU tensors
_SMALL_NP = 1 << 16  # up to this many codes, all planes are packed in one numpy call
# The same bytes as :func:`pack_codes` / :func:`unpack_codes`, in few numpy calls: planes are
# packed from a (planes, d) uint8 array in one ``packbits``, and unpacked 8 entries at a time
# through a 256-entry uint64 table (entry v holds bit i of v in byte i), shifted per plane and
# OR-reduced, so every op runs on ⌈d/8⌉ words.


def _np_cached(key: tuple, make) -> np.ndarray:
    t = _NP_TABLES.get(key)
    if t is None:
        t = _NP_TABLES[key] = make()
    return t


def _bytes_table() -> np.ndarray:
    return _np_cached(("bytes",), lambda: _table("bytes", torch.int64, torch.device("cpu")).numpy().view(np.uint64))


def _plane_masks(n: int) -> np.ndarray:
    """(n, 1) uint8 column of ``1 << j``."""
    return _np_cached(("masks", n), lambda: np.array([1 << j for j in range(n)], np.uint8)[:, None])


def _plane_shifts(n: int) -> np.ndarray:
    """(n, 1) uint64 column of j."""
    return _np_cached(("shifts", n), lambda: np.arange(n, dtype=np.uint64)[:, None])


def _pack_planes(src: np.ndarray, n: int, planes: np.ndarray, ws) -> None:
    """``planes`` (n, ⌈d/8⌉, any row stride) get bits 0..n−1 of the uint8 entries ``src`` (d,
    each < 2^n).

    Up to :data:`_SMALL_NP` entries (a chunk of an encoder, in cache) all planes at once: one
    ``bitwise_and`` into an (n, d) workspace and one ``packbits``; larger inputs a plane at a
    time (no n·d temporary streamed through memory).
    """
    if n == 1:  # entries are 0/1 (codes < 2^width): packbits reads nonzero as set
        planes[0] = np.packbits(src, bitorder="little")
        return
    d = src.size
    if d <= _SMALL_NP or ws is None:
        bit = np.empty((n, d), np.uint8) if ws is None else ws.host("pack.bits", n * d, torch.uint8)
        np.bitwise_and(src, _plane_masks(n), out=bit.reshape(n, d))
        planes[:] = np.packbits(bit.reshape(n, d), axis=1, bitorder="little")
        return
    bit = ws.host("pack.bit", d, torch.uint8)
    for j in range(n):  # packbits reads any nonzero byte as a set bit
        np.bitwise_and(src, np.uint8(1 << j), out=bit)
        planes[j] = np.packbits(bit, bitorder="little")


def _unpack_planes(planes: np.ndarray) -> np.ndarray:
    """uint8 entries (8·⌈d/8⌉) whose bits 0..n−1 come from ``planes`` (n, ⌈d/8⌉), n ≤ 8."""
    g = _bytes_table().take(planes)
    n = planes.shape[0]
    if n == 1:
        return g.view(np.uint8).reshape(-1)
    g <<= _plane_shifts(n)
    return np.bitwise_or.reduce(g, axis=0).view(np.uint8)


def popcount_np(packed: np.ndarray) -> int:
    """Number of set bits in a uint8 array."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2
        return int(np.bitwise_count(packed).sum())
    pop = _np_cached(("popcount",), lambda: _table("popcount", torch.int64, torch.device("cpu")).numpy())
    return int(pop.take(packed).sum())


def host_code_dtype(width: int) -> type:
    """The numpy dtype codes of ``width`` bits are held in on the numpy path."""
    return np.uint8 if width <= 8 else np.uint16 if width <= 16 else np.int32


def pack_codes_np(codes: np.ndarray, width: int, out: np.ndarray, ws, a: int = 0,
                  d: int | None = None) -> None:
    """numpy twin of :func:`pack_codes`: ``codes`` (dtype ``host_code_dtype(width)``, no padding
    needed) are entries ``a..a+len−1`` of a message of ``d`` codes (default: all of them) whose
    ``packed_nbytes(d, width)`` bytes are ``out``. A chunk (``a`` a multiple of 8, every chunk
    but the last a multiple of 8 long) writes exactly its bytes of the message, so packing the
    chunks of a vector in any order gives the bytes of packing it at once. ``ws`` is a
    :class:`Workspace`."""
    n = codes.size
    d = n if d is None else d
    n8, a8, c8 = nbytes_bits(d), a // 8, nbytes_bits(n)
    if width < 8:
        _pack_planes(codes, width, out[: width * n8].reshape(width, n8)[:, a8 : a8 + c8], ws)
        return
    np.copyto(out[a : a + n], codes, casting="unsafe")  # the low byte, raw
    if a + n == d:
        out[d : 8 * n8] = 0
    byte = ws.host("pack.byte", n, torch.uint8) if width > 8 else None
    for first in range(8, width, 8):  # planes of the next code byte
        k = min(width, first + 8) - first
        np.right_shift(codes, first, out=byte, casting="unsafe")  # keeps that byte
        _pack_planes(byte, k, out[first * n8 : (first + k) * n8].reshape(k, n8)[:, a8 : a8 + c8], ws)


def unpack_codes_np(packed: np.ndarray, d: int, width: int, ws) -> np.ndarray:
    """Inverse of :func:`pack_codes_np`: the d codes (unsigned, or int32 for more than 16 bits;
    a workspace array or a view of a temporary).

    Small inputs: 8 entries at a time through a 256-entry table; large ones stream through
    :func:`unpack_codes` (``unpackbits`` per plane into workspaces).
    """
    n8 = nbytes_bits(d)
    if d > _SMALL_NP:
        return unpack_codes(torch.from_numpy(packed), d, width, ws, torch.device("cpu")).numpy()[:d]
    if width < 8:
        return _unpack_planes(packed[: width * n8].reshape(width, n8))[:d]
    dt = host_code_dtype(width)
    codes = ws.host("unpack.codes", d, _TORCH_INT[dt])
    if width == 8:
        np.copyto(codes, packed[:d])
        return codes
    for first in range(8, width, 8):  # the higher code bytes, then the low one
        n = min(width, first + 8) - first
        byte = _unpack_planes(packed[first * n8 : (first + n) * n8].reshape(n, n8))[:d]
        if first == 8:
            np.left_shift(byte, first, out=codes, dtype=dt)
        else:
            codes |= np.left_shift(byte, first, dtype=dt)
    codes |= packed[:d]
    return codes


_TORCH_INT = {np.uint8: torch.uint8, np.uint16: torch.uint16, np.int32: torch.int32}


def codes_within_np(packed: np.ndarray, d: int, width: int, lo: int, hi: int, ws) -> bool:
    """Whether every one of the d codes packed by :func:`pack_codes_np` lies in [lo, hi].

    Widths below 8 are compared plane by plane, most significant bit first, on the packed
    bytes (8 codes per byte operation, no unpacking); the last, partial byte and wider codes
    are unpacked.
    """
    n8 = nbytes_bits(d)
    if width >= 8 or d <= _SMALL_NP:
        codes = unpack_codes_np(packed, d, width, ws)[:d]
        return d == 0 or (int(codes.min()) >= lo and int(codes.max()) <= hi)
    planes = packed[: width * n8].reshape(width, n8)
    full = d // 8
    if full < n8:  # entries of the last byte past d are padding: compare the real ones only
        tail = _unpack_planes(np.ascontiguousarray(planes[:, full:]))[: d - 8 * full]
        if int(tail.min()) < lo or int(tail.max()) > hi:
            return False
    outside = np.zeros(full, dtype=np.uint8)
    eq_lo = np.full(full, 0xFF, dtype=np.uint8)
    eq_hi = eq_lo.copy()
    tmp = np.empty(full, dtype=np.uint8)
    for b in reversed(range(width)):
        plane = planes[b, :full]
        if (lo >> b) & 1:  # a 0 here while equal so far: below lo
            np.invert(plane, out=tmp)
            tmp &= eq_lo
            outside |= tmp
            eq_lo &= plane
        else:
            np.invert(plane, out=tmp)
            eq_lo &= tmp
        if (hi >> b) & 1:
            eq_hi &= plane
        else:  # a 1 here while equal so far: above hi
            np.bitwise_and(plane, eq_hi, out=tmp)
            outside |= tmp
            np.invert(plane, out=tmp)
            eq_hi &= tmp
    return not outside.any()
