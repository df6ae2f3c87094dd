"""PowerSGD-style low-rank compression with a warm-started power step."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gossip.compress.checks import check_scalar, nonfinite
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of
from gossip.errors import CompressionError

EPS = 1e-8  # Gram–Schmidt's guard, as in PowerSGD / PowerGossip
COLLAPSE = 1e-12  # a warm-start factor this small is redrawn (docs/compressors.md, low-rank)


def orthonormalize_rows_(a: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Gram–Schmidt on the rows of ``a`` (r × m) in place: ``row_i /= max(‖row_i‖, eps)``,
    then remove its projection from the later rows. Returns the norms before normalizing (r,).

    Rows rather than columns: we keep P̂ transposed, so each vector is contiguous. The guard
    is ``max(‖·‖, eps)`` rather than PowerSGD's ``‖·‖ + eps``: rows are then exactly unit
    vectors, so ``P̂ Qᵀ`` reproduces a rank-r matrix to rounding (``+ eps`` leaves a relative
    error of eps/‖row‖ that grows as the compressed differences shrink).
    """
    r = a.shape[0]
    norms = []
    for i in range(r):
        row = a[i]
        n = torch.linalg.vector_norm(row)
        norms.append(n)
        row.div_(torch.clamp_min(n, eps))
        if i + 1 < r:
            rest = a[i + 1 :]
            rest.addr_(torch.mv(rest, row), row, alpha=-1.0)
    return torch.stack(norms)


class LowRank(Codec):
    """Rank-r approximation from one warm-started power step (PowerSGD, Vogels et al. 2019).

    A tensor with ndim > 1 is viewed as ``M = T.reshape(T.shape[0], -1)`` (m × k) and
    r ← min(r, m, k). With the instance's warm-start factor Q (k × r, first drawn N(0, 1) from
    the caller's stream (:meth:`gossip.rng.Stream.normal`), one per shape)::

        P = M Q;   P̂ = orth(P) (Gram–Schmidt, guard 1e-8);   Q ← Mᵀ P̂;   send (P̂, Q)
        decode: P̂ Qᵀ  (= P̂ P̂ᵀ M, the projection of M on span P̂)

    Q is kept for the next call (warm start: successive calls run power iteration on a slowly
    changing M), so one instance serves one stream of messages. After a zero M (or Q ⟂ M) the
    factor collapses to 0; it is then redrawn on the next call. A matrix of rank ≤ r is
    reproduced exactly (to rounding) from the first call on.

    Biased, deterministic after the draw; no useful worst-case constant: one step gives only
    ‖C(M) − M‖ ≤ ‖M‖ (a projection), the exact rank-r SVD would give δ = r/min(m, k), so
    ``delta`` is None. Tensors with ndim ≤ 1 are sent as they are (exact).
    Wire: P̂ᵀ (r × m) then Qᵀ (r × k) in the input dtype: ``8 + itemsize·r·(m + k)`` bytes
    (32·r·(m+k) bits per float32 matrix); a 1-D tensor ``8 + itemsize·d``.

    Kernels: factors are stored transposed so both products are row-major GEMMs on M's own
    layout: P̂ᵀ = Qᵀ Mᵀ (the ``(Qᵀ Mᵀ)ᵀ`` form) and Qᵀ ← P̂ᵀ M; decoding is one ``addmm``.
    The NaN/Inf check reads the norms Gram–Schmidt computes (NaN/Inf in M reaches every row of
    P̂ᵀ); together with the collapse test it is one host sync on CUDA.
    """

    kind: ClassVar[int] = 10
    randomized: ClassVar[bool] = True  # the first Q of each shape comes from the generator
    uses_stream: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    bounded_variance: ClassVar[bool] = False  # the factor may collapse: C(M) = 0
    param_name: ClassVar[str] = "rank (capped at 255)"

    def __init__(self, spec: str, rank: int) -> None:
        super().__init__(spec)
        self.rank = int(rank)
        self._q: dict[tuple[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] = {}

    @property
    def param(self) -> int:
        return min(self.rank, 255)

    def dims(self, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
        """(m, k, r) for a matrix-shaped tensor, None for one sent raw."""
        if len(shape) <= 1:
            return None
        m = shape[0]
        k = numel_of(shape) // m
        return m, k, min(self.rank, m, k)

    def _sections(self, shape, dtype) -> Sections:
        mkr = self.dims(shape)
        if mkr is None:
            return Sections.build(("values", dtype, numel_of(shape)))
        m, k, r = mkr
        return Sections.build(("p", dtype, r * m), ("q", dtype, r * k))

    def _needs_generator(self, x: torch.Tensor) -> bool:
        return self.dims(tuple(x.shape)) is not None and self._key(x) not in self._q

    def _key(self, x: torch.Tensor):
        return (tuple(x.shape), x.dtype, x.device)

    def _encode_body(self, x, generator, v) -> dict[str, Any]:
        mkr = self.dims(tuple(x.shape))
        if mkr is None:
            v["values"].copy_(x.view(-1))
            if self.check_finite:
                check_scalar(v["values"].sum(), x, self.spec, "the sum", overflow_ok=True)
            return v
        m, k, r = mkr
        mat = x.reshape(m, k)
        key = self._key(x)
        qt = self._q.get(key)
        if qt is None:
            if generator is None:
                raise CompressionError(
                    f"{self.spec}: the warm-start factor of shape {tuple(x.shape)} must be "
                    "(re)drawn: pass the node's gossip.rng.Stream (or a torch.Generator) to encode()"
                )
            # one draw of r·k standard normals (counter-based: the same on every device)
            qt = generator.normal(r * k, dtype=x.dtype, device=x.device)[0].view(r, k)
        pt = v["p"].view(r, m)
        torch.mm(qt, mat.t(), out=pt)  # P̂ᵀ before orth = Qᵀ Mᵀ
        norms = orthonormalize_rows_(pt)
        qn = v["q"].view(r, k)
        torch.mm(pt, mat, out=qn)  # Qᵀ = P̂ᵀ M
        stats = torch.stack((norms.sum(), torch.linalg.vector_norm(qn))).tolist()  # host sync
        if self.check_finite and not all(abs(s) < float("inf") for s in stats):
            raise nonfinite(self.spec)
        if stats[1] < COLLAPSE:
            self._q.pop(key, None)  # redraw next call
        else:
            state = self._q.get(key)
            if state is None:
                self._q[key] = qn.clone()
            else:
                state.copy_(qn)
        return v

    def _decode_body(self, parts, shape, dtype, out) -> None:
        mkr = self.dims(shape)
        if mkr is None:
            out.view(-1).copy_(parts["values"])
            return
        m, k, r = mkr
        torch.mm(parts["p"].view(r, m).t(), parts["q"].view(r, k), out=out.view(m, k))

    def _decode_add_body(self, parts, shape, dtype, out, weight) -> None:
        mkr = self.dims(shape)
        if mkr is None:
            out.view(-1).add_(parts["values"], alpha=weight)
            return
        m, k, r = mkr
        out.view(m, k).addmm_(parts["p"].view(r, m).t(), parts["q"].view(r, k), alpha=weight)

    # ---------------------------------------------------------------- state
    def reset(self) -> None:
        """Forget every warm-start factor (the next call redraws them)."""
        self._q.clear()

    def state_dict(self) -> dict[str, Any]:
        """Warm-start factors with the shape, dtype and device they serve (for checkpoints)."""
        return {
            "q": [
                (list(shape), str(dtype), str(device), q.detach().cpu())
                for (shape, dtype, device), q in self._q.items()
            ]
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device | str | None = None) -> None:
        """Restore :meth:`state_dict`; ``device`` moves every factor there (default: where it was)."""
        self._q.clear()
        for entry in state["q"]:
            shape, dtype, q = entry[0], entry[1], entry[-1]
            saved_device = entry[2] if len(entry) == 4 else "cpu"  # 3 entries: saved before devices
            dev = torch.device(device if device is not None else saved_device)
            if dev.type == "cuda" and dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
            dt = getattr(torch, dtype.replace("torch.", ""))
            self._q[(tuple(shape), dt, dev)] = q.to(device=dev, dtype=dt).clone()
