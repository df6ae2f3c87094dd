"""The byte layout every compressor message shares: an 8-byte header, then typed sections.

Header (little-endian)::

    byte 0      magic 0xC5
    byte 1      version (high nibble, currently 1) | value dtype code (low nibble)
    byte 2      compressor kind (``KINDS``; +0x80 when applied per tensor of a layout): the
                built-ins' fixed ones, or one the package assigns (``assigned_kind``)
    byte 3      one compressor parameter (bit width, index format, rank, flags)
    bytes 4..7  numel of the tensor mod 2³² (uint32)

The sections that follow (:class:`Sections`) start at offsets that are multiples of their
element size, so a section is a zero-copy ``buffer[a:b].view(dtype)``. All sizes are known from
the receiving tensor's shape and dtype, so no lengths travel: a receiver checks the total.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Container, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from gossip.errors import CompressionError

HEADER_NBYTES = 8
MAGIC = 0xC5
VERSION = 1
PER_TENSOR = 0x80

KINDS: dict[int, str] = {
    1: "none",
    2: "fp16",
    3: "bf16",
    4: "topk",
    5: "randk",
    6: "sign",
    7: "qsgd",
    8: "lead",
    9: "natural",
    10: "lowrank",
}

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float64: 2,
    torch.float16: 3,
    torch.bfloat16: 4,
}
_CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}

# numpy twins of the section dtypes; bfloat16 has none (its sections are viewed as uint16 and
# handed out as torch views)
NP_DTYPES: dict[torch.dtype, type] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.uint8: np.uint8,
    torch.int32: np.int32,
    torch.int64: np.int64,
}


ASSIGNED_KINDS = range(32, PER_TENSOR)
"""Kinds the package gives compressor classes that leave ``kind`` unset (the built-ins' fixed
kinds are below 32)."""


def assigned_kind(key: str, taken: Container[int]) -> int:
    """The wire kind for the compressor class named ``key`` (``module.QualifiedName``): the
    CRC-32 of the name picks a start in :data:`ASSIGNED_KINDS` and the first kind from there
    not in ``taken`` is it. Every process that imports the same classes gets the same kinds
    (the name decides, not the order of imports, unless two names meet on one start); nothing
    about them is stored, so they may differ between versions of the code."""
    size = len(ASSIGNED_KINDS)
    start = zlib.crc32(key.encode("utf-8")) % size
    for step in range(size):
        kind = ASSIGNED_KINDS[(start + step) % size]
        if kind not in taken:
            return kind
    raise CompressionError(f"{key}: every wire kind {ASSIGNED_KINDS.start}..{ASSIGNED_KINDS.stop - 1} "
                           "is taken by another compressor class; register fewer classes")


def kind_name(kind: int) -> str:
    base = KINDS.get(kind & ~PER_TENSOR, f"unknown kind {kind & ~PER_TENSOR}")
    return f"{base} (per tensor)" if kind & PER_TENSOR else base


@dataclass(frozen=True)
class Sections:
    """Named typed sections laid out back to back, each aligned to its element size."""

    names: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    counts: tuple[int, ...]
    offsets: tuple[int, ...]
    nbytes: int

    @classmethod
    def build(cls, *items: tuple[str, torch.dtype, int]) -> Sections:
        offsets, pos = [], 0
        for _, dtype, count in items:
            size = dtype.itemsize
            pos = -(-pos // size) * size
            offsets.append(pos)
            pos += size * count
        names, dtypes, counts = zip(*items, strict=True) if items else ((), (), ())
        return cls(tuple(names), tuple(dtypes), tuple(counts), tuple(offsets), pos)

    def views(self, body: torch.Tensor) -> dict[str, torch.Tensor]:
        """Typed views into ``body`` (uint8, storage offset a multiple of 8)."""
        out = {}
        for name, dtype, count, off in zip(
            self.names, self.dtypes, self.counts, self.offsets, strict=True
        ):
            out[name] = body[off : off + count * dtype.itemsize].view(dtype)
        return out


class Plan:
    """Everything about a message that depends only on (shape, dtype, device) and the spec.

    ``slots`` are (name, start, stop, numpy dtype, torch dtype) of each section relative to
    the message start (header included); ``host`` says whether the numpy fast path can serve
    it (a CPU tensor of float32/float64 values).
    """

    __slots__ = (
        "sec", "nbytes", "header", "header_np", "param", "numel", "device", "cpu", "host",
        "slots", "gaps", "extra", "_header_t", "_template",
    )  # fmt: skip

    def __init__(
        self, sec: Sections, kind: int, dtype: torch.dtype, param: int, numel: int, device
    ) -> None:
        self.sec = sec
        self.nbytes = HEADER_NBYTES + sec.nbytes
        self.header = header_bytes(kind, dtype, param, numel)
        self.header_np = np.frombuffer(self.header, dtype=np.uint8)
        self.param = param
        self.numel = numel
        self.device = device
        self.cpu = device.type == "cpu"
        self.host = self.cpu and dtype in (torch.float32, torch.float64)
        self.slots = tuple(
            (name, HEADER_NBYTES + off, HEADER_NBYTES + off + count * dt.itemsize, NP_DTYPES.get(dt), dt)
            for name, dt, count, off in zip(sec.names, sec.dtypes, sec.counts, sec.offsets, strict=True)
        )  # fmt: skip
        self.gaps = _gaps(self.slots, self.nbytes)
        self.extra: dict[str, Any] = {}  # per-plan constants a compressor caches
        self._header_t: torch.Tensor | None = None
        self._template: np.ndarray | None = None

    def new_message(self) -> np.ndarray:
        """A fresh message buffer (numpy uint8) with the header written, body uninitialised."""
        if self.nbytes <= 1 << 14:  # one small copy beats allocating, then writing 8 bytes
            t = self._template
            if t is None:
                t = self._template = np.zeros(self.nbytes, dtype=np.uint8)
                t[:HEADER_NBYTES] = self.header_np
            return t.copy()
        arr = np.empty(self.nbytes, dtype=np.uint8)
        arr[:HEADER_NBYTES] = self.header_np
        self.zero_gaps(arr)
        return arr

    def zero_gaps(self, buf: Any) -> None:
        """Zero the alignment padding between sections (``gaps``) of a message ``buf`` (numpy
        or torch), or of every row of a block ([m, nbytes]): no byte on the wire is left
        uninitialised, so the same model gives the same bytes by every path."""
        for a, b in self.gaps:
            buf[..., a:b] = 0

    def host_views(self, arr: np.ndarray) -> dict[str, Any]:
        """Section views of a whole message ``arr`` (numpy uint8; torch for bfloat16)."""
        out = {}
        for name, a, b, npdt, dt in self.slots:
            if npdt is None:
                out[name] = torch.from_numpy(arr[a:b].view(np.uint16)).view(dt)
            else:
                out[name] = arr[a:b].view(npdt)
        return out

    def host_views_at(self, arr: np.ndarray, shift: int) -> dict[str, Any]:
        """:meth:`host_views` of a body placed ``shift`` bytes later than in a standalone
        message (the per-tensor layout)."""
        out = {}
        for name, a, b, npdt, dt in self.slots:
            if npdt is None:
                out[name] = torch.from_numpy(arr[a + shift : b + shift].view(np.uint16)).view(dt)
            else:
                out[name] = arr[a + shift : b + shift].view(npdt)
        return out

    def torch_views(self, buf: torch.Tensor, host: bool) -> dict[str, torch.Tensor]:
        """Section views of a whole message ``buf`` (torch uint8 on the plan's device).

        ``host``: build them through numpy (CPU only; cheaper than torch slicing).
        """
        if host:
            views = self.host_views(buf.numpy())
            return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in views.items()}
        return {name: buf[a:b].view(dt) for name, a, b, _, dt in self.slots}

    def write_header(self, buf: torch.Tensor) -> None:
        """Write the header into ``buf[:8]`` (a cached device copy: no host sync on CUDA)."""
        h = self._header_t
        if h is None:
            h = self._header_t = torch.from_numpy(self.header_np.copy()).to(self.device)
        buf[:HEADER_NBYTES].copy_(h)


def _gaps(slots: tuple[Any, ...], nbytes: int) -> tuple[tuple[int, int], ...]:
    """The byte ranges of a message that neither the header nor a section covers."""
    gaps, pos = [], HEADER_NBYTES
    for _, a, b, _, _ in sorted(slots, key=lambda s: s[1]):
        if a > pos:
            gaps.append((pos, a))
        pos = max(pos, b)
    if nbytes > pos:
        gaps.append((pos, nbytes))
    return tuple(gaps)


def header_bytes(kind: int, dtype: torch.dtype, param: int, numel: int) -> bytes:
    """The 8 header bytes of a message."""
    return bytes([MAGIC, (VERSION << 4) | DTYPE_CODES[dtype], kind, param]) + (
        numel % (1 << 32)
    ).to_bytes(4, "little")


def align8(n: int) -> int:
    return (n + 7) & ~7


@lru_cache(maxsize=512)
def _header_tensor(
    kind: int, dtype: torch.dtype, param: int, numel: int, device: torch.device
) -> torch.Tensor:
    raw = header_bytes(kind, dtype, param, numel)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)


def write_header(buf: torch.Tensor, kind: int, dtype: torch.dtype, param: int, numel: int) -> None:
    """Write the header into ``buf[:8]`` (a cached device copy: no host sync on CUDA)."""
    buf[:HEADER_NBYTES].copy_(_header_tensor(kind, dtype, param, numel, buf.device))


def new_buffer(
    nbytes: int, device: torch.device, out: torch.Tensor | None, name: str
) -> torch.Tensor:
    """A fresh uint8 buffer of ``nbytes`` bytes, or the prefix of a caller's ``out``."""
    if out is None:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    if out.dtype != torch.uint8 or out.dim() != 1 or not out.is_contiguous():
        raise CompressionError(f"{name}: out= must be a contiguous 1-D uint8 tensor")
    if out.numel() < nbytes:
        raise CompressionError(
            f"{name}: out= holds {out.numel()} bytes, the message needs {nbytes}"
        )
    if out.device != device:
        raise CompressionError(f"{name}: out= is on {out.device}, the tensor on {device}")
    if out.storage_offset() % 8:
        raise CompressionError(
            f"{name}: out= must start at a storage offset that is a multiple of 8"
        )
    return out[:nbytes]


def as_message(buf: object, name: str) -> torch.Tensor:
    """Check that ``buf`` is a 1-D uint8 tensor (a received message)."""
    if not isinstance(buf, torch.Tensor):
        raise CompressionError(
            f"{name}: expected a uint8 torch.Tensor message, got {type(buf).__name__}"
        )
    if buf.dtype != torch.uint8:
        raise CompressionError(f"{name}: expected a uint8 message, got dtype {buf.dtype}")
    if buf.dim() != 1:
        raise CompressionError(f"{name}: expected a 1-D message, got shape {tuple(buf.shape)}")
    return buf


def check_header(
    buf: torch.Tensor,
    *,
    name: str,
    kind: int,
    dtype: torch.dtype,
    param: int,
    param_name: str,
    numel: int,
    nbytes: int,
    shape: Sequence[int],
) -> None:
    """Validate header and total length of a received message against what we would send.

    Reads 8 bytes on the host (one sync on CUDA). Raises :class:`CompressionError` naming the
    first field that does not match.
    """
    n = buf.numel()
    if n < HEADER_NBYTES:
        raise CompressionError(
            f"{name}: message of {n} bytes is truncated: even the {HEADER_NBYTES}-byte header "
            f"is incomplete (expected {nbytes} bytes)"
        )
    h = list(buf[:HEADER_NBYTES].cpu().numpy().tobytes())
    if h[0] != MAGIC:
        raise CompressionError(
            f"{name}: bad magic byte 0x{h[0]:02X} (expected 0x{MAGIC:02X}): not a gossip "
            "compressor message (wrong buffer, or wrong offset into it?)"
        )
    if h[1] >> 4 != VERSION:
        raise CompressionError(
            f"{name}: wire format version {h[1] >> 4} is not supported (this build reads "
            f"version {VERSION}); sender and receiver must run the same gossip version"
        )
    if h[2] != kind:
        raise CompressionError(
            f"{name}: message was produced by compressor '{kind_name(h[2])}', this one is "
            f"'{kind_name(kind)}'; every node must use the same spec"
        )
    code = h[1] & 0x0F
    if code != DTYPE_CODES[dtype]:
        got = _CODE_DTYPES.get(code, f"unknown dtype code {code}")
        raise CompressionError(
            f"{name}: message carries {got} values but the receiving tensor is {dtype}"
        )
    if h[3] != param:
        raise CompressionError(
            f"{name}: header {param_name} is {h[3]}, expected {param} for this spec "
            "(sender built with different parameters, or a corrupt message)"
        )
    sent = int.from_bytes(bytes(h[4:8]), "little")
    if sent != numel % (1 << 32):
        raise CompressionError(
            f"{name}: message is for a tensor of {sent} entries (mod 2^32), the receiving "
            f"tensor has {numel} (shape {tuple(shape)})"
        )
    if n != nbytes:
        what = "truncated" if n < nbytes else "extended"
        raise CompressionError(
            f"{name}: message is {what}: {n} bytes, but a message for shape {tuple(shape)} "
            f"{dtype} has exactly {nbytes}"
        )


def aligned_on(buf: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``buf`` on ``device`` and at a storage offset that is a multiple of 8 (copies if not)."""
    if buf.device != device:
        buf = buf.to(device)
    if buf.storage_offset() % 8 or buf.data_ptr() % 8 or not buf.is_contiguous():
        buf = buf.clone()
    return buf


def numel_of(shape: Sequence[int]) -> int:
    return math.prod(shape)
