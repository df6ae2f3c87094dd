"""Composition of a sparsifier and a compressor of the kept values: ``SPARSIFIER+VALUES``.

``make("topk:0.1+qsgd:4:biased")`` keeps the k entries the sparsifier picks (top-k's largest
magnitudes, or rand-k's seeded coordinates) and compresses their k values with the second
compressor as a vector of length k; the receiver decodes the k values and puts them back at
their positions::

    C(x) = S*( Q(S(x)) )          S: x -> its k kept values,  S*: back to d entries (zeros elsewhere)

This is the "sparsify, then quantize" operator of SQuARM-SGD (docs/algorithms/squarm-sgd.md)
and Qsparse-local-SGD, but any method takes it, since it is a compressor like the others.

Wire: the sparsifier's position sections (top-k's int32 indices or bitmap, rand-k's seed), then
the value compressor's sections for a vector of k entries (names prefixed ``q.``); e.g.
``topk:0.1+qsgd:4`` sends ``⌈d/8⌉`` or ``4k`` bytes of positions, one scale and ``5k`` bits of
codes, against ``k·itemsize`` bytes of values for ``topk:0.1`` alone.

Constants (``E`` over the value compressor's draws; ``Sx`` and ``x − S*Sx`` have disjoint
supports, and ``Q(Sx)`` lies on ``Sx``'s, so the errors add):

* a contractive sparsifier (δ_S) and a contractive value compressor (δ_Q, on k entries):
  ``E‖C(x) − x‖² = ‖x − Sx‖² + E‖Q(Sx) − Sx‖² ≤ (1 − δ_S δ_Q)‖x‖²``: δ = δ_S δ_Q;
* both unbiased (``randk:R:unbiased+qsgd:B``): unbiased, ``1 + ω = (1 + ω_S)(1 + ω_Q)``;
* otherwise (a biased sparsifier with an unbiased quantizer, ``topk:R+qsgd:B``): neither
  bound holds as stated (``C/(1 + ω_Q)`` contracts with δ_S/(1 + ω_Q), but ``C`` itself
  need not), so δ and ω are None and methods that size a step from them fall back to their
  conservative default; write ``qsgd:B:biased`` to get the δ of the first case.

Written in the batch form (:mod:`gossip.compress.codec`) from the two compressors' own batch
forms, so a block of rows costs the two compressors' block costs; there is no fast kernel of
its own. Both parts must be stateless batch-form codecs; the first must be a sparsifier.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gossip.compress import rows as _rows
from gossip.compress.codec import Codec
from gossip.compress.sparse import _KSparse
from gossip.compress.wire import Sections, numel_of
from gossip.errors import CompressionError

PREFIX = "q."
"""Prefix of the value compressor's section names in a composed message."""


class Composed(Codec):
    """``SPARSIFIER+VALUES``: a sparsifier whose k kept values are sent by another compressor
    (module docstring for the math, the wire and the constants)."""

    kind: ClassVar[int] = 11
    param_name: ClassVar[str] = "the sparsifier's parameter"

    def __init__(self, spec: str, sparsifier: Codec, values: Codec) -> None:
        super().__init__(spec)
        if not isinstance(sparsifier, _KSparse):
            raise CompressionError(
                f"{spec}: the first part of a composition must be a sparsifier (topk or randk), "
                f"got {sparsifier.spec!r}; write e.g. 'topk:0.1+qsgd:4'")
        if not isinstance(values, Codec) or values._encode_batch is None or values.stateful:
            raise CompressionError(
                f"{spec}: the second part ({values.spec!r}) must be a stateless compressor of "
                "rows (none, fp16, bf16, sign, qsgd, lead, natural, ...), not one that keeps "
                "state or works per matrix (lowrank)")
        self.sparsifier, self.values = sparsifier, values
        self.randomized = sparsifier.randomized or values.randomized
        self.unbiased = sparsifier.unbiased and values.unbiased
        self.bounded_variance = sparsifier.bounded_variance and values.bounded_variance
        self.scale_sections = tuple(PREFIX + s for s in values.scale_sections)

    def k_for(self, d: int) -> int:
        """Entries kept for a tensor of ``d`` entries (the sparsifier's k)."""
        return self.sparsifier.k_for(d)

    def omega_for(self, numel: int) -> float | None:
        """``(1 + ω_S)(1 + ω_Q) − 1`` when both parts are unbiased, else None."""
        if not self.unbiased:
            return None
        ws, wq = self.sparsifier.omega_for(numel), self._inner(self.values.omega_for, 0.0, numel)
        return None if ws is None or wq is None else (1.0 + ws) * (1.0 + wq) - 1.0

    def delta_for(self, numel: int) -> float | None:
        """``δ_S δ_Q`` when both parts are contractive, else None."""
        if self.sparsifier.unbiased or (self.values.unbiased and not self.values.is_identity):
            return None
        ds, dq = self.sparsifier.delta_for(numel), self._inner(self.values.delta_for, 1.0, numel)
        return None if ds is None or dq is None else ds * dq

    def _inner(self, constant: Any, exact: float, numel: int) -> float | None:
        """The value compressor's constant on the k kept entries (``exact`` for ``none``)."""
        return exact if self.values.is_identity else constant(self.k_for(numel))

    def param_for(self, shape: tuple[int, ...]) -> int:
        return self.sparsifier.param_for(shape)

    # ----------------------------------------------------------------- the batch form
    def _split(self, d: int, dtype: torch.dtype) -> tuple[Sections, Sections]:
        """The sparsifier's sections for d entries and the value compressor's for k."""
        return self.sparsifier.sections((d,), dtype), self.values.sections((self.k_for(d),), dtype)

    def _sections(self, shape, dtype) -> Sections:
        d = numel_of(shape)
        outer, inner = self._split(d, dtype)
        kept = [(n, t, c) for n, t, c in zip(outer.names, outer.dtypes, outer.counts, strict=True)
                if n != "values"]
        return Sections.build(*kept, *((PREFIX + n, t, c) for n, t, c in
                                       zip(inner.names, inner.dtypes, inner.counts, strict=True)))

    def _parts(self, v: dict[str, torch.Tensor], vals: torch.Tensor
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The sparsifier's views (``values`` = ``vals``, [m, k]) and the value compressor's."""
        outer = {n: t for n, t in v.items() if not n.startswith(PREFIX)}
        outer["values"] = vals
        inner = {n[len(PREFIX):]: t for n, t in v.items() if n.startswith(PREFIX)}
        return outer, inner

    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        """The sparsifier picks and gathers the k values (its draws first), then the value
        compressor encodes them (its draws next, from the same stream)."""
        m, d = X.shape
        vals = _rows.scratch(self, "compose.values", (m, self.k_for(d)), X.dtype, X.device)
        outer, inner = self._parts(v, vals)
        self.sparsifier._encode_batch(X, rng, outer)
        self.values._encode_batch(vals, rng, inner)

    def _decode_batch(self, v: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        m, d = out.shape
        vals = _rows.scratch(self, "compose.decoded", (m, self.k_for(d)), out.dtype, out.device)
        outer, inner = self._parts(v, vals)
        self.values._decode_batch(inner, vals)
        self.sparsifier._decode_batch(outer, out)

    def _check_batch(self, v: dict[str, torch.Tensor], d: int) -> None:
        any_row = next(iter(v.values()))
        vals = torch.zeros((any_row.shape[0], self.k_for(d)), dtype=torch.float32)
        outer, inner = self._parts(v, vals)
        if self.sparsifier._check_batch is not None:
            self.sparsifier._check_batch(outer, d)
        if self.values._check_batch is not None:
            self.values._check_batch(inner, self.k_for(d))


def compose(spec: str, build: Any) -> Composed:
    """The compressor of ``"A+B"``: ``build(A)`` and ``build(B)`` (single compressors, built by
    the registry's ``build``), composed. Refuses more than two parts and empty ones."""
    parts = [p.strip() for p in spec.split("+")]
    if len(parts) != 2 or not all(parts):
        raise CompressionError(
            f"{spec!r}: a composition is SPARSIFIER+VALUES, two specs joined by one '+' "
            "(e.g. 'topk:0.1+qsgd:4:biased')")
    return Composed(spec, build(parts[0]), build(parts[1]))
