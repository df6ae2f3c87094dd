"""A phase's message rows: the buffers an encode writes, the transport sends and receives in
place, and a decode reads; and the framing of several messages sent as one.

``own`` ([m, pitch] uint8, 8-aligned rows) holds the block's messages and ``recv`` ([R, pitch])
receives the R messages that arrive from other processes (one per remote in-edge, sorted by
(sender, receiver)); staging row index ``m + e`` means ``recv[e]``. Usually both are one
buffer, so nothing is copied between encode, wire and decode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.compress.base import row_stride
from gossip.errors import CompressionError

ALIGN = 64  # bytes: the alignment of fresh torch tensors, which oracles' kernels expect


def pack_header(sizes: list[int]) -> torch.Tensor:
    """The framing of several messages sent as one: ``[count][len_1]…[len_k]``, int64 little
    endian (8 bytes a field), followed on the wire by the parts' bytes. It travels and is
    counted like everything else; receivers check it against the sizes they expect."""
    return torch.tensor([len(sizes), *sizes], dtype=torch.int64).view(torch.uint8)


class Rows:
    """One phase's messages (see the module doc): ``own`` and ``recv`` are [rows, pitch] uint8
    with ``nbytes`` of each row used; ``compressor`` and ``like`` (a [d] row) decode them
    (None for raw bytes); ``route`` (a :class:`MixPlan` or :class:`ArcPlan`) says where they go."""

    __slots__ = ("own", "recv", "nbytes", "compressor", "like", "route", "_all", "pending", "source",
                 "noise")

    def __init__(self, own: torch.Tensor, recv: torch.Tensor, nbytes: int, compressor: Any,
                 like: torch.Tensor | None, both: torch.Tensor | None = None, route: Any = None):
        self.own = own
        self.recv = recv
        self.nbytes = nbytes
        self.compressor = compressor
        self.like = like
        self.route = route
        self._all = both  # own and recv as one buffer, when they are one
        self.pending: Callable[[], None] | None = None
        """The check of the received rows, when it waits for their first reading (a mix
        kernel that checks its result instead of every message runs it only on failure)."""
        self.source: tuple[torch.Tensor, int] | None = None
        """``(x, version)`` when the own rows are ``x``'s own memory (``none`` sends the model
        where it is): decoding them after ``x`` changed would read another model."""
        self.noise: Any = None
        """What a noisy channel adds to the received messages' decoded values (``--network
        noise=``, :class:`gossip.network.noise.MessageNoise`: ``add_mixed`` and
        ``add_received``, which the block's decodes of received messages call); None: none."""

    def settle(self) -> None:
        """Run the check of the received rows if it is still :attr:`pending` (once)."""
        check, self.pending = self.pending, None
        if check is not None:
            check()

    def mine(self) -> torch.Tensor:
        """[m, nbytes]: the block's own messages."""
        return self.own[:, : self.nbytes]

    def received(self) -> torch.Tensor:
        """[R, nbytes]: what the other processes sent (``plan.remote_in`` order)."""
        return self.recv[:, : self.nbytes]

    def gather(self, src: torch.Tensor, span: slice | None) -> torch.Tensor:
        """The messages of staging rows ``src`` as [k, nbytes] with 8-aligned rows: a view when
        they are consecutive (``span``) in one buffer, else one gather."""
        self.settle()
        m, nb = self.own.shape[0], self.nbytes
        if span is not None:
            if span.stop <= m:
                return self.own[span, :nb]
            if span.start >= m:
                return self.recv[span.start - m : span.stop - m, :nb]
        return self.both().index_select(0, src)[:, :nb]

    def both(self) -> torch.Tensor:
        """[m + R, pitch]: own rows then received rows (concatenated once if they are apart)."""
        self.settle()
        if self._all is None:
            if not self.recv.shape[0]:
                self._all = self.own
            else:  # own rows may be wider (a model's message rows): the common 8-aligned width
                width = row_stride(self.nbytes)
                self._all = torch.cat([self.own[:, :width], self.recv[:, :width]])
        return self._all


class PackedRows(Rows):
    """A phase of several messages (:meth:`Block.pack`); ``parts[k]`` is the k-th as
    :class:`Rows`, column views of the same rows."""

    __slots__ = ("parts",)


class PackedParts:
    """The ``compressor`` of :class:`PackedRows`: checks what other processes sent (the header,
    then each compressed part in its columns; an error's ``row`` is the received row)."""

    sends_values_in_place = False
    stateful = False

    def __init__(self, header: torch.Tensor, parts: list[Rows], offsets: list[int]):
        self.header = header
        self.parts = parts
        self.offsets = offsets

    def check_rows(self, block: torch.Tensor, like: Any) -> None:
        head = self.header.numel()
        bad = (block[:, :head] != self.header.to(block.device)).any(1)
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            err = CompressionError(f"packed message header {block[row, :head].tolist()} is not "
                                   f"the expected {self.header.tolist()} (parts and sizes)")
            err.row = row
            raise err
        for part, off in zip(self.parts, self.offsets):
            if part.compressor is not None:
                part.compressor.check_rows(block[:, off : off + part.nbytes], part.like)


def message_buffer(shape: tuple[int, int], device: torch.device, align: int = 8) -> torch.Tensor:
    """A [rows, pitch] uint8 buffer starting ``align``-byte aligned; on CPU numpy-allocated (MPI
    moves such buffers about twice as fast as torch-allocated ones with the MPICH wheel; see
    docs/performance.md)."""
    n = shape[0] * shape[1]
    if device.type == "cpu":
        import numpy as np

        raw = torch.from_numpy(np.empty(n + align, dtype=np.uint8))
    else:
        raw = torch.empty(n + align, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % align
    return raw[skip : skip + n].view(shape)
