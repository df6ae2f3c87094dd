"""Flag values: the argparse ``type=`` converters the scripts share, each refusing a bad value
in one line that says what was expected (``--nodes 0``: "expected a positive integer").

Each converter's docstring is its name in argparse's messages; ``toml_type`` tells
:mod:`gossip.config` which TOML type a run file gives for it. Nothing here imports torch at
import time (``--help`` answers at once)."""

from __future__ import annotations

import argparse
import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
"""The ``--dtype`` choices; :func:`torch_dtype` gives the torch dtype of one."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--dtype`` name (``"float32"`` -> ``torch.float32``)."""
    import torch

    return getattr(torch, name) if name in DTYPE_NAMES else {}[name]


def positive_int(text: str) -> int:
    """a positive integer"""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """a non-negative integer"""
    return _int_at_least(text, 0)


MAX_THREADS = 1024
"""The most torch threads a process may ask for (torch crashes on 10^5)."""


def thread_count(text: str) -> int:
    """a thread count, 1 to MAX_THREADS"""
    value = _int_at_least(text, 1)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_THREADS} threads, got {text!r} (this machine has "
            f"{os.cpu_count() or 1} CPUs; more threads than CPUs only slow a run down)")
    return value


positive_int.toml_type = non_negative_int.toml_type = thread_count.toml_type = int  # type: ignore[attr-defined]


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < low:
        what = "a positive" if low == 1 else "a non-negative"
        raise argparse.ArgumentTypeError(f"expected {what} integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """a positive finite number"""
    return _finite(text, strict=True)


def non_negative_float(text: str) -> float:
    """a non-negative finite number"""
    return _finite(text, strict=False)


positive_float.toml_type = non_negative_float.toml_type = float  # type: ignore[attr-defined]


def _finite(text: str, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value) or value < 0 or (strict and value == 0):
        what = "a positive" if strict else "a non-negative"
        raise argparse.ArgumentTypeError(f"expected {what} finite number, got {text!r}")
    return value


def seconds(text: str) -> float:
    """a positive number of seconds"""
    from gossip.comm.base import check_timeout
    from gossip.errors import CommConfigError

    try:
        return check_timeout(text)
    except CommConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def network_spec(text: str) -> str:
    """a --network spec (gossip.network), returned in its canonical form"""
    from gossip.errors import ConfigError
    from gossip.network import parse_network

    try:
        return parse_network(text).spec()
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def gamma_value(text: str) -> float | str | None:
    """A consensus step, 'auto' for a short grid search, or 'default' (None: the algorithm's
    default, e.g. CHOCO's rule; for one run of a per-run list)."""
    if text == "auto":
        return text
    if text == "default":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"gamma must be a number, 'auto' or 'default', got '{text}'") from None
