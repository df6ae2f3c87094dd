"""Input checks shared by the compressors, and reusable scratch memory.

The NaN/Inf check reads one scalar each compressor computes anyway (a norm, a maximum, a sum),
so it costs no extra pass in the common case; only when that scalar is not finite do we look at
the whole input to tell NaN/Inf apart from an overflowing reduction of finite values.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch

from gossip.errors import CompressionError

FAST_DTYPES = (torch.float32, torch.float64)
"""The dtypes the numpy and numba fast paths serve; the half types take the torch path."""
FLOAT_DTYPES = (*FAST_DTYPES, torch.bfloat16, torch.float16)
"""The model dtypes a compressor accepts (values travel in the model's dtype)."""

F = TypeVar("F", bound=Callable[..., Any])


def no_grad(fn: F) -> F:
    """Like ``@torch.no_grad()``, but enters the context only when grad mode is on.

    ``torch.no_grad()`` costs a few µs per call; engines run their rounds under no_grad
    already, where this wrapper costs one ``torch.is_grad_enabled()``.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            with torch.no_grad():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


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


def all_finite(xn: np.ndarray, x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` (a CPU tensor; ``xn`` its numpy view) is finite.

    Small inputs: numpy's ``isfinite`` (no warnings, little overhead). Large ones: one summing pass
    (no temporary), looking closer only when the sum is not finite (NaN/Inf, or an overflow
    of finite values).
    """
    if xn.size <= 1 << 15:
        return bool(np.isfinite(xn).all())
    if math.isfinite(float(x.sum())):
        return True
    return bool(torch.isfinite(x).all())


def tame(*scalars: float) -> bool:
    """Whether arithmetic with these (received) scalars stays finite without numpy warnings.

    A corrupt or hostile message can carry a NaN, Inf or huge scale; decoding it gives garbage
    (as the torch path does) but should not raise numpy RuntimeWarnings (errors under
    ``-W error``). Callers run the rare untamed case under :func:`quiet`.
    """
    m = 1.0
    for v in scalars:
        m *= abs(float(v)) + 1.0
    return m < 1e30  # also False for NaN


def quiet():
    """A context that silences numpy floating-point warnings (for untamed scalars)."""
    return np.errstate(all="ignore")


@contextmanager
def unchecked(comp: Any) -> Iterator[None]:
    """``comp``'s NaN/Inf check of its input off for the calls inside: for a caller that knows
    the input is finite (a model the fused mix kernel wrote and checked entry by entry)."""
    old = comp.check_finite
    comp.check_finite = False
    try:
        yield
    finally:
        comp.check_finite = old


def check_dtype(x: torch.Tensor, allowed: tuple[torch.dtype, ...], name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise CompressionError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise CompressionError(f"{name}: supports dtypes {names}; got {x.dtype}")
    if x.numel() == 0:
        raise CompressionError(f"{name}: cannot compress an empty tensor")


def check_generator(generator: Any, x: torch.Tensor, name: str) -> None:
    """A randomized compressor needs the caller's randomness: a :class:`gossip.rng.Stream`
    (any device: its draws go where they are asked) or a ``torch.Generator`` on the tensor's
    device (legacy callers; :func:`gossip.rng.as_stream` turns it into a stream)."""
    if generator is None:
        raise CompressionError(
            f"{name} is randomized: pass the node's gossip.rng.Stream (node.rng) or a "
            "torch.Generator to encode(x, generator) (seeded per node, so a run is "
            "reproducible: same seed -> same bytes)"
        )
    if not isinstance(generator, torch.Generator):
        return
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
    docs/performance.md), so model-sized temporaries are allocated once and reused. All
    compressors of a thread share one workspace (:func:`shared_workspace`), so hosting many
    nodes in one process costs one set of temporaries, not one per node. Hence the rule: a
    workspace tensor never outlives the call that took it (never put one in a payload or hand
    it to the caller), and two live temporaries of one call use different tags.
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self._host: dict[tuple[str, torch.dtype], list[Any]] = {}

    def get(self, tag: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A contiguous 1-D tensor of ``numel`` entries (uninitialised, storage offset 0)."""
        key = (tag, dtype, device)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
            self._bufs[key] = buf
        return buf[:numel]

    def pair(self, tag: str, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
        """A CPU scratch of ``numel`` entries as a torch tensor and a numpy array (one memory).

        The views of the last size asked for are kept, so a repeated size costs a dict lookup.
        """
        key = (tag, dtype)
        e = self._host.get(key)
        if e is None or e[0].size < numel:
            full = torch.empty(max(numel, 1), dtype=dtype)
            e = self._host[key] = [full.numpy(), full, -1, None, None]
        if e[2] != numel:
            e[2], e[3], e[4] = numel, e[1][:numel], e[0][:numel]
        return e[3], e[4]

    def host(self, tag: str, numel: int, dtype: torch.dtype) -> np.ndarray:
        """A CPU scratch of ``numel`` entries as a numpy array (see :meth:`pair`)."""
        key = (tag, dtype)
        e = self._host.get(key)
        if e is None or e[0].size < numel:
            return self.pair(tag, numel, dtype)[1]
        if e[2] == numel:
            return e[4]
        return e[0][:numel]

    def clear(self) -> None:
        self._bufs.clear()
        self._host.clear()


_LOCAL = threading.local()


def shared_workspace() -> Workspace:
    """The calling thread's workspace (compressors never run one call across threads)."""
    ws = getattr(_LOCAL, "ws", None)
    if ws is None:
        ws = _LOCAL.ws = Workspace()
    return ws
