"""Unscaled signs: the ballots and the result of a majority vote (``vote``, ``vote:ties``)."""

from __future__ import annotations

from typing import ClassVar

import torch

from gossip.compress import bits
from gossip.compress import rows as _rows
from gossip.compress.checks import no_grad
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of
from gossip.errors import CompressionError


class Vote(Codec):
    """``C(x) = sgn(x)``, unscaled: signSGD's ballot (``vote``) and the sign of a tally
    that may tie (``vote:ties``).

    ``vote``: sgn(0) = +1 (−0.0 included), one bit per entry (set = negative):
    ``8 + ⌈d/8⌉`` bytes. ``vote:ties``: sgn(0) = 0, a second plane of ``⌈d/8⌉`` bytes marks
    the zeros (``8 + 2⌈d/8⌉`` bytes); no sender sets both bits of an entry, so a received
    message that does is refused.

    Deterministic and biased. Its error is not bounded relative to the input (a small ``x``
    comes back at ±1 and no fixed multiple of ``C`` contracts every ``x``), so
    ``bounded_variance`` is False and gossip methods that need a contraction refuse it. It is
    the message of the majority vote in the chunked all-reduce
    (:class:`gossip.algorithms.allreduce.ChunkedAllReduce`, Signum's): every node sends the
    ``vote`` of each chunk to the chunk's server, which averages the ballots and sends back
    their sign, with ``vote:ties`` when the number of ballots is even.

    Decoding is one lookup of a 256 × 8 table of ±1 per byte (times ``1 − tie`` per entry for
    ``vote:ties``); the NaN/Inf check is a sum of the input (one read pass).
    """

    splits: ClassVar[bool] = True
    ordered_rows: ClassVar[bool] = True
    fused_add: ClassVar[bool] = True
    bounded_variance: ClassVar[bool] = False
    kind: ClassVar[int] = 22
    param_name: ClassVar[str] = "zero plane flag"

    def __init__(self, spec: str, ties: bool = False) -> None:
        super().__init__(spec)
        self.ties = bool(ties)

    @property
    def param(self) -> int:
        return int(self.ties)

    def _sections(self, shape, dtype) -> Sections:
        nb = bits.nbytes_bits(numel_of(shape))
        if self.ties:
            return Sections.build(("signs", torch.uint8, nb), ("zeros", torch.uint8, nb))
        return Sections.build(("signs", torch.uint8, nb))

    # ------------------------------------------------------------ the batch form
    def _encode_batch(self, X, rng, v) -> None:
        """``X < 0`` (and ``X == 0``) packed per row."""
        _rows.pack_compare_rows(X, False, v["signs"], self.ws)
        if self.ties:
            _rows.pack_compare_rows(X, True, v["zeros"], self.ws)

    def _check_batch(self, v, d: int) -> None:
        if self.ties and bool(torch.bitwise_and(v["signs"], v["zeros"]).any()):
            raise CompressionError(f"{self.spec}: an entry is marked both negative and zero, "
                                   "which no sender produces (the message is corrupt)")

    def _decode_batch(self, v, out) -> None:
        """±1 from the table straight into ``out`` (when its rows are contiguous whole
        bytes), times ``1 − tie`` for ``vote:ties`` (exact)."""
        k, d = out.shape
        full = out if out.is_contiguous() and d % 8 == 0 else \
            _rows.scratch(self, "pm1", (k, 8 * v["signs"].shape[1]), out.dtype, out.device)
        self._pm1_votes(v, full)
        if full is not out:
            out.copy_(full[:, :d])

    # ------------------------------------------------------------ chunks of messages
    @no_grad
    def _fast_encode_split_rows(self, X, n, *, out=None):
        """Each chunk's ``X < 0`` (and ``X == 0``) packed into its own body (chunks of a
        multiple of 8 entries pack to the bytes of the whole row), the per-row sum as the check."""
        X = X.detach()
        res = self._split_out(X, n, out)
        m, d = X.shape
        if self.check_finite and not bool(torch.isfinite(X.sum(1)).all()):
            _rows.encode_error(self, X, ~torch.isfinite(X).all(1), "NaN/Inf")
        part = self.chunk_sections(X[0], n)
        chunks = _rows.chunk_rows(X, n)
        for at, nb, flags in zip(part.offsets, part.counts, (torch.lt, torch.eq), strict=False):
            _rows.pack_rows(flags(chunks, 0), d // n, res[:, :, at : at + nb].view(m * n, nb))
        return res

    def _fast_decode_add_bodies(self, out, bodies):
        """The decoded votes (a scratch of the chunk's size) added to ``out``."""
        v = self.body_views(bodies, out)
        k, d = out.shape
        pm1 = _rows.scratch(self, "pm1", (k, 8 * v["signs"].shape[1]), out.dtype, out.device)
        out.add_(self._pm1_votes(v, pm1)[:, :d])
        return out

    def _pm1_votes(self, views: dict[str, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """``out`` ([k, 8·nb], contiguous) = the votes of the sections ``views``: ±1, times
        ``1 − tie`` with a zero plane."""
        _rows.pm1_rows(views["signs"], out, self.ws)
        if self.ties:
            keep = _rows.scratch(self, "keep", tuple(out.shape), out.dtype, out.device)
            out.mul_(_rows.pm1_rows(views["zeros"], keep, self.ws).add_(1.0).mul_(0.5))
        return out

