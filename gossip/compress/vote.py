"""Unscaled signs: the ballots and the result of a majority vote (``vote``, ``vote:ties``)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gossip.compress import bits
from gossip.compress import rows as _rows
from gossip.compress.checks import check_scalar, no_grad
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

    # ------------------------------------------------------------ one message
    def _encode_body(self, x, generator, v) -> dict[str, Any]:
        xf = x.view(-1)
        if self.check_finite:
            check_scalar(xf.sum(), xf, self.spec, "the sum", overflow_ok=True)
        bits.pack_negative(xf, v["signs"], self.ws)
        if self.ties:
            d = xf.numel()
            flags = self.ws.get("vote.flags", bits.padded(d), torch.bool, xf.device)
            torch.eq(xf, 0, out=flags[:d])
            flags[d:].zero_()
            bits.pack_flags(flags, d, v["zeros"], self.ws)
        return v

    def _parse_body(self, v, shape, dtype) -> dict[str, Any]:
        if self.ties and bool(torch.bitwise_and(v["signs"], v["zeros"]).any()):
            raise CompressionError(f"{self.spec}: an entry is marked both negative and zero, "
                                   "which no sender produces (the message is corrupt)")
        return v

    def _decode_body(self, parts, shape, dtype, out) -> None:
        of = out.view(-1)
        d = of.numel()
        full = _expand(parts["signs"], of.dtype, self.ws, "vote.signs")
        if self.ties:
            keep = _expand(parts["zeros"], of.dtype, self.ws, "vote.zeros")
            keep.add_(1.0).mul_(0.5)  # 1 − tie, exact
            full.mul_(keep)
        of.copy_(full[:d])

    # ----------------------------------------------------- blocks of nodes (rows)
    @no_grad
    def encode_rows(self, X, rng=None, *, out=None):
        """Vectorized: ``X < 0`` (and ``X == 0``) packed per row, a per-row sum as the check."""
        if not _rows.is_block(X):
            return super().encode_rows(X, rng, out=out)
        plan, X, block = _rows.start_encode(self, X, out)
        d = X.shape[1]
        if self.check_finite:
            s = X.sum(1)  # an overflow of finite values passes, as in encode
            if not bool(torch.isfinite(s).all()):
                _rows.encode_error(self, X, ~torch.isfinite(X).all(1), "NaN/Inf")
        _rows.pack_rows(X < 0, d, _rows.section(block, plan, "signs"))
        if self.ties:
            _rows.pack_rows(X == 0, d, _rows.section(block, plan, "zeros"))
        return block

    @no_grad
    def decode_add_rows_(self, out, block, weight=1.0, *, rows=None, check=True):
        """Vectorized: ±1 (times ``1 − tie``) per row from the planes, added as
        ``decode_add_`` adds it (``out + w·v``, one rounding; ``v`` is ±1 or 0, so exact)."""
        st = _rows.start_decode(self, out, block, weight, rows, check)
        if st is None:
            return super().decode_add_rows_(out, block, weight, rows=rows, check=check)
        plan, block, tgt, w, bad = st
        m, d = block.shape[0], out.shape[1]
        signs = _rows.section(block, plan, "signs")
        zeros = _rows.section(block, plan, "zeros") if self.ties else None
        if check:
            if zeros is not None:
                bad = bad | torch.bitwise_and(signs, zeros).ne(0).any(1)
            _rows.bad_row(self, out, block, tgt, bad, "bad row")
        vals = _expand(signs, out.dtype, self.ws, "vote.rows.signs").view(m, -1)
        if zeros is not None:
            keep = _expand(zeros, out.dtype, self.ws, "vote.rows.zeros").view(m, -1)
            vals.mul_(keep.add_(1.0).mul_(0.5))
        _rows.add_rows_(out, None if rows is None else tgt, vals[:, :d], w, fused=True)
        return out

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

    def _fast_decode_bodies(self, bodies, out):
        """±1 from the table straight into ``out`` (when its rows are contiguous whole
        bytes), times ``1 − tie`` for ``vote:ties`` (exact)."""
        v = self.body_views(bodies, out)
        k, d = out.shape
        full = out if out.is_contiguous() and d % 8 == 0 else \
            _rows.scratch(self, "pm1", (k, 8 * v["signs"].shape[1]), out.dtype, out.device)
        self._pm1_votes(v, full)
        if full is not out:
            out.copy_(full[:, :d])
        return out

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


def _expand(packed: torch.Tensor, dtype: torch.dtype, ws: Any, tag: str) -> torch.Tensor:
    """±1 (set bit -> −1) for every bit of ``packed`` ([k] or [m, k] uint8): a flat
    ``8·packed.numel()`` workspace tensor (rows of ``8k`` entries), one table row per byte."""
    n = packed.numel()
    dev = packed.device
    out = ws.get(tag, 8 * n, dtype, dev)
    idx = ws.get(tag + ".idx", n, torch.int32, dev)
    bits.rows(packed.reshape(-1), bits.pm1_table(dtype, dev), idx, out.view(n, 8))
    return out
