"""``Codec``: the shared skeleton of every compressor here (header, sizes, validation, out=).

A concrete compressor describes its message body with a few hooks and never touches the header:

* ``_sections(shape, dtype)``: the typed sections of the body (sizes depend only on shape,
  dtype and the spec), raising :class:`CompressionError` for shapes it cannot compress;
* ``_encode_body(x, generator, views)``: fill the section views from ``x`` (contiguous);
  returns the payload ``parts`` (usually ``views`` plus cached extras);
* ``_parse_body(views, shape, dtype)``: validate a received body, return its ``parts``;
* ``_decode_body(parts, shape, dtype, out)`` and ``_decode_add_body(..., out, weight)``:
  write / accumulate the decoded tensor into a contiguous ``out`` of the payload's dtype.

The same hooks serve the per-tensor wrapper (:mod:`gossip.compress.pertensor`), which lays the
bodies of several tensors after one header.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gossip.compress.base import CompressionError, Compressor, Payload
from gossip.compress.checks import (
    FLOAT_DTYPES,
    Workspace,
    check_dtype,
    check_generator,
    shared_workspace,
)
from gossip.compress.wire import (
    HEADER_NBYTES,
    Sections,
    aligned_on,
    as_message,
    check_header,
    new_buffer,
    numel_of,
    write_header,
)


class Codec(Compressor):
    """Base of the concrete compressors; see the module docstring for the hooks."""

    kind: ClassVar[int] = 0
    param_name: ClassVar[str] = "parameter"
    dtypes: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.check_finite = True
        self._plans: dict[tuple[tuple[int, ...], torch.dtype], Sections] = {}

    @property
    def ws(self) -> Workspace:
        """Scratch memory (shared by the thread's compressors; see ``checks.Workspace``)."""
        return shared_workspace()

    # ----------------------------------------------------------------- hooks
    @property
    def param(self) -> int:
        """The header's parameter byte (bit width, rank, flags); see :meth:`param_for`."""
        return 0

    def param_for(self, shape: tuple[int, ...]) -> int:
        """The parameter byte of a standalone message for ``shape`` (default: ``param``)."""
        return self.param

    def _sections(self, shape: tuple[int, ...], dtype: torch.dtype) -> Sections:
        raise NotImplementedError

    def _encode_body(
        self, x: torch.Tensor, generator: torch.Generator | None, v: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        raise NotImplementedError

    def _parse_body(
        self, v: dict[str, torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype
    ) -> dict[str, Any]:
        return v

    def _decode_body(
        self, parts: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype, out: torch.Tensor
    ) -> None:
        raise NotImplementedError

    def _decode_add_body(
        self,
        parts: dict[str, Any],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        out: torch.Tensor,
        weight: float,
    ) -> None:
        tmp = self.ws.get("decode_add", out.numel(), dtype, out.device).view(out.shape)
        self._decode_body(parts, shape, dtype, tmp)
        out.add_(tmp, alpha=weight)

    # ------------------------------------------------------------- plumbing
    def sections(self, shape: tuple[int, ...], dtype: torch.dtype) -> Sections:
        """The body layout for a tensor of ``shape`` and ``dtype`` (cached)."""
        key = (tuple(shape), dtype)
        sec = self._plans.get(key)
        if sec is None:
            sec = self._sections(tuple(shape), dtype)
            self._plans[key] = sec
        return sec

    def check_input(self, x: torch.Tensor, generator: torch.Generator | None) -> None:
        """Dtype, emptiness and (for randomized compressors) the generator."""
        check_dtype(x, self.dtypes, self.spec)
        if self.randomized and self._needs_generator(x):
            check_generator(generator, x, self.spec)

    def _needs_generator(self, x: torch.Tensor) -> bool:
        return True

    def encode_into(
        self, x: torch.Tensor, generator: torch.Generator | None, body: torch.Tensor
    ) -> dict[str, Any]:
        """Encode ``x`` into a body slice (no header); returns the parts."""
        self.check_input(x, generator)
        sec = self.sections(tuple(x.shape), x.dtype)
        return self._encode_body(x.detach().contiguous(), generator, sec.views(body))

    # ------------------------------------------------------------ interface
    @torch.no_grad()
    def encode(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> Payload:
        self.check_input(x, generator)
        shape = tuple(x.shape)
        sec = self.sections(shape, x.dtype)
        buf = new_buffer(HEADER_NBYTES + sec.nbytes, x.device, out, self.spec)
        write_header(buf, self.kind, x.dtype, self.param_for(shape), x.numel())
        parts = self._encode_body(
            x.detach().contiguous(), generator, sec.views(buf[HEADER_NBYTES:])
        )
        return Payload(buf, x.shape, x.dtype, parts)

    @torch.no_grad()
    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        shape, dtype = tuple(payload.shape), payload.dtype
        if out is None:
            res = torch.empty(shape, dtype=dtype, device=payload.buffer.device)
            self._decode_body(payload.parts, shape, dtype, res)
            return res
        _check_out(out, payload, self.spec)
        if out.dtype == dtype and out.is_contiguous():
            self._decode_body(payload.parts, shape, dtype, out.view(shape))
        else:
            out.copy_(self.decode(payload).view(out.shape))
        return out

    @torch.no_grad()
    def decode_add_(self, out: torch.Tensor, payload: Payload, weight: float = 1.0) -> torch.Tensor:
        shape, dtype = tuple(payload.shape), payload.dtype
        _check_out(out, payload, self.spec)
        if out.dtype == dtype and out.is_contiguous():
            self._decode_add_body(payload.parts, shape, dtype, out.view(shape), float(weight))
        else:
            out.add_(self.decode(payload).view(out.shape), alpha=weight)
        return out

    @torch.no_grad()
    def from_bytes(self, buf: torch.Tensor, like: torch.Tensor) -> Payload:
        """Rebuild a payload for a tensor shaped like ``like`` (its values are not read).

        Checks header and exact length before any allocation, then the body (index ranges,
        bit widths, …). One host sync on CUDA for the header, plus one per body check.
        """
        buf = as_message(buf, self.spec)
        check_dtype(like, self.dtypes, self.spec)
        shape = tuple(like.shape)
        sec = self.sections(shape, like.dtype)
        check_header(
            buf,
            name=self.spec,
            kind=self.kind,
            dtype=like.dtype,
            param=self.param_for(shape),
            param_name=self.param_name,
            numel=like.numel(),
            nbytes=HEADER_NBYTES + sec.nbytes,
            shape=shape,
        )
        buf = aligned_on(buf, like.device)
        parts = self._parse_body(sec.views(buf[HEADER_NBYTES:]), shape, like.dtype)
        return Payload(buf, like.shape, like.dtype, parts)

    def max_nbytes(self, like: torch.Tensor) -> int:
        check_dtype(like, self.dtypes, self.spec)
        return HEADER_NBYTES + self.sections(tuple(like.shape), like.dtype).nbytes

    def fixed_nbytes(self, like: torch.Tensor) -> int | None:
        return self.max_nbytes(like)

    def body_nbytes(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Bytes of the body alone (what this compressor adds per tensor)."""
        return self.sections(tuple(shape), dtype).nbytes

    def clear_workspace(self) -> None:
        """Drop this thread's shared scratch memory (it is regrown on demand)."""
        self.ws.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


def _check_out(out: torch.Tensor, payload: Payload, name: str) -> None:
    if not isinstance(out, torch.Tensor):
        raise CompressionError(f"{name}: out must be a tensor, got {type(out).__name__}")
    n = numel_of(payload.shape)
    if out.numel() != n:
        raise CompressionError(
            f"{name}: out has {out.numel()} entries, the payload decodes to {n} "
            f"(shape {tuple(payload.shape)})"
        )
    if out.device != payload.buffer.device:
        raise CompressionError(
            f"{name}: out is on {out.device}, the payload on {payload.buffer.device}"
        )
