"""The compressor interface: pure encode/decode of a tensor to one contiguous byte buffer.

A compressor never communicates and knows no algorithm. ``encode`` returns a :class:`Payload`
whose ``buffer`` is exactly the bytes that travel (``payload.nbytes`` is what the engine counts);
the receiver rebuilds the payload with :meth:`Compressor.from_bytes`, which validates every
header field and length before touching the data.

Wire format (``gossip/compress/wire.py``): an 8-byte header (magic, version, value dtype,
compressor kind, one parameter byte, numel mod 2³²) followed by the compressor's sections
(scales, values, indices, packed bits), each aligned to its element size so that ``parts`` are
plain typed views of ``buffer``. Every compressor here has a fixed size for a given tensor
shape and dtype, so ``fixed_nbytes(like) == max_nbytes(like) == payload.nbytes``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch

from gossip.errors import CompressionError


class Payload:
    """One encoded message.

    ``buffer`` is a 1-D contiguous uint8 tensor (on the tensor's device): the wire format.
    ``parts`` are named views into ``buffer`` (values, indices, packed bits, scales) that
    ``decode`` reads; ``shape`` and ``dtype`` describe the tensor it stands for.

    Payloads of CPU tensors built on the numpy fast path keep their sections as numpy views
    (``host``); ``parts`` then turns them into torch views on first access (no copy).
    """

    __slots__ = ("buffer", "shape", "dtype", "_parts", "host")

    def __init__(
        self,
        buffer: torch.Tensor,
        shape: torch.Size,
        dtype: torch.dtype,
        parts: dict[str, Any] | None = None,
        host: dict[str, Any] | None = None,
    ) -> None:
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype
        self._parts = parts if parts is not None or host is not None else {}
        self.host = host

    @property
    def parts(self) -> dict[str, Any]:
        p = self._parts
        if p is None:
            p = self._parts = _as_torch(self.host)
        return p

    @parts.setter
    def parts(self, value: dict[str, Any]) -> None:
        self._parts = value

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the length of :meth:`to_bytes`."""
        return self.buffer.numel()

    def to_bytes(self) -> torch.Tensor:
        """The one contiguous uint8 buffer the transport sends (no copy)."""
        return self.buffer

    def __repr__(self) -> str:
        names = list(self.host if self._parts is None else self._parts)
        return (
            f"Payload(nbytes={self.nbytes}, shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"device={self.buffer.device}, parts={names})"
        )


def _as_torch(obj: Any) -> Any:
    """``obj`` with every numpy array (in dicts and lists) as a torch view of it."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: _as_torch(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_as_torch(v) for v in obj]
    return obj


class Compressor(ABC):
    """Base class; subclasses document their math, bias and constant in the docstring.

    Attributes:
        spec: the registry spec that builds it (``"topk:0.01"``), for messages and logs only:
            algorithms read the properties below, never the spec.
        is_identity: ``C(x) = x`` exactly (only ``none``; not the 16-bit casts). Methods that
            mix exact models take only it; others skip their public copies with it.
        unbiased: ``E decode(encode(x)) == x``.
        bounded_variance: the error is bounded relative to the input whatever the compressor's
            state: some multiple λC (λ > 0) contracts, ``E‖λC(x)−x‖² ≤ (1−δ)‖x‖²`` with a δ > 0
            that depends on d only (true of every unbiased compressor with a finite ω and of
            every contractive one). False for one warm-started low-rank power step: its message
            is 0 when the warm start is orthogonal to x, so no multiple contracts. Default True.
        omega: variance constant ω of an unbiased compressor (``E‖C(x)−x‖² ≤ ω‖x‖²``), else None.
            None too when ω depends on the dimension d and d is unknown (``qsgd``, ``lead``,
            ``randk:R:unbiased`` built without a layout): use :meth:`omega_for`.
        omega_exact: ``E‖C(x)−x‖² = ω‖x‖²`` for every x, not only in the worst case (rescaled
            rand-k; the identity): LEAD sizes its steps from ω then. Default False.
        delta: contraction quality δ (``E‖C(x)−x‖² ≤ (1−δ)‖x‖²``), or None when there is none
            (e.g. rescaled rand-k), it depends on the data (one low-rank power step) or on an
            unknown d (``sign``, ``topk:K``): use :meth:`delta_for`.
        randomized: ``encode`` draws from the caller's :class:`gossip.rng.Stream` (it must be
            given; the same stream position gives the same bytes; a ``torch.Generator`` on the
            tensor's device is accepted and turned into a stream by ``gossip.rng.as_stream``).
        stateful: the instance keeps state between calls (low-rank warm start): use one
            instance per stream of messages.
        check_finite: raise :class:`CompressionError` on NaN/Inf input (default True). The check
            reads one scalar the compressor computes anyway; on CUDA that is one host sync per
            ``encode``, which setting this to False removes (NaN/Inf then decode to garbage).
    """

    spec: str
    is_identity: ClassVar[bool] = False
    unbiased: ClassVar[bool] = False
    bounded_variance: ClassVar[bool] = True
    omega_exact: ClassVar[bool] = False
    randomized: ClassVar[bool] = False
    stateful: ClassVar[bool] = False
    omega: float | None = None
    delta: float | None = None
    check_finite: bool = True
    sends_values_in_place: ClassVar[bool] = False
    """The message of a row is a header followed by the row's values as they are (``none``):
    :meth:`encode_rows` given ``X`` that already sits in its ``out`` rows only writes headers,
    so a model allocated in message rows is sent without a copy."""
    splits: ClassVar[bool] = False
    """A message cuts into the messages of its chunks: for ``x`` cut into ``n`` equal chunks
    (at entries that keep its packed sections in whole bytes), chunk j of every section that
    holds one value per entry, beside the sections the message holds once (a scale), is a
    message of chunk j that decodes to chunk j of ``C(x)``. True of the entry-wise compressors
    (``none``, ``fp16``, ``bf16``, ``sign``/``sign_l1``, ``sign_l2``, ``vote``): their chunks
    are what the chunked all-reduce routes (:meth:`gossip.compress.Codec.split_rows`)."""
    layout_free: ClassVar[bool] = False
    """Each entry is encoded on its own (``none``, ``fp16``, ``bf16``): ``C`` of a vector is
    the concatenation of ``C`` of its parts, so compressing per tensor would send the same
    values with more headers, and a layout is not applied (:func:`gossip.compress.factory_for`)."""
    ordered_rows: ClassVar[bool] = False
    """:meth:`decode_add_rows_` adds a target row that repeats in ``rows`` in row order, bit for
    bit as the per-row loop (on CPU), so a block may decode all its neighbors in one call."""

    @abstractmethod
    def encode(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> Payload:
        """Compress ``x``; raises :class:`CompressionError` on NaN/Inf.

        ``out``: optional preallocated uint8 buffer of at least ``max_nbytes(x)`` bytes (its
        storage offset a multiple of 8) that the payload's ``buffer`` will be a prefix of.
        Reusing one avoids first-touch page faults on large messages; the caller must not
        reuse it while the payload is still in flight.
        """

    @abstractmethod
    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        """The tensor the payload stands for (written into ``out`` when given)."""

    def decode_add_(self, out: torch.Tensor, payload: Payload, weight: float = 1.0) -> torch.Tensor:
        """``out += weight * decode(payload)``; subclasses avoid the temporary where they can."""
        return out.add_(self.decode(payload), alpha=weight)

    @abstractmethod
    def from_bytes(self, buf: torch.Tensor, like: torch.Tensor) -> Payload:
        """Parse a received buffer for a tensor shaped like ``like``; validates everything."""

    @abstractmethod
    def max_nbytes(self, like: torch.Tensor) -> int:
        """Upper bound on ``nbytes`` for a tensor like ``like`` (sizes receive buffers)."""

    def fixed_nbytes(self, like: torch.Tensor) -> int | None:
        """Exact size when every payload for such a tensor has the same size, else None."""
        return None

    # -- blocks of nodes: one row per node ------------------------------------------------
    def encode_rows(self, X: torch.Tensor, rng: Any = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """Encode every row of ``X`` ([m, d], one node per row) into a [m, nbytes] uint8 block.

        Row ``r`` holds exactly the bytes of ``encode(X[r], rng.row(r))``: the rows are the
        messages (the transport sends row views, no copy). Rows are 8-aligned
        (:func:`row_stride`), so the block is a view whose pitch may exceed nbytes. ``rng`` is a
        :class:`gossip.rng.Stream` over the block's nodes (randomized compressors only);
        afterwards it stands where each row's stream would. ``out``: a reused [m, ≥nbytes]
        block. A row ``encode`` refuses (NaN/Inf) raises its :class:`CompressionError` with
        ``row`` set. This default loops over rows; the common compressors vectorize it.
        """
        if self.stateful:
            raise CompressionError(
                f"{type(self).__name__} keeps state per node, so it cannot encode a block of "
                "nodes with one instance; give every node its own instance"
            )
        m = X.shape[0]
        streams = [rng.row(r) for r in range(m)] if rng is not None else [None] * m
        like = X[0] if m else X.new_empty(0)
        fixed = self.fixed_nbytes(like) if m else None
        direct = fixed is not None and fixed == self.max_nbytes(like)  # encode into the rows
        block = _row_block(out, m, fixed, X.device) if direct else None
        payloads = []
        for r in range(m):
            try:
                payloads.append(self.encode(X[r], streams[r], out=block[r] if direct else None))
            except CompressionError as exc:
                exc.row = r
                raise
        if rng is not None and m:
            rng.sync(streams[0])
        nbytes = payloads[0].nbytes if m else self.max_nbytes(like)
        if any(p.nbytes != nbytes for p in payloads):
            raise CompressionError(f"{type(self).__name__} gave rows of different sizes; "
                                   "blocks need a fixed message size per shape")
        if block is None or block.shape[1] != nbytes:
            block = _row_block(out, m, nbytes, X.device)
        for r, p in enumerate(payloads):
            if p.buffer.data_ptr() != block[r].data_ptr():  # not encoded in place
                block[r].copy_(p.to_bytes())
        return block

    def decode_add_rows_(self, out: torch.Tensor, block: torch.Tensor,
                         weight: torch.Tensor | float = 1.0, *,
                         rows: torch.Tensor | None = None, check: bool = True) -> torch.Tensor:
        """``out[r] += weight[r] · decode(block[r])`` for every row (validating each message).

        ``weight`` is a float or a [m] tensor; ``rows`` (optional [m] int64) adds row ``r``
        of the block into ``out[rows[r]]`` instead. A malformed or non-finite row raises
        :class:`CompressionError` whose ``row`` names it. Bit for bit the per-row
        :meth:`decode_add_` with ``float(weight[r])``. ``check=False`` lets the vectorized
        versions skip the validation, for rows this process encoded itself or already passed
        through :meth:`check_rows` (this default loop validates anyway).
        """
        m = block.shape[0]
        w = weight.reshape(-1).tolist() if isinstance(weight, torch.Tensor) else [float(weight)] * m
        targets = rows.tolist() if rows is not None else range(m)
        for r, target in enumerate(targets):
            dst = out[target]
            try:
                payload = self.from_bytes(block[r], dst)
            except CompressionError as exc:
                exc.row = r
                raise
            self.decode_add_(dst, payload, w[r])
        return out

    def check_rows(self, block: torch.Tensor, like: torch.Tensor) -> None:
        """Validate every row of a received block as :meth:`from_bytes` does (header, size,
        NaN/Inf, index ranges); the first bad row raises :class:`CompressionError` with ``row``."""
        for r in range(block.shape[0]):
            try:
                self.from_bytes(block[r], like)
            except CompressionError as exc:
                exc.row = r
                raise

    def nbytes_rows(self, like: torch.Tensor) -> int:
        """Bytes of each row message for rows like ``like`` (a [d] tensor): the fixed size."""
        size = self.fixed_nbytes(like)
        if size is None:
            raise CompressionError(f"{type(self).__name__} has no fixed message size for a "
                                   f"tensor of {like.numel()} entries; blocks need one")
        return size

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves (see :class:`gossip.stateful.Stateful`): nothing by default;
        compressors with memory (``stateful = True``) override this and :meth:`load_state_dict`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a stateless compressor has nothing to restore)."""
        if state:
            raise CompressionError(
                f"{type(self).__name__} keeps no state, but the checkpoint holds {sorted(state)}; "
                "resume with the compressor the run was started with"
            )

    def omega_for(self, numel: int) -> float | None:
        """ω for a tensor of ``numel`` entries (worst case over the data); None when the
        variance is unbounded or ω unknown. Read it with :attr:`unbiased`: a biased form may
        report the ω of the unbiased one it scales (``qsgd:…:biased``)."""
        return self.omega

    def delta_for(self, numel: int) -> float | None:
        """δ for a tensor of ``numel`` entries (worst case over the data), else None."""
        return self.delta


def row_stride(nbytes: int) -> int:
    """Row pitch of a message block: ``nbytes`` rounded up to 8, so every row (message) starts
    8-aligned and its typed sections are views, as in a single message's buffer."""
    return -(-nbytes // 8) * 8


def _row_block(out: torch.Tensor | None, m: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A [m, nbytes] uint8 block with an 8-aligned row pitch: a view of ``out`` when it fits."""
    if (out is not None and out.shape[0] >= m and out.shape[-1] >= nbytes and out.device == device
            and out.stride(0) % 8 == 0 and out.storage_offset() % 8 == 0):
        return out[:m, :nbytes]
    return torch.empty((m, row_stride(nbytes)), dtype=torch.uint8, device=device)[:, :nbytes]
