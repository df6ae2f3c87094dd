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

CPU tensors (float32/float64, ``bits.USE_NUMPY``) take a numpy fast path when the compressor
defines the twin hooks ``_encode_host`` / ``_parse_host`` / ``_decode_host`` /
``_decode_add_host``: they work on numpy views of the message and of ``out``, where a numpy
call costs well under a µs against a few µs per torch op, which is what dominates small
tensors (d ~ 10³–10⁵). The twins give the same bytes and decoded values as the torch hooks
(``tests/compress/test_compress_host.py`` runs both); reductions whose value travels (sign's ‖x‖₁,
QSGD's ‖x‖₂) and random draws stay torch calls on both paths, since numpy sums in another
order. Everything that depends only on (shape, dtype, device) is computed once
(:class:`.wire.Plan`: sections, header bytes, a zeroed message template), and ``no_grad`` is
entered only on the torch path and only when grad mode is on. Payloads of the numpy path keep
their sections as numpy views (``Payload.host``); ``Payload.parts`` turns them into torch views
on first access.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch

from gossip.compress import bits
from gossip.compress.base import Compressor, Payload, _row_block
from gossip.compress.checks import (
    FLOAT_DTYPES,
    Workspace,
    all_finite,
    check_dtype,
    check_generator,
    no_grad,
    quiet,
    shared_workspace,
)
from gossip.compress.wire import (
    HEADER_NBYTES,
    Plan,
    Sections,
    aligned_on,
    as_message,
    check_header,
    new_buffer,
    numel_of,
)
from gossip.errors import CompressionError
from gossip.rng import as_generator, as_stream


def _bump_public(tensors: tuple[torch.Tensor, ...]) -> None:
    torch.autograd.graph.increment_version(tensors)


_bump = getattr(torch._C, "_increment_version", _bump_public)


class Codec(Compressor):
    """Base of the concrete compressors; see the module docstring for the hooks."""

    kind: ClassVar[int] = 0
    param_name: ClassVar[str] = "parameter"
    dtypes: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES

    #: ``_encode_body`` draws from a :class:`gossip.rng.Stream` (the built-in randomized
    #: compressors); False (a user's codec written against ``torch.Generator``): a Stream the
    #: caller passes is turned into a generator seeded from its next draw
    uses_stream: ClassVar[bool] = False

    #: sections holding a scale (a norm or a step): a received negative one is refused
    scale_sections: ClassVar[tuple[str, ...]] = ()

    # numpy fast path for CPU tensors (``bits.USE_NUMPY``); None = the torch hooks serve them.
    # Each works on numpy views of the message (``Plan.host_views``; the section arrays) and
    # must give the same bytes / decoded values as its torch twin.
    #: ``(plan, x, xn, generator, views) -> host parts``: ``x`` contiguous, ``xn`` its flat
    #: numpy view
    _encode_host: ClassVar[Any] = None
    #: ``(views, numel) -> host parts``, raising :class:`CompressionError` like ``_parse_body``
    _parse_host: ClassVar[Any] = None
    #: ``(host parts, out) -> None`` with ``out`` a flat numpy array of the payload's dtype
    _decode_host: ClassVar[Any] = None
    #: ``(host parts, out, weight) -> None``: ``out += weight * decode``
    _decode_add_host: ClassVar[Any] = None

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.check_finite = True
        self._plans: dict[tuple[tuple[int, ...], torch.dtype], Sections] = {}
        self._pl: dict[tuple[Any, ...], Plan] = {}
        cls = type(self)
        # how the numpy path validates a body: 0 nothing to check, 1 _parse_host, 2 torch
        self._parse_mode = (
            1 if cls._parse_host is not None else 2 if cls._parse_body is not Codec._parse_body else 0
        )

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

    @abstractmethod
    def _sections(self, shape: tuple[int, ...], dtype: torch.dtype) -> Sections:
        ...

    @abstractmethod
    def _encode_body(
        self, x: torch.Tensor, generator: torch.Generator | None, v: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        ...

    def _parse_body(
        self, v: dict[str, torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype
    ) -> dict[str, Any]:
        return v

    @abstractmethod
    def _decode_body(
        self, parts: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype, out: torch.Tensor
    ) -> None:
        ...

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

    def plan(self, x: torch.Tensor) -> Plan:
        """The message plan for tensors like ``x`` (cached per shape, dtype and device).

        Checks dtype and emptiness the first time; a cached plan means they passed.
        """
        try:
            return self._pl[(x.shape, x.dtype, x.device)]
        except (KeyError, AttributeError, TypeError):
            pass
        check_dtype(x, self.dtypes, self.spec)
        shape = tuple(x.shape)
        sec = self.sections(shape, x.dtype)
        p = Plan(sec, self.kind, x.dtype, self.param_for(shape), x.numel(), x.device)
        self._pl[(x.shape, x.dtype, x.device)] = p
        return p

    def check_input(self, x: torch.Tensor, generator: torch.Generator | None) -> None:
        """Dtype, emptiness and (for randomized compressors) the generator."""
        check_dtype(x, self.dtypes, self.spec)
        if self.randomized and self._needs_generator(x):
            check_generator(generator, x, self.spec)

    def _needs_generator(self, x: torch.Tensor) -> bool:
        return True

    def _randomness(self, generator: Any, device) -> Any:
        """What ``_encode_body`` draws from: a Stream (``uses_stream``) or a torch.Generator."""
        return as_stream(generator) if self.uses_stream else as_generator(generator, device)

    def encode_into(
        self, x: torch.Tensor, generator: torch.Generator | None, body: torch.Tensor
    ) -> dict[str, Any]:
        """Encode ``x`` into a body slice (no header); returns the parts."""
        self.check_input(x, generator)
        if self.randomized:
            generator = self._randomness(generator, x.device)
        sec = self.sections(tuple(x.shape), x.dtype)
        return self._encode_body(x.detach().contiguous(), generator, sec.views(body))

    # ------------------------------------------------------------ interface
    # The numpy paths never build an autograd graph (x is detached, ``out`` never requires
    # grad there), so only the torch paths run under no_grad.
    def encode(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> Payload:
        plan = self.plan(x)
        if self.randomized:
            if self._needs_generator(x):
                check_generator(generator, x, self.spec)
            generator = self._randomness(generator, x.device)
        if x.requires_grad:
            x = x.detach()
        if not x.is_contiguous():
            x = x.contiguous()
        if plan.host and self._encode_host is not None and bits.USE_NUMPY:
            if out is None:
                arr = plan.new_message()
                buf = torch.from_numpy(arr)
            else:
                buf = new_buffer(plan.nbytes, x.device, out, self.spec)
                arr = buf.numpy()
                arr[:HEADER_NBYTES] = plan.header_np
            xn = x.numpy()
            if xn.ndim != 1:
                xn = xn.reshape(-1)
            parts = self._encode_host(plan, x, xn, generator, plan.host_views(arr))
            return Payload(buf, x.shape, x.dtype, None, parts)
        return self._encode_torch(plan, x, generator, out)

    @no_grad
    def _encode_torch(
        self, plan: Plan, x: torch.Tensor, generator: torch.Generator | None, out
    ) -> Payload:
        host = plan.cpu and bits.USE_NUMPY  # numpy only to lay out the buffer
        if host and out is None:
            buf = torch.from_numpy(plan.new_message())
        else:
            buf = new_buffer(plan.nbytes, x.device, out, self.spec)
            if host:
                buf.numpy()[:HEADER_NBYTES] = plan.header_np
            else:
                plan.write_header(buf)
        parts = self._encode_body(x, generator, plan.torch_views(buf, host))
        return Payload(buf, x.shape, x.dtype, parts)

    # ------------------------------------------------------------ blocks of nodes
    #: the batched draw of a randomized compressor's ``encode_rows`` (None: the default loop):
    #: ``(rng, X) -> [PreDrawn per row]``, exactly one draw call of ``rng`` for the block
    _draw_rows: ClassVar[Any] = None

    def encode_rows(self, X: torch.Tensor, rng: Any = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """The block version (contract in :meth:`Compressor.encode_rows`): the random draw of
        every row is one batched call of ``rng`` (one hash pass over the block); each row is
        then encoded by the single-tensor code path into its row of the block, so row r's
        bytes are exactly those of ``encode(X[r], rng.row(r))``."""
        if (self._draw_rows is None or not self.uses_stream or self.stateful or X.dim() < 2
                or X.shape[0] == 0):
            return super().encode_rows(X, rng, out=out)
        m = X.shape[0]
        like = X[0]
        plan = self.plan(like)
        check_generator(rng, like, self.spec)
        rng = as_stream(rng)
        if X.requires_grad:
            X = X.detach()
        if not X.is_contiguous():
            X = X.contiguous()
        block = _row_block(out, m, plan.nbytes, X.device)
        draws = self._draw_rows(rng, X)
        for r in range(m):
            try:
                self.encode(X[r], draws[r], out=block[r])
            except CompressionError as exc:
                exc.row = r
                raise
        return block

    def _host_out(self, out: Any, payload: Payload) -> np.ndarray | None:
        """``out`` as a flat numpy array when the numpy decoders can write it, else None."""
        if (
            isinstance(out, torch.Tensor)
            and out.dtype == payload.dtype
            and out.is_cpu
            and not out.requires_grad
            and out.is_contiguous()
            and out.numel() == numel_of(payload.shape)
        ):
            _bump((out,))  # what an in-place torch op does (autograd's staleness checks)
            on = out.numpy()
            return on if on.ndim == 1 else on.reshape(-1)
        return None

    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        if payload.host is not None and self._decode_host is not None:
            if out is None:
                res = torch.empty(payload.shape, dtype=payload.dtype)
                self._decode_host(payload.host, res.numpy().reshape(-1))
                return res
            on = self._host_out(out, payload)
            if on is not None:
                self._decode_host(payload.host, on)
                return out
        return self._decode_torch(payload, out)

    @no_grad
    def _decode_torch(self, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
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

    def decode_add_(self, out: torch.Tensor, payload: Payload, weight: float = 1.0) -> torch.Tensor:
        if payload.host is not None and self._decode_add_host is not None:
            on = self._host_out(out, payload)
            if on is not None:
                with quiet():  # out + w·values may overflow to Inf (caught as divergence), silently
                    self._decode_add_host(payload.host, on, float(weight))
                return out
        return self._decode_add_torch(out, payload, weight)

    @no_grad
    def _decode_add_torch(self, out: torch.Tensor, payload: Payload, weight: float) -> torch.Tensor:
        shape, dtype = tuple(payload.shape), payload.dtype
        _check_out(out, payload, self.spec)
        if out.dtype == dtype and out.is_contiguous():
            self._decode_add_body(payload.parts, shape, dtype, out.view(shape), float(weight))
        else:
            out.add_(self.decode(payload).view(out.shape), alpha=weight)
        return out

    def from_bytes(self, buf: torch.Tensor, like: torch.Tensor) -> Payload:
        """Rebuild a payload for a tensor shaped like ``like`` (its values are not read).

        Checks header and exact length before any allocation, then the body (index ranges,
        bit widths, …). One host sync on CUDA for the header, plus one per body check.
        (No autograd: a uint8 buffer never requires grad.)
        """
        buf = as_message(buf, self.spec)
        plan = self.plan(like)
        if plan.cpu and buf.is_cpu and bits.USE_NUMPY:
            bn = buf.numpy()
            if bn.size != plan.nbytes or bn[:HEADER_NBYTES].tobytes() != plan.header:
                self._check_header(buf, like, plan)
                raise AssertionError("unreachable: the header check passed")  # pragma: no cover
            if buf.data_ptr() % 8 or not buf.is_contiguous():
                buf = buf.clone()
                bn = buf.numpy()
            views = plan.host_views(bn)
            self._check_received(views, plan.numel)
            mode = self._parse_mode
            if mode == 1:
                return Payload(buf, like.shape, like.dtype, None, self._parse_host(views, plan.numel))
            if mode == 2 or not plan.host:
                parts = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in views.items()}
                if mode == 2:
                    parts = self._parse_body(parts, tuple(like.shape), like.dtype)
                return Payload(buf, like.shape, like.dtype, parts)
            return Payload(buf, like.shape, like.dtype, None, views)
        self._check_header(buf, like, plan)
        buf = aligned_on(buf, like.device)
        views = plan.torch_views(buf, False)
        self._check_received(views, plan.numel)
        parts = self._parse_body(views, tuple(like.shape), like.dtype)
        return Payload(buf, like.shape, like.dtype, parts)

    def _check_received(self, views: dict[str, Any], numel: int) -> None:
        """Refuse values no sender produces: NaN/Inf in a floating section, a negative scale.

        ``views`` are the message's sections (numpy arrays, or torch tensors for bfloat16 and
        for device messages). Subclasses add their own checks (codes out of range). A receiver
        whose ``check_finite`` is off skips these value checks, as it skips them on its input.
        """
        if not self.check_finite:
            return
        for name, v in views.items():
            t = torch.from_numpy(v) if isinstance(v, np.ndarray) else v
            if not t.is_floating_point():
                continue
            finite = all_finite(v, t) if isinstance(v, np.ndarray) else bool(torch.isfinite(t).all())
            if not finite:
                raise CompressionError(
                    f"{self.spec}: the message's {name} contain NaN/Inf, which no healthy sender "
                    "produces (the sender diverged, or the message is corrupt)"
                )
            if name in self.scale_sections and bool((t < 0).any()):
                raise CompressionError(
                    f"{self.spec}: the message's {name} is negative ({float(t.min()):.3g}); a "
                    "scale never is (the message is corrupt)"
                )

    def _check_header(self, buf: torch.Tensor, like: torch.Tensor, plan: Plan) -> None:
        shape = tuple(like.shape)
        check_header(
            buf,
            name=self.spec,
            kind=self.kind,
            dtype=like.dtype,
            param=plan.param,
            param_name=self.param_name,
            numel=plan.numel,
            nbytes=plan.nbytes,
            shape=shape,
        )

    def max_nbytes(self, like: torch.Tensor) -> int:
        return self.plan(like).nbytes

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
