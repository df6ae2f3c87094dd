"""How an asynchronous message travels between processes (the event loop's and a free run's):
framed as a synchronous round's message would be, so the receiver checks it the same way.

:func:`frame` turns a message's parts into one host uint8 buffer (each floating part with the
``none`` compressor's wire header, :mod:`gossip.compress.wire`); :func:`unframe` checks a
received buffer (header, exact size, NaN/Inf) and gives the parts back; :func:`merged` (a
receive) and :func:`activated` (an activation's exchange) name the sender when the algorithm's
decoder refuses what it was sent; :func:`parts_nbytes` is what a message counts as sent.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.errors import CompressionError, DivergenceError, RowsError

_framer: Any = None


def _none() -> Any:
    """The ``none`` compressor that frames floating parts (made once, on first use)."""
    global _framer
    if _framer is None:
        from gossip.compress import make

        _framer = make("none")
    return _framer


def frame(parts: tuple[torch.Tensor, ...], sender: str = "a node") -> torch.Tensor:
    """An asynchronous message as it travels between processes (a host uint8 buffer of its
    own): each floating part as the ``none`` compressor's message of its entries (the wire
    header of :mod:`gossip.compress.wire`, then the values), a uint8 part as it is (a
    compressor's message already: async-choco's). What a synchronous round sends, so the
    receiver checks it the same way (:func:`unframe`). A floating part with NaN/Inf is not
    sent: the sender's model diverged (``sender`` names it in the error). The bytes counted are
    the parts' (:func:`parts_nbytes`), in process and across processes alike."""
    out = []
    for p in parts:
        if p.is_floating_point():
            try:
                out.append(_none().encode(p.detach().reshape(-1)).to_bytes().cpu())
            except CompressionError as exc:
                raise DivergenceError(f"{sender} has NaN/Inf in the message it would send: the "
                                      "run diverged. Lower the step sizes (gamma, eta).") from exc
        else:
            out.append(p.detach().reshape(-1).view(torch.uint8).cpu().clone())
    return out[0] if len(out) == 1 else torch.cat(out)


def framed_nbytes(like: tuple[torch.Tensor, ...]) -> int:
    """Bytes of the :func:`frame` of parts like ``like``."""
    return sum(_none().fixed_nbytes(p.reshape(-1)) if p.is_floating_point()
               else p.numel() * p.element_size() for p in like)


def unframe(buf: torch.Tensor, like: tuple[torch.Tensor, ...], where: str, sender: int,
            receiver: int) -> tuple[torch.Tensor, ...]:
    """The parts (host tensors shaped like ``like``) of a received :func:`frame`, checked as a
    synchronous round checks a message (``Compressor.from_bytes``: wire header, exact size,
    NaN/Inf); a uint8 part is checked for its size here and for the rest by the algorithm's
    decoder (:func:`merged`). A refused message raises :class:`RowsError` starting with
    ``where`` (the receiver, and the sender it names), its fields ``sender`` and ``receiver``
    the nodes."""
    out, at = [], 0
    for k, p in enumerate(like):
        size = framed_nbytes((p,))
        chunk = buf[at:] if k == len(like) - 1 else buf[at: at + size]  # the last takes the rest
        at += size
        try:
            if p.is_floating_point():
                flat = p.reshape(-1)
                out.append(_none().decode(_none().from_bytes(chunk, flat)).view(p.shape))
                continue
            if chunk.numel() != size:
                raise CompressionError(
                    f"message is {'truncated' if chunk.numel() < size else 'extended'}: part {k} "
                    f"holds {chunk.numel()} bytes, expected {size}")
        except CompressionError as exc:
            raise RowsError(f"{where}: {exc}", sender=sender, receiver=receiver) from exc
        out.append(chunk.view(p.dtype).view(p.shape))
    return tuple(out)


def merged(call: Any, where: str, sender: int, receiver: int) -> None:
    """Run ``call()``, the algorithm's receive of a message from another process:
    a message its decoder refuses (a compressor's, carried as bytes) raises
    :class:`RowsError` naming the sender, as :func:`unframe` does."""
    try:
        call()
    except RowsError:
        raise
    except CompressionError as exc:
        raise RowsError(f"{where}: {exc}", sender=sender, receiver=receiver) from exc


def activated(algorithm: Any, block: Any, event: Any) -> None:
    """Run ``algorithm.activate(block, event)``: when its exchange's reply came from another
    process (``event.heard_from``), a reply its decoder refuses raises :class:`RowsError`
    naming the sender, as :func:`merged` does."""
    try:
        algorithm.activate(block, event)
    except CompressionError as exc:
        if event.heard_from is None:
            raise
        where, sender = event.heard_from
        raise RowsError(f"{where}: {exc}", sender=sender, receiver=event.node) from exc


def parts_nbytes(parts: tuple[torch.Tensor, ...]) -> int:
    """Bytes of a message's parts: what is counted as sent."""
    return sum(p.numel() * p.element_size() for p in parts)


__all__ = ["activated", "frame", "framed_nbytes", "unframe", "merged", "parts_nbytes"]
