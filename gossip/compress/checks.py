"""Input checks shared by the compressors, and reusable scratch memory.

The NaN/Inf check reads one scalar each compressor computes anyway (a norm, a maximum, a sum),
so it costs no extra pass in the common case; only when that scalar is not finite do we look at
the whole input to tell NaN/Inf apart from an overflowing reduction of finite values.
"""

from __future__ import annotations

import math
import threading

import torch

from gossip.compress.base import CompressionError

FLOAT_DTYPES = (torch.float32, torch.float64)


def nonfinite(name: str) -> CompressionError:
    return CompressionError(
        f"{name}: the input contains NaN/Inf; the model diverged or the input is corrupt "
        "(lower the step size or check the data)"
    )


def check_scalar(
    stat: torch.Tensor, x: torch.Tensor, name: str, what: str, overflow_ok: bool = False
) -> None:
    """Raise unless ``stat`` (a reduction of ``x``) is finite.

    A non-finite ``stat`` of an all-finite ``x`` is an overflow of the reduction: accepted when
    ``overflow_ok`` (the statistic was only a check), else reported as such. One host sync on
    CUDA (``bool(tensor)``).
    """
    if math.isfinite(float(stat)):
        return
    if not bool(torch.isfinite(x).all()):
        raise nonfinite(name)
    if overflow_ok:
        return
    big = float(x.abs().amax())
    raise CompressionError(
        f"{name}: {what} overflows {x.dtype} although every entry is finite (largest "
        f"|x_i| = {big:.3g}); the model diverged, or use float64"
    )


def check_dtype(x: torch.Tensor, allowed: tuple[torch.dtype, ...], name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise CompressionError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise CompressionError(f"{name}: supports dtypes {names}; got {x.dtype}")
    if x.numel() == 0:
        raise CompressionError(f"{name}: cannot compress an empty tensor")


def check_generator(generator: torch.Generator | None, x: torch.Tensor, name: str) -> None:
    """A randomized compressor needs the caller's generator, on the tensor's device."""
    if generator is None:
        raise CompressionError(
            f"{name} is randomized: pass the node's torch.Generator to encode(x, generator) "
            "(seeded per node, so a run is reproducible: same seed -> same bytes)"
        )
    gdev = generator.device
    if gdev.type != x.device.type or (
        x.device.index is not None and gdev.index is not None and gdev.index != x.device.index
    ):
        raise CompressionError(
            f"{name}: the generator is on {gdev} but the tensor on {x.device}; create it with "
            f"torch.Generator(device={str(x.device)!r})"
        )


class Workspace:
    """Scratch tensors kept between calls, grown on demand.

    Freshly allocated memory costs a page fault per 4 KiB on first touch (≈ 2 GB/s here, see
    DESIGN.md speed rules), so model-sized temporaries are allocated once and reused. All
    compressors of a thread share one workspace (:func:`shared_workspace`), so hosting many
    nodes in one process costs one set of temporaries, not one per node. Hence the rule: a
    workspace tensor never outlives the call that took it (never put one in a payload or hand
    it to the caller), and two live temporaries of one call use different tags.
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, tag: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A contiguous 1-D tensor of ``numel`` entries (uninitialised, storage offset 0)."""
        key = (tag, dtype, device)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
            self._bufs[key] = buf
        return buf[:numel]

    def clear(self) -> None:
        self._bufs.clear()


_LOCAL = threading.local()


def shared_workspace() -> Workspace:
    """The calling thread's workspace (compressors never run one call across threads)."""
    ws = getattr(_LOCAL, "ws", None)
    if ws is None:
        ws = _LOCAL.ws = Workspace()
    return ws
