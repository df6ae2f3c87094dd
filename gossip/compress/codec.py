"""``Codec``: the shared skeleton of every compressor here (header, sizes, validation, out=).

A compressor describes its message body and never touches the header. ``_sections(shape,
dtype)`` gives the typed sections of the body (sizes depend only on shape, dtype and the spec;
raise :class:`CompressionError` for shapes it cannot compress). The body is written in **the
batch form**: ``_encode_batch(X, rng, views)`` fills the sections of every row of ``X``
([m, d], one message per row, rows contiguous; ``views[name]`` is that section of every row,
[m, count]), ``_decode_batch(views, out)`` writes the decoded rows into ``out`` ([m, d], rows
possibly strided) and the optional ``_check_batch(views, d)`` raises :class:`CompressionError`
on a received body no sender writes (``d``: a row's length). A single tensor is a batch of one row (``_encode_body``,
``_parse_body``, ``_decode_body`` and ``_decode_add_body`` here serve it so), so the same code
serves one node per process and thousands of nodes in one process, and a block of nodes costs
a few tensor ops, not a loop over rows. Randomized ones draw from ``rng``, a
:class:`gossip.rng.Stream` over the rows, whose row r is row r's own stream (the same bytes
whatever the batch). Two declarations refine it: ``fused_add`` (how a decode-add rounds
``out + w·C(x)``) and ``checks_finite`` (``_encode_batch`` refuses NaN/Inf rows itself, through
:meth:`Codec._refuse_encode`, sparing the base class's summing pass).

A class may instead override those four single-tensor hooks on one tensor of its own shape
(**the per-tensor form**): low-rank does, whose message is a function of the tensor's matrix
shape (``shape[0]`` × the rest), which flat rows do not carry, and whose warm-start state is
kept per shape (a stateful compressor encodes one node at a time anyway); blocks then loop over
rows.

The batch form is the compressor's **reference**. Fast kernels are optional and registered per
compressor as hooks: the numpy twins ``_encode_host`` / ``_parse_host`` / ``_decode_host`` /
``_decode_add_host`` (CPU float32/float64 messages, where a numpy call costs well under a µs
against a few µs per torch op: what dominates d ~ 10³–10⁵), ``_fast_encode_rows`` /
``_fast_decode_add_rows`` for blocks and the chunk kernels ``_fast_encode_split_rows`` /
``_fast_decode_bodies`` / ``_fast_decode_add_bodies``. Each gives the bytes of the reference
and its decoded values up to the rounding of the weighted add;
``tests/compress/test_kernels.py`` checks every registered compressor against its reference,
which :func:`gossip.compress.dispatch.reference_kernels` selects; which path serves a call is
decided in :mod:`gossip.compress.dispatch`.
Reductions whose value travels (sign's ‖x‖₁, QSGD's ‖x‖₂) and random draws are torch calls on
every path, since numpy sums in another order.

Everything that depends only on (shape, dtype, device) is computed once (:class:`.wire.Plan`:
sections, header bytes, a zeroed message template), and ``no_grad`` is entered only on the
torch path and only when grad mode is on. Payloads of the numpy path keep their sections as
numpy views (``Payload.host``); ``Payload.parts`` turns them into torch views on first access.
The same hooks serve the per-tensor wrapper (:mod:`gossip.compress.pertensor`), which lays the
bodies of several tensors after one header.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch

from gossip.compress import dispatch
from gossip.compress import rows as _rows
from gossip.compress.base import Compressor, Payload, _row_block
from gossip.compress.checks import (
    FAST_DTYPES,
    FLOAT_DTYPES,
    Workspace,
    all_finite,
    check_dtype,
    check_generator,
    check_scalar,
    no_grad,
    nonfinite,
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
from gossip.errors import CompressionError, ContractError
from gossip.rng import as_generator, as_stream


def _bump_public(tensors: tuple[torch.Tensor, ...]) -> None:
    torch.autograd.graph.increment_version(tensors)


_bump = getattr(torch._C, "_increment_version", _bump_public)

def _as_rows(views: dict[str, Any]) -> dict[str, Any]:
    """A single message's sections as a batch of one row ([1, count] views)."""
    return {k: v.view(1, -1) if isinstance(v, torch.Tensor) else v for k, v in views.items()}


def _finite_rows(X: torch.Tensor) -> torch.Tensor:
    """[m] bool: whether row r of ``X`` is all finite (one summing pass; rows whose sum
    overflows are looked at entry by entry)."""
    fin = torch.isfinite(X.sum(1))
    if not bool(fin.all()):
        look = (~fin).nonzero().view(-1)
        fin = fin.clone()
        fin[look] = torch.isfinite(X.index_select(0, look)).all(1)
    return fin


class Codec(Compressor):
    """Base of the concrete compressors; see the module docstring for the hooks."""

    kind: ClassVar[int] = 0
    param_name: ClassVar[str] = "parameter"
    dtypes: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES
    #: the dtypes ``_fast_encode_rows`` / ``_fast_decode_add_rows`` serve (others: the reference)
    fast_dtypes: ClassVar[tuple[torch.dtype, ...]] = FAST_DTYPES

    #: ``_encode_body`` draws from a :class:`gossip.rng.Stream` (the built-in randomized
    #: compressors); False (a user's codec written against ``torch.Generator``): a Stream the
    #: caller passes is turned into a generator seeded from its next draw
    uses_stream: ClassVar[bool] = False

    #: sections holding a scale (a norm or a step): a received negative one is refused
    scale_sections: ClassVar[tuple[str, ...]] = ()

    # numpy fast path for CPU tensors (``dispatch.NUMPY``); None = the torch hooks serve them.
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

    # the batch form (see the module docstring); None: the class writes the per-tensor form
    #: ``(X, rng, views) -> None``: fill ``views[name]`` ([m, count]) from ``X`` ([m, d])
    _encode_batch: ClassVar[Any] = None
    #: ``(views, out) -> None``: write the decoded rows into ``out`` ([m, d])
    _decode_batch: ClassVar[Any] = None
    #: ``(views, d) -> None``, optional: raise :class:`CompressionError` on a body no sender
    #: writes (``d``: the entries of a row, which some bodies do not say: index ranges, padding)
    _check_batch: ClassVar[Any] = None
    #: ``(views, out, weight) -> None``, optional: ``out += weight·C`` for a single message
    #: ([1, d] rows) in one pass, rounded as :attr:`fused_add` says (else: decoded into
    #: scratch, then added)
    _decode_add_batch: ClassVar[Any] = None

    #: how the batch form's decode-add rounds ``out + w·C(x)``: False rounds ``w·C(x)`` first,
    #: then adds (row after row, as ``index_add_`` does); True rounds once, as torch's
    #: ``out.add_(C(x), alpha=w)`` does (the dense, sign and vote messages, whose torch paths
    #: always added so)
    fused_add: ClassVar[bool] = False
    #: ``_encode_batch`` refuses NaN/Inf rows itself (a reduction it computes anyway sees them:
    #: sign's norm, a cast's range), through :meth:`_refuse_encode`; False: the base class
    #: checks every row with one summing pass before calling it
    checks_finite: ClassVar[bool] = False

    # fast block kernels (optional): the contracts of ``encode_rows`` / ``decode_add_rows_``;
    # they fall back to ``_encode_rows_ref`` / ``_decode_add_rows_ref`` for what they do not serve
    _fast_encode_rows: ClassVar[Any] = None
    _fast_decode_add_rows: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        batch = cls._encode_batch is not None
        if batch != (cls._decode_batch is not None):
            raise ContractError(f"{cls.__name__} defines only one of _encode_batch and "
                                "_decode_batch: the batch form needs both")
        if batch:
            cls.uses_stream = True  # rng is a Stream over the batch's rows
            cls.ordered_rows = cls._fast_decode_add_rows is None or cls.ordered_rows

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.check_finite = True
        self._plans: dict[tuple[tuple[int, ...], torch.dtype], Sections] = {}
        self._pl: dict[tuple[Any, ...], Plan] = {}
        self._chunk_plans: dict[tuple[Any, ...], Sections] = {}
        cls = type(self)
        # how the numpy path validates a body: 0 nothing to check, 1 _parse_host, 2 torch
        checks = cls._parse_body is not Codec._parse_body or cls._check_batch is not None
        self._parse_mode = 1 if cls._parse_host is not None else 2 if checks else 0

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

    def _encode_body(
        self, x: torch.Tensor, generator: Any, v: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        """One tensor through the batch form: a batch of one row (its errors name no row)."""
        self._need_form("_encode_body")
        X = x.reshape(1, -1)
        if self.check_finite and not self.checks_finite:  # the check of _finite_rows, one row
            check_scalar(X.sum(), X, self.spec, "the sum", overflow_ok=True)
        try:
            self._encode_batch(X, generator, _as_rows(v))
        except CompressionError as exc:
            exc.row = None
            raise
        return v

    def _parse_body(
        self, v: dict[str, torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype
    ) -> dict[str, Any]:
        if self._check_batch is not None:
            self._check_batch(_as_rows(v), numel_of(shape))
        return v

    def _decode_body(
        self, parts: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype, out: torch.Tensor
    ) -> None:
        """One message through the batch form: a batch of one row."""
        self._need_form("_decode_body")
        self._decode_batch(_as_rows(parts), out.view(1, -1))

    def _decode_add_body(
        self,
        parts: dict[str, Any],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        out: torch.Tensor,
        weight: float,
    ) -> None:
        """``out += weight·decode``, rounded as a block of rows adds (so a row's message gives
        the same bits alone and in a block): the batch form rounds ``w·C(q)`` first (one
        multiply, then ``index_add_`` in row order) unless it declares ``fused_add``; that and
        the per-tensor form round once (``add_(…, alpha=w)``)."""
        if self._decode_add_batch is not None:
            self._decode_add_batch(_as_rows(parts), out.view(1, -1), weight)
            return
        tmp = self.ws.get("decode_add", out.numel(), dtype, out.device).view(out.shape)
        self._decode_body(parts, shape, dtype, tmp)
        if self._encode_batch is not None and not self.fused_add and weight != 1.0:
            out.add_(tmp.mul_(weight))
        else:
            out.add_(tmp, alpha=weight)

    def _refuse_encode(self, bad: torch.Tensor, refuse: Any) -> None:
        """For ``_encode_batch``: if ``bad`` ([m] bool) is set, raise the
        :class:`CompressionError` that ``refuse(r)`` raises for the first such row r, naming
        the row (``.row = r``; a single tensor's encode names none)."""
        r = _rows.first(bad)
        if r is not None:
            _rows.raise_row(r, lambda: refuse(r), "refused")

    def _need_form(self, hook: str) -> None:
        if self._encode_batch is None:
            raise ContractError(f"{type(self).__name__} writes neither the batch form "
                                f"(_encode_batch, _decode_batch) nor {hook}: write one of them "
                                "(docs/extending.md)")

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
        if dispatch.host_encode(self, plan):
            if out is None:
                arr = plan.new_message()
                buf = torch.from_numpy(arr)
            else:
                buf = new_buffer(plan.nbytes, x.device, out, self.spec)
                arr = buf.numpy()
                arr[:HEADER_NBYTES] = plan.header_np
                plan.zero_gaps(arr)
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
        host = dispatch.host_layout(plan)  # numpy only to lay out the buffer
        if host and out is None:
            buf = torch.from_numpy(plan.new_message())
        else:
            buf = new_buffer(plan.nbytes, x.device, out, self.spec)
            if host:
                buf.numpy()[:HEADER_NBYTES] = plan.header_np
            else:
                plan.write_header(buf)
            plan.zero_gaps(buf)
        parts = self._encode_body(x, generator, plan.torch_views(buf, host))
        return Payload(buf, x.shape, x.dtype, parts)

    # ------------------------------------------------------------ blocks of nodes
    def encode_rows(self, X: torch.Tensor, rng: Any = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """The block version (contract in :meth:`Compressor.encode_rows`): the fast kernel
        when one is registered, else the reference (:meth:`_encode_rows_ref`)."""
        fast = dispatch.block_kernel(self._fast_encode_rows, X.dtype, self.fast_dtypes)
        if fast is not None:
            return fast(X, rng, out=out)
        return self._encode_rows_ref(X, rng, out)

    def _encode_rows_ref(self, X: torch.Tensor, rng: Any, out: torch.Tensor | None) -> torch.Tensor:
        """The reference block encode: the batch form in one call; else (a per-tensor form,
        or a stateful compressor) each row by the single-tensor path."""
        if self._encode_batch is not None and _rows.is_block(X) and not self.stateful:
            return self._encode_rows_batch(X, rng, out)
        return Compressor.encode_rows(self, X, rng, out=out)

    @no_grad
    def _encode_rows_batch(self, X: torch.Tensor, rng: Any, out: torch.Tensor | None) -> torch.Tensor:
        """Every row through the batch form in one call, into the sections of the block."""
        plan, X, block = _rows.start_encode(self, X, out)
        if X.stride(1) != 1:  # contiguous rows (a block's rows may lie in its message rows)
            X = X.contiguous()
        if self.check_finite and not self.checks_finite:
            r = _rows.first(~_finite_rows(X))
            if r is not None:
                exc = nonfinite(self.spec)
                exc.row = r
                raise exc
        if self.randomized:
            check_generator(rng, X[0], self.spec)
            rng = as_stream(rng)
        self._encode_batch(X, rng, {name: _rows.section(block, plan, name) for name in plan.sec.names})
        return block

    def decode_add_rows_(self, out: torch.Tensor, block: torch.Tensor,
                         weight: torch.Tensor | float = 1.0, *,
                         rows: torch.Tensor | None = None, check: bool = True) -> torch.Tensor:
        """The block version (contract in :meth:`Compressor.decode_add_rows_`): the fast kernel
        when one is registered, else the reference (:meth:`_decode_add_rows_ref`)."""
        fast = dispatch.block_kernel(self._fast_decode_add_rows, out.dtype, self.fast_dtypes)
        if fast is not None:
            return fast(out, block, weight, rows=rows, check=check)
        return self._decode_add_rows_ref(out, block, weight, rows, check)

    def _decode_add_rows_ref(self, out: torch.Tensor, block: torch.Tensor, weight: Any,
                             rows: torch.Tensor | None, check: bool) -> torch.Tensor:
        """The reference block decode-add: the batch form decodes every row in one call into a
        scratch block, multiplies it by the weights and adds it row after row (``index_add_``:
        a repeated target adds in row order), the roundings of the single-message path; else
        the loop over rows."""
        st = _rows.start_decode(self, out, block, weight, rows, check) \
            if self._decode_batch is not None else None
        if st is None:
            return Compressor.decode_add_rows_(self, out, block, weight, rows=rows, check=check)
        with torch.no_grad():
            plan, block, tgt, w, bad = st
            views = {name: _rows.section(block, plan, name) for name in plan.sec.names}
            if check:
                self._refuse_rows(block, bad, views, lambda r: out[int(tgt[r])])
            m, d = block.shape[0], out.shape[1]
            tmp = _rows.scratch(self, "decode_batch", (m, d), out.dtype, out.device)
            self._decode_batch(views, tmp)
            if w is not None and out.stride(1) != 1 and d > 1:  # strided rows: as a single
                for r, t in enumerate(tgt.tolist()):  # message adds into one (alpha=w, fused)
                    out[t].add_(tmp[r], alpha=float(w[r, 0]))
                return out
            t = None if rows is None else tgt
            if not self.fused_add or w is None:
                if w is not None:
                    tmp.mul_(w.to(_rows.product_dtype(out.dtype)))
                _rows.add_rows_(out, t, tmp, None, fused=False)
            elif out.dtype in (torch.float32, torch.float64):
                _rows.add_rows_(out, t, tmp, w, fused=True)
            else:  # half types: torch's vector loop rounds a fused add unlike its scalar one
                for r, row in enumerate(tgt.tolist()):
                    out[row].add_(tmp[r], alpha=float(w[r, 0]))
        return out

    # ------------------------------------------------------------ chunks of messages
    #: fast kernels of the chunk methods (optional, for compressors that split): the contracts
    #: of ``encode_split_rows`` / ``decode_bodies`` / ``decode_add_bodies_``, without the
    #: whole-message buffer and the re-framing of their references
    _fast_encode_split_rows: ClassVar[Any] = None
    _fast_decode_bodies: ClassVar[Any] = None
    _fast_decode_add_bodies: ClassVar[Any] = None

    def chunk_sections(self, like: torch.Tensor, n: int) -> Sections:
        """The body layout of the message of one of ``n`` equal chunks of tensors like
        ``like``; raises :class:`CompressionError` for a compressor that does not split or a
        size that does not cut (see :meth:`split_rows`)."""
        d, n = like.numel(), int(n)
        if not self.splits:
            raise CompressionError(f"{self.spec}: its messages do not cut into the messages of "
                                   "their chunks (only entry-wise compressors do: none, fp16, "
                                   "bf16, sign, sign_l1, sign_l2, vote)")
        if n < 1 or d % n:
            raise CompressionError(f"{self.spec}: {d} entries do not cut into {n} equal chunks")
        key = (like.shape, like.dtype, n)
        part = self._chunk_plans.get(key)
        if part is None:
            whole = self.sections(tuple(like.shape), like.dtype)
            part = self.sections((d // n,), like.dtype)
            part8 = self.sections((8 * (d // n),), like.dtype)  # a cut section grows with the chunk
            for i, name in enumerate(whole.names):
                cnt, size = part.counts[i], part.counts[i] * part.dtypes[i].itemsize
                nbytes = whole.counts[i] * whole.dtypes[i].itemsize
                once = nbytes == size and part8.counts[i] == cnt
                cut = nbytes == n * size and part8.counts[i] == 8 * cnt  # whole bytes per chunk
                if not (once or cut):
                    raise CompressionError(
                        f"{self.spec}: its {name} section ({nbytes} bytes for {d} entries) does "
                        f"not cut into {n} chunks of {size} bytes (bit planes need chunks of a "
                        "multiple of 8 entries)")
            self._chunk_plans[key] = part
        return part

    def split_rows(self, block: torch.Tensor, like: torch.Tensor, n: int, *,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """The bodies of the ``n`` chunks of every message of ``block`` ([m, nbytes] messages
        of tensors like ``like``, ``d`` entries): a [m, n, ``body_nbytes((d/n,), dtype)``]
        uint8 tensor whose ``[r, j]`` is the body (no header) of the message of chunk j of row
        r, as :attr:`splits` defines it: a section with one value per entry is cut, a section
        the message holds once (a scale) is repeated in every chunk. So a chunk costs its own
        entries' bits plus the message's scalars, and :meth:`decode_bodies` decodes it to
        chunk j of the row's ``C(x)``. ``out``: a reused [m, n, ≥body] uint8 tensor.
        Raises :class:`CompressionError` for a compressor that does not split, or a ``d`` that
        does not cut into whole sections (bit planes need chunks of a multiple of 8 entries)."""
        part = self.chunk_sections(like, n)
        whole = self.plan(like)
        m = block.shape[0]
        if block.dim() != 2 or block.shape[1] != whole.nbytes:
            raise CompressionError(f"{self.spec}: split_rows needs [m, {whole.nbytes}] messages, "
                                   f"got {tuple(block.shape)}")
        res = _chunk_rows(out, m, n, part.nbytes, block.device)
        for (_, a, b, _, dt), cnt, off in zip(whole.slots, part.counts, part.offsets, strict=True):
            size = cnt * dt.itemsize
            src, dst = block[:, a:b], res[:, :, off : off + size]
            if b - a == size:  # once per message: in every chunk
                dst.copy_(src.unsqueeze(1).expand(m, n, size))
            else:  # one value per entry: cut
                dst.copy_(src.reshape(m, n, size))
        return res

    def framed_rows(self, k: int, like: torch.Tensor, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """``k`` messages of tensors like ``like`` with their headers written and their bodies
        (``block[:, HEADER_NBYTES:]``) left to fill, e.g. with the bodies of
        :meth:`split_rows` that travelled without a header; :meth:`decode_add_rows_` and
        :meth:`check_rows` then read them. ``out``: a reused block, as in :meth:`encode_rows`."""
        plan = self.plan(like)
        block = _row_block(out, int(k), plan.nbytes, like.device)
        block[:, :HEADER_NBYTES].view(torch.int64).fill_(_rows.header_int64(plan))
        return block

    def encode_split_rows(self, X: torch.Tensor, n: int, *,
                          out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`split_rows` of :meth:`encode_rows` of ``X`` ([m, d]), byte for byte: the
        bodies of the messages of the ``n`` chunks of every row, [m, n, body]. The fast kernels
        write each chunk's body straight into its place in ``out`` (a reused [m, n, ≥body]
        uint8 tensor, e.g. a sender's staging rows), with no whole message in between; the
        reference encodes whole messages and cuts them."""
        fast = dispatch.block_kernel(self._fast_encode_split_rows)
        if fast is not None:
            return fast(X, n, out=out)
        return self.split_rows(self.encode_rows(X), X[0], n, out=out)

    def _split_out(self, X: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
        """The [m, n, body] rows a fast ``encode_split_rows`` of ``X`` writes (``out``'s when
        it fits), after the checks of :meth:`chunk_sections` and of a row's plan."""
        if not _rows.is_block(X):
            raise CompressionError(f"{self.spec}: encode_split_rows needs an [m, d] block, got "
                                   f"shape {tuple(X.shape)}")
        self.plan(X[0])  # dtype checks of a single message
        part = self.chunk_sections(X[0], n)
        return _chunk_rows(out, X.shape[0], int(n), part.nbytes, X.device)

    def decode_bodies(self, bodies: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out[r] = decode`` of the message whose body is ``bodies[r]`` ([k, body] uint8, no
        header, rows may be strided; ``out`` [k, c], e.g. the bodies of :meth:`split_rows` of
        c-entry chunks): what a receiver that knows the header (a fixed routing) decodes.
        The bodies are not validated (rows this process's routing carried between its own
        encoders, as ``check=False``); the batch form decodes them where they lie, a
        per-tensor form frames them again and decodes every row."""
        fast = dispatch.block_kernel(self._fast_decode_bodies)
        if fast is not None:
            return fast(bodies, out)
        if self._decode_batch is not None:
            self._decode_batch(self.body_views(bodies, out), out)
            return out
        msgs = self._framed_bodies(bodies, out)
        for r in range(out.shape[0]):
            self.decode(self.from_bytes(msgs[r], out[r]), out=out[r])
        return out

    def decode_add_bodies_(self, out: torch.Tensor, bodies: torch.Tensor) -> torch.Tensor:
        """``out[r] += decode`` of the body ``bodies[r]``: :meth:`decode_bodies` added, bit for
        bit ``decode_add_rows_`` of the framed messages (weight 1)."""
        fast = dispatch.block_kernel(self._fast_decode_add_bodies)
        if fast is not None:
            return fast(out, bodies)
        return self.decode_add_rows_(out, self._framed_bodies(bodies, out), check=False)

    def body_views(self, bodies: torch.Tensor, out: torch.Tensor) -> dict[str, torch.Tensor]:
        """The typed [k, count] sections of bodies ([k, body] uint8) of messages of rows like
        ``out[0]``; a section whose rows do not align to its dtype is copied (a scale in the
        bodies of a chunked route)."""
        sec = self.sections(tuple(out.shape[1:]), out.dtype)
        if bodies.dim() != 2 or bodies.dtype != torch.uint8 or bodies.shape != (out.shape[0], sec.nbytes):
            raise CompressionError(f"{self.spec}: bodies must be [{out.shape[0]}, {sec.nbytes}] "
                                   f"uint8, got {tuple(bodies.shape)} {bodies.dtype}")
        views = {}
        for name, dt, cnt, off in zip(sec.names, sec.dtypes, sec.counts, sec.offsets, strict=True):
            v = bodies[:, off : off + cnt * dt.itemsize]
            if v.stride(0) % dt.itemsize or v.storage_offset() % dt.itemsize or v.stride(1) != 1:
                v = torch.empty(v.shape, dtype=torch.uint8, device=v.device).copy_(v)
            views[name] = v.view(dt)
        return views

    def _framed_bodies(self, bodies: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The messages of ``bodies`` for rows like ``out[0]``: headers put back (references)."""
        msgs = self.framed_rows(out.shape[0], out[0])
        msgs[:, HEADER_NBYTES:].copy_(bodies)
        return msgs

    def check_rows(self, block: torch.Tensor, like: torch.Tensor) -> None:
        if (self._decode_batch is None or not (_rows.is_block(block) and block.dtype == torch.uint8)
                or dispatch.loop_check(self, block, like.numel())):
            return super().check_rows(block, like)
        plan = self.plan(like)
        if block.shape[1] != plan.nbytes:
            _rows.raise_row(0, lambda: self.from_bytes(block[0], like), "wrong message size")
        if block.stride(1) != 1 or block.stride(0) % 8 or block.storage_offset() % 8:
            block = _row_block(None, block.shape[0], plan.nbytes, block.device).copy_(block)
        head = block[:, :HEADER_NBYTES].view(torch.int64).view(-1)
        views = {name: _rows.section(block, plan, name) for name in plan.sec.names}
        self._refuse_rows(block, head != _rows.header_int64(plan), views, lambda r: like)

    def _refuse_rows(self, block: torch.Tensor, bad: torch.Tensor, views: dict[str, torch.Tensor],
                     like_of: Any) -> None:
        """Raise the ``from_bytes`` error of the first row that a wrong header (``bad``), a
        NaN/Inf or negative scale, or ``_check_batch`` refuses; ``like_of(r)`` is row r's tensor."""
        bad = _rows.value_mask(self, views, bad)
        if self._check_batch is not None:
            try:
                self._check_batch(views, like_of(0).numel())
            except CompressionError:  # find the row: the single-message check names it
                parse = lambda r: self.from_bytes(block[r], like_of(r))  # noqa: E731
                r = next((r for r in range(block.shape[0]) if _refused(parse, r)), None)
                if r is None:
                    raise
                _rows.raise_row(r, lambda: parse(r), "refused")
        r = _rows.first(bad)
        if r is not None:
            _rows.raise_row(r, lambda: self.from_bytes(block[r], like_of(r)), "bad row")

    def _host_out(self, out: Any, payload: Payload) -> np.ndarray | None:
        """``out`` as a flat numpy array when the numpy decoders can write it, else None."""
        if (
            isinstance(out, torch.Tensor)
            and out.dtype == payload.dtype
            and out.dtype in FAST_DTYPES
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
        if payload.host is not None and self._decode_host is not None and payload.dtype in FAST_DTYPES:
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
        if dispatch.host_parse(plan, buf):
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
            if mode == 1 and plan.host:
                return Payload(buf, like.shape, like.dtype, None, self._parse_host(views, plan.numel))
            if mode or not plan.host:  # the torch parse (half-precision models: no numpy twin)
                parts = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in views.items()}
                if mode:
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


def _chunk_rows(out: torch.Tensor | None, m: int, n: int, nbytes: int,
                device: torch.device) -> torch.Tensor:
    """[m, n, nbytes] uint8 rows for the bodies of chunks: ``out``'s when it fits, else new."""
    if out is not None and out.dim() == 3 and out.shape[:2] == (m, n) and out.shape[2] >= nbytes:
        return out[:, :, :nbytes]
    return torch.zeros((m, n, nbytes), dtype=torch.uint8, device=device)


def _refused(parse: Any, r: int) -> bool:
    """Whether ``parse(r)`` raises :class:`CompressionError`."""
    try:
        parse(r)
    except CompressionError:
        return True
    return False


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
