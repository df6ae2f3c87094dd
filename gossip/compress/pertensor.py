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

import numpy as np
import torch

from gossip.compress import dispatch
from gossip.compress.base import Compressor, Payload
from gossip.compress.checks import check_dtype, check_generator, no_grad, quiet
from gossip.compress.codec import Codec, _check_out
from gossip.compress.wire import (
    HEADER_NBYTES,
    PER_TENSOR,
    Plan,
    align8,
    aligned_on,
    as_message,
    check_header,
    header_bytes,
    new_buffer,
    numel_of,
    write_header,
)
from gossip.errors import CompressionError
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
        self.is_identity = first.is_identity
        self.unbiased = first.unbiased
        self.bounded_variance = first.bounded_variance
        # omega_exact stays False: the tensors' ω differ (k is rounded per tensor), so
        # Σ_t ω_t ‖x_t‖² is only bounded by max ω · ‖x‖²
        self.randomized = first.randomized
        self.stateful = first.stateful
        omegas = [c.omega_for(n) for c, n in zip(self.inners, layout.sizes, strict=True)]
        deltas = [c.delta_for(n) for c, n in zip(self.inners, layout.sizes, strict=True)]
        self.omega = None if any(w is None for w in omegas) else max(omegas)
        self.delta = None if any(d is None for d in deltas) else min(deltas)
        self._plans: dict[torch.dtype, tuple[list[int], list[int], int]] = {}
        self._hosts: dict[torch.dtype, _HostPlan] = {}
        cls = type(first)
        self._host_encode = cls._encode_host is not None
        self._host_decode = cls._decode_host is not None
        self._host_parse = first._parse_mode != 2

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

    def _host_plan(self, flat: torch.Tensor) -> _HostPlan | None:
        """The numpy-path plan for CPU float32/float64 messages, else None."""
        if not dispatch.host_tensor(flat):
            return None
        hp = self._hosts.get(flat.dtype)
        if hp is None:
            hp = self._hosts[flat.dtype] = _HostPlan(self, flat.dtype)
        return hp

    # The numpy paths never build an autograd graph (as in Codec), the torch ones run under
    # no_grad.
    def encode(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> Payload:
        flat = self._flat(x, "the input")
        if self.randomized and generator is not None:
            check_generator(generator, flat, self.spec)
            # once: every tensor draws its own call from the stream (or the one generator)
            generator = self.inners[0]._randomness(generator, flat.device)
        hp = self._host_plan(flat) if self._host_encode else None
        if hp is None:
            return self._encode_torch(x, flat, generator, out)
        if self.randomized:
            check_generator(generator, flat, self.spec)
        if flat.requires_grad:
            flat = flat.detach()
        if not flat.is_contiguous():
            flat = flat.contiguous()
        if out is None:
            arr = hp.new_message()
            buf = torch.from_numpy(arr)
        else:
            buf = new_buffer(hp.nbytes, flat.device, out, self.spec)
            arr = buf.numpy()
            hp.write_header(arr)
        fn = flat.numpy()
        bodies = []
        for c, plan, xo, n, shift in hp.items:
            xs = fn[xo : xo + n]
            bodies.append(
                c._encode_host(plan, torch.from_numpy(xs), xs, generator, plan.host_views_at(arr, shift))
            )
        return Payload(buf, x.shape, x.dtype, None, {"bodies": bodies})

    @no_grad
    def _encode_torch(self, x, flat, generator, out) -> Payload:
        flat = flat.contiguous()
        offsets, sizes, total = self.plan(flat.dtype)
        buf = new_buffer(total, flat.device, out, self.spec)
        write_header(buf, self.kind, flat.dtype, self.inners[0].param, flat.numel())
        for a, b in _gaps(offsets, sizes):
            buf[a:b].zero_()
        bodies = [
            c.encode_into(view, generator, buf[o : o + n])
            for c, view, o, n in zip(
                self.inners, self.layout.views(flat), offsets, sizes, strict=True
            )
        ]
        return Payload(buf, x.shape, x.dtype, {"bodies": bodies})

    def _host_out(self, out: Any, payload: Payload) -> tuple[_HostPlan, np.ndarray] | None:
        if payload.host is None or not self._host_decode:
            return None
        hp = self._hosts.get(payload.dtype)
        on = self.inners[0]._host_out(out, payload)
        return None if hp is None or on is None else (hp, on)

    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty(payload.shape, dtype=payload.dtype, device=payload.buffer.device)
        got = self._host_out(out, payload)
        if got is None:
            return self._decode_torch(payload, out)
        hp, on = got
        for (c, _, xo, n, _), host in zip(hp.items, payload.host["bodies"], strict=True):
            c._decode_host(host, on[xo : xo + n])
        return out

    @no_grad
    def _decode_torch(self, payload: Payload, out: torch.Tensor) -> torch.Tensor:
        _check_out(out, payload, self.spec)
        if out.dtype != payload.dtype or not out.is_contiguous():
            return out.copy_(self.decode(payload).view(out.shape))
        views = self.layout.views(out.view(-1))
        for c, parts, view, shape in zip(
            self.inners, payload.parts["bodies"], views, self.layout.shapes, strict=True
        ):
            c._decode_body(parts, shape, payload.dtype, view)
        return out

    def decode_add_(self, out: torch.Tensor, payload: Payload, weight: float = 1.0) -> torch.Tensor:
        got = self._host_out(out, payload)
        if got is None:
            return self._decode_add_torch(out, payload, weight)
        hp, on = got
        w = float(weight)
        with quiet():  # out + w·values may overflow to Inf (caught as divergence), silently
            for (c, _, xo, n, _), host in zip(hp.items, payload.host["bodies"], strict=True):
                c._decode_add_host(host, on[xo : xo + n], w)
        return out

    @no_grad
    def _decode_add_torch(self, out: torch.Tensor, payload: Payload, weight: float) -> torch.Tensor:
        _check_out(out, payload, self.spec)
        if out.dtype != payload.dtype or not out.is_contiguous():
            return out.add_(self.decode(payload).view(out.shape), alpha=weight)
        views = self.layout.views(out.view(-1))
        for c, parts, view, shape in zip(
            self.inners, payload.parts["bodies"], views, self.layout.shapes, strict=True
        ):
            c._decode_add_body(parts, shape, payload.dtype, view, float(weight))
        return out

    def from_bytes(self, buf: torch.Tensor, like: torch.Tensor) -> Payload:
        buf = as_message(buf, self.spec)
        self._flat(like, "the receiving tensor")
        hp = self._host_plan(like) if self._host_parse and buf.is_cpu else None
        if hp is None:
            return self._from_bytes_torch(buf, like)
        bn = buf.numpy()
        if bn.size != hp.nbytes or bn[:HEADER_NBYTES].tobytes() != hp.header:
            self._check_header(buf, like, hp.nbytes)
            raise AssertionError("unreachable: the header check passed")  # pragma: no cover
        if buf.data_ptr() % 8 or not buf.is_contiguous():
            buf = buf.clone()
            bn = buf.numpy()
        bodies = []
        for c, plan, _, n, shift in hp.items:
            views = plan.host_views_at(bn, shift)
            c._check_received(views, n)
            bodies.append(c._parse_host(views, n) if c._parse_mode == 1 else views)
        return Payload(buf, like.shape, like.dtype, None, {"bodies": bodies})

    def _check_header(self, buf: torch.Tensor, like: torch.Tensor, nbytes: int) -> None:
        check_header(
            buf,
            name=f"{self.spec} (per tensor)",
            kind=self.kind,
            dtype=like.dtype,
            param=self.inners[0].param,
            param_name=self.inners[0].param_name,
            numel=like.numel(),
            nbytes=nbytes,
            shape=tuple(like.shape),
        )

    def _from_bytes_torch(self, buf: torch.Tensor, like: torch.Tensor) -> Payload:
        offsets, sizes, total = self.plan(like.dtype)
        self._check_header(buf, like, total)
        buf = aligned_on(buf, like.device)
        bodies: list[dict[str, Any]] = []
        for c, shape, o, n in zip(self.inners, self.layout.shapes, offsets, sizes, strict=True):
            views = c.sections(shape, like.dtype).views(buf[o : o + n])
            c._check_received(views, numel_of(shape))
            bodies.append(c._parse_body(views, shape, like.dtype))
        return Payload(buf, like.shape, like.dtype, {"bodies": bodies})

    def max_nbytes(self, like: torch.Tensor) -> int:
        self._flat(like, "the tensor")
        return self.plan(like.dtype)[2]

    def fixed_nbytes(self, like: torch.Tensor) -> int | None:
        return self.max_nbytes(like)

    def state_dict(self) -> dict[str, Any]:
        """The state of every per-tensor instance (empty for stateless compressors)."""
        if not self.stateful:
            return {"inners": []}
        return {"inners": [c.state_dict() for c in self.inners]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the layout must have as many tensors as when saved)."""
        saved = state["inners"]
        if not self.stateful:
            return
        if len(saved) != len(self.inners):
            raise CompressionError(
                f"{self.spec}: the checkpoint holds state for {len(saved)} tensors but the layout "
                f"has {len(self.inners)}; resume with the model the run was started with"
            )
        for c, st in zip(self.inners, saved, strict=True):
            c.load_state_dict(st)

    def clear_workspace(self) -> None:
        """Drop this thread's shared scratch memory (it is regrown on demand)."""
        self.inners[0].clear_workspace()

    def __repr__(self) -> str:
        return f"PerTensor({self.spec!r}, {self.layout!r})"


class _HostPlan:
    """A per-tensor message of one dtype on the numpy path: for each tensor its codec, body
    plan, offset in the flat input, size, and where its body sits relative to a standalone
    message's (``shift``)."""

    def __init__(self, pt: PerTensor, dtype: torch.dtype) -> None:
        offsets, _, total = pt.plan(dtype)
        cpu = torch.device("cpu")
        items = []
        for c, shape, xo, n, o in zip(
            pt.inners, pt.layout.shapes, pt.layout.offsets, pt.layout.sizes, offsets, strict=True
        ):
            plan = Plan(c.sections(shape, dtype), c.kind, dtype, c.param, n, cpu)
            items.append((c, plan, xo, n, o - HEADER_NBYTES))
        self.items = tuple(items)
        self.nbytes = total
        self.header = header_bytes(pt.kind, dtype, pt.inners[0].param, pt.layout.numel)
        self.header_np = np.frombuffer(self.header, dtype=np.uint8)

        self.gaps = _gaps(offsets, [p.sec.nbytes for _, p, _, _, _ in self.items])

    def write_header(self, arr: np.ndarray) -> None:
        """The header, and zeros in the alignment gaps between bodies."""
        arr[:HEADER_NBYTES] = self.header_np
        for a, b in self.gaps:
            arr[a:b] = 0

    def new_message(self) -> np.ndarray:
        arr = np.empty(self.nbytes, dtype=np.uint8)
        self.write_header(arr)
        return arr


def _gaps(offsets: list[int], sizes: list[int]) -> list[tuple[int, int]]:
    """The padding between consecutive bodies (zeroed: a message never carries stale memory,
    and equal inputs give equal bytes)."""
    return [(o + n, nxt) for o, n, nxt in zip(offsets, sizes, offsets[1:]) if o + n < nxt]
