"""Per-tensor application: one compressor applied to every tensor of a :class:`Layout`.

``make(spec, layout)`` builds this. The flat input (a node's model buffer) is split into the
layout's views; each view is compressed on its own (its own top-k, sign scale, norm, low-rank
factors, …) and the bodies are laid out after ONE 8-byte header, each starting at a multiple
of 8 bytes (so every typed section stays aligned)::

    [header: kind | 0x80, dtype, param, total numel][body 0][pad to 8][body 1][pad]…[body L−1]

Every body's size follows from the tensor's shape and dtype, so no lengths travel: the message
is ``8 + Σ_{l<L−1} align8(b_l) + b_{L−1}`` bytes, ``b_l`` the standalone body size of tensor l
(standalone size minus 8). Constants are the worst case over tensors: ω = max_l ω(d_l),
δ = min_l δ(d_l) (the errors of the tensors add up: E‖C(x)−x‖² = Σ_l E‖C_l(x_l)−x_l‖²).
Stateful compressors (low-rank) get one instance per tensor, so warm starts never mix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.compress.base import CompressionError, Compressor, Payload
from gossip.compress.checks import check_dtype
from gossip.compress.codec import Codec, _check_out
from gossip.compress.wire import (
    HEADER_NBYTES,
    PER_TENSOR,
    align8,
    aligned_on,
    as_message,
    check_header,
    new_buffer,
    write_header,
)
from gossip.layout import Layout


class PerTensor(Compressor):
    """``inner`` applied to each tensor of ``layout``; see the module docstring."""

    def __init__(self, factory: Callable[[], Codec], layout: Layout) -> None:
        first = factory()
        self.layout = layout
        self.inners: list[Codec] = [first] + [
            factory() if first.stateful else first for _ in range(len(layout) - 1)
        ]
        self.spec = first.spec
        self.kind = first.kind | PER_TENSOR
        self.unbiased = first.unbiased
        self.randomized = first.randomized
        self.stateful = first.stateful
        omegas = [c.omega_for(n) for c, n in zip(self.inners, layout.sizes, strict=True)]
        deltas = [c.delta_for(n) for c, n in zip(self.inners, layout.sizes, strict=True)]
        self.omega = None if any(w is None for w in omegas) else max(omegas)
        self.delta = None if any(d is None for d in deltas) else min(deltas)
        self._plans: dict[torch.dtype, tuple[list[int], list[int], int]] = {}

    @property
    def check_finite(self) -> bool:  # type: ignore[override]
        return self.inners[0].check_finite

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        for c in self.inners:
            c.check_finite = value

    def omega_for(self, numel: int) -> float | None:
        return self.omega

    def delta_for(self, numel: int) -> float | None:
        return self.delta

    def plan(self, dtype: torch.dtype) -> tuple[list[int], list[int], int]:
        """(body offsets, body sizes, total bytes) of a message of this dtype."""
        p = self._plans.get(dtype)
        if p is None:
            offsets, sizes, pos = [], [], HEADER_NBYTES
            for c, shape in zip(self.inners, self.layout.shapes, strict=True):
                n = c.body_nbytes(shape, dtype)
                pos = align8(pos)
                offsets.append(pos)
                sizes.append(n)
                pos += n
            p = (offsets, sizes, pos)
            self._plans[dtype] = p
        return p

    def _flat(self, x: torch.Tensor, what: str) -> torch.Tensor:
        check_dtype(x, self.inners[0].dtypes, self.spec)
        if x.numel() != self.layout.numel:
            raise CompressionError(
                f"{self.spec}: {what} has {x.numel()} entries but the layout holds "
                f"{self.layout.numel} ({len(self.layout)} tensors)"
            )
        return x.reshape(-1)

    @torch.no_grad()
    def encode(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> Payload:
        flat = self._flat(x, "the input").contiguous()
        offsets, sizes, total = self.plan(flat.dtype)
        buf = new_buffer(total, flat.device, out, self.spec)
        write_header(buf, self.kind, flat.dtype, self.inners[0].param, flat.numel())
        bodies = [
            c.encode_into(view, generator, buf[o : o + n])
            for c, view, o, n in zip(
                self.inners, self.layout.views(flat), offsets, sizes, strict=True
            )
        ]
        return Payload(buf, x.shape, x.dtype, {"bodies": bodies})

    @torch.no_grad()
    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty(payload.shape, dtype=payload.dtype, device=payload.buffer.device)
        _check_out(out, payload, self.spec)
        if out.dtype != payload.dtype or not out.is_contiguous():
            return out.copy_(self.decode(payload).view(out.shape))
        views = self.layout.views(out.view(-1))
        for c, parts, view, shape in zip(
            self.inners, payload.parts["bodies"], views, self.layout.shapes, strict=True
        ):
            c._decode_body(parts, shape, payload.dtype, view)
        return out

    @torch.no_grad()
    def decode_add_(self, out: torch.Tensor, payload: Payload, weight: float = 1.0) -> torch.Tensor:
        _check_out(out, payload, self.spec)
        if out.dtype != payload.dtype or not out.is_contiguous():
            return out.add_(self.decode(payload).view(out.shape), alpha=weight)
        views = self.layout.views(out.view(-1))
        for c, parts, view, shape in zip(
            self.inners, payload.parts["bodies"], views, self.layout.shapes, strict=True
        ):
            c._decode_add_body(parts, shape, payload.dtype, view, float(weight))
        return out

    @torch.no_grad()
    def from_bytes(self, buf: torch.Tensor, like: torch.Tensor) -> Payload:
        buf = as_message(buf, self.spec)
        self._flat(like, "the receiving tensor")
        offsets, sizes, total = self.plan(like.dtype)
        check_header(
            buf,
            name=f"{self.spec} (per tensor)",
            kind=self.kind,
            dtype=like.dtype,
            param=self.inners[0].param,
            param_name=self.inners[0].param_name,
            numel=like.numel(),
            nbytes=total,
            shape=tuple(like.shape),
        )
        buf = aligned_on(buf, like.device)
        bodies: list[dict[str, Any]] = []
        for c, shape, o, n in zip(self.inners, self.layout.shapes, offsets, sizes, strict=True):
            sec = c.sections(shape, like.dtype)
            bodies.append(c._parse_body(sec.views(buf[o : o + n]), shape, like.dtype))
        return Payload(buf, like.shape, like.dtype, {"bodies": bodies})

    def max_nbytes(self, like: torch.Tensor) -> int:
        self._flat(like, "the tensor")
        return self.plan(like.dtype)[2]

    def fixed_nbytes(self, like: torch.Tensor) -> int | None:
        return self.max_nbytes(like)

    def clear_workspace(self) -> None:
        """Drop this thread's shared scratch memory (it is regrown on demand)."""
        self.inners[0].clear_workspace()

    def __repr__(self) -> str:
        return f"PerTensor({self.spec!r}, {self.layout!r})"
