"""Compressors: pure encode/decode of a tensor to one contiguous byte buffer.

Build one from a short spec with :func:`make`::

    c = make("topk:0.01")                    # whole vector
    c = make("sign", layout=layout)          # per tensor of a Layout (one message)
    p = c.encode(x, generator)               # Payload; p.buffer is the wire format
    y = c.decode(c.from_bytes(p.to_bytes(), like=x))

Specs (:func:`available`):

======================  ============================================  ==========================
spec                    what                                          constant
======================  ============================================  ==========================
``none``                identity (float32/float64 as given)           ω = 0
``fp16`` / ``bf16``     round to a 16-bit float                       δ ≈ 1
``topk:RATIO|K``        k largest |x_i|, k = max(1, ⌊RATIO·d⌋) or K   δ = k/d
``randk:RATIO|K``       k uniform coordinates (seed on the wire)      δ = k/d
``randk:…:unbiased``    the same × d/k                                ω = d/k − 1
``sign``                (‖x‖₁/d)·sign(x), 1 bit per entry             δ ≥ 1/d
``sign_l1``             the same as ``sign`` (named beside ``sign_l2``)
``sign_l2``             (‖x‖₂/√d)·sign(x) (1-bit Adam's scale)        not contractive
``qsgd:BITS|s=LEVELS``  QSGD, s = 2^{BITS−1} levels of ‖x‖₂           ω = min(d/s², √d/s)
``qsgd:…:biased``       QSGD / (1 + ω)                                δ = 1/(1+ω)
``lead:BITS``           LEAD's ∞-norm quantizer, s = 2^{BITS−1}       ω ≤ min(d/4^b, √d/2^{b−1})
``natural``             natural compression, 9 bits per entry         ω = 1/8
``lowrank:RANK``        one warm-started PowerSGD step per matrix     —
======================  ============================================  ==========================

Constants that depend on d are None on a compressor built without a layout (use
``omega_for(d)`` / ``delta_for(d)``); with a layout they are exact (worst tensor).

Wire format (:mod:`.wire`): one contiguous uint8 buffer per message, an 8-byte header then
aligned typed sections; every size is fixed by the tensor's shape and dtype
(``fixed_nbytes(like) == max_nbytes(like) == payload.nbytes``). ``from_bytes`` checks header,
exact length and body (index ranges, bitmap counts, codes) and raises
:class:`CompressionError` naming the problem.

Devices: everything is torch ops on the tensor's device; CPU float32/float64 tensors take a
numpy fast path (header, sections, selection, bit packing, validation and decoding in numpy;
random draws and the reductions whose value travels still in torch) that produces the same
bytes and decoded values, at a few µs of fixed cost per call (see :mod:`.codec`). Host
syncs that remain on CUDA: the NaN/Inf check (one scalar per encode; ``check_finite = False``
removes it), top-k's candidate count, rand-k's seed (its indices are drawn on the CPU), the
low-rank collapse test, and ``from_bytes``'s header and body checks.

Memory: temporaries live in a per-thread workspace shared by all compressors
(:class:`.checks.Workspace`), so many nodes in one process share one set.
"""

from __future__ import annotations

from collections.abc import Callable

from gossip.compress.base import CompressionError, Compressor, Payload
from gossip.compress.codec import Codec
from gossip.compress.dense import Bf16, Fp16, Identity
from gossip.compress.lowrank import LowRank
from gossip.compress.pertensor import PerTensor
from gossip.compress.quantize import QSGD, LeadQuantizer, Natural
from gossip.compress.sign import ScaledSign, ScaledSignL2
from gossip.compress.sparse import RandK, TopK
from gossip.layout import Layout

__all__ = [
    "CompressionError",
    "Compressor",
    "Payload",
    "make",
    "available",
    "Identity",
    "Fp16",
    "Bf16",
    "TopK",
    "RandK",
    "ScaledSign",
    "ScaledSignL2",
    "QSGD",
    "LeadQuantizer",
    "Natural",
    "LowRank",
    "PerTensor",
]

_FORMS = {
    "none": "none",
    "fp16": "fp16",
    "bf16": "bf16",
    "topk": "topk:RATIO (0 < RATIO <= 1, e.g. topk:0.01) or topk:K (integer K >= 1)",
    "randk": "randk:RATIO or randk:K, optionally :unbiased (e.g. randk:0.01:unbiased)",
    "sign": "sign",
    "sign_l1": "sign_l1",
    "sign_l2": "sign_l2",
    "qsgd": "qsgd:BITS (1..16, also '4bit') or qsgd:s=LEVELS (1..65536), optionally :biased",
    "lead": "lead:BITS (1..16, also '2bit')",
    "natural": "natural",
    "lowrank": "lowrank:RANK (integer RANK >= 1)",
}
MAX_LEVELS = 1 << 16


def available() -> list[str]:
    """The spec forms :func:`make` accepts (placeholders in capitals)."""
    return [
        "none",
        "fp16",
        "bf16",
        "topk:RATIO",
        "topk:K",
        "randk:RATIO",
        "randk:K",
        "randk:RATIO:unbiased",
        "randk:K:unbiased",
        "sign",
        "sign_l1",
        "sign_l2",
        "qsgd:BITS",
        "qsgd:s=LEVELS",
        "qsgd:BITS:biased",
        "qsgd:s=LEVELS:biased",
        "lead:BITS",
        "natural",
        "lowrank:RANK",
    ]


def make(spec: str, layout: Layout | None = None) -> Compressor:
    """Build the compressor ``spec`` names (see :func:`available`).

    With a ``layout`` the compressor is applied per tensor of the layout (one message, one
    header; see :mod:`gossip.compress.pertensor`), and d-dependent constants are exact;
    without one it compresses whatever tensor it is given as a whole (``lowrank`` then needs a
    tensor with ndim > 1: a 1-D tensor is sent raw). Raises :class:`CompressionError` for an
    unknown or malformed spec, listing the valid ones.
    """
    factory = _factory(spec)
    if layout is None:
        return factory()
    if not isinstance(layout, Layout):
        raise CompressionError(
            f"layout must be a gossip.layout.Layout, got {type(layout).__name__}"
        )
    return PerTensor(factory, layout)


def _bad(spec: object, why: str) -> CompressionError:
    forms = "; ".join(_FORMS.values())
    return CompressionError(f"bad compressor spec {spec!r}: {why}. Valid specs: {forms}")


def _factory(spec: str) -> Callable[[], Codec]:
    if not isinstance(spec, str):
        raise _bad(spec, "a spec is a string")
    norm = spec.strip().lower()
    name, *args = norm.split(":")
    if name not in _FORMS:
        raise _bad(spec, f"unknown compressor {name!r}")
    if name in ("none", "fp16", "bf16", "sign", "sign_l1", "sign_l2", "natural"):
        if args:
            raise _bad(spec, f"'{name}' takes no parameters")
        cls = {"none": Identity, "fp16": Fp16, "bf16": Bf16, "sign": ScaledSign,
               "sign_l1": ScaledSign, "sign_l2": ScaledSignL2, "natural": Natural}
        return lambda: cls[name](norm)
    if not args or not args[0]:
        raise _bad(spec, f"'{name}' needs a parameter: {_FORMS[name]}")
    if name in ("topk", "randk"):
        ratio, k = _ratio_or_k(spec, args[0])
        flags = args[1:]
        if name == "topk":
            if flags:
                raise _bad(spec, "topk takes one parameter")
            return lambda: TopK(norm, ratio=ratio, k=k)
        if flags not in ([], ["unbiased"]):
            raise _bad(spec, f"unknown randk option {':'.join(flags)!r} (only ':unbiased')")
        return lambda: RandK(norm, ratio=ratio, k=k, rescale=bool(flags))
    if name == "qsgd":
        flags = args[1:]
        if flags not in ([], ["biased"]):
            raise _bad(spec, f"unknown qsgd option {':'.join(flags)!r} (only ':biased')")
        if args[0].startswith("s="):
            s = _int(spec, args[0][2:], "LEVELS")
            if not 1 <= s <= MAX_LEVELS:
                raise _bad(spec, f"levels s = {s} must be in 1..{MAX_LEVELS}")
        else:
            s = 1 << (_bits(spec, args[0]) - 1)
        scale = "biased" if flags else "none"
        return lambda: QSGD(norm, s, scale)
    if name == "lead":
        if len(args) > 1:
            raise _bad(spec, "lead takes one parameter")
        b = _bits(spec, args[0])
        return lambda: LeadQuantizer(norm, b)
    # lowrank
    if len(args) > 1:
        raise _bad(spec, "lowrank takes one parameter")
    r = _int(spec, args[0], "RANK")
    if r < 1:
        raise _bad(spec, f"rank {r} must be >= 1")
    return lambda: LowRank(norm, r)


def _int(spec: str, text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad(spec, f"{what} {text!r} is not an integer") from None


def _bits(spec: str, text: str) -> int:
    t = text[:-4] if text.endswith("bits") else text[:-3] if text.endswith("bit") else text
    b = _int(spec, t, "BITS")
    if not 1 <= b <= 16:
        raise _bad(spec, f"bits = {b} must be in 1..16")
    return b


def _ratio_or_k(spec: str, text: str) -> tuple[float | None, int | None]:
    """``"0.01"`` -> ratio, ``"20"`` -> K (an integer without a dot or exponent is a count)."""
    if text.isdigit():
        k = int(text)
        if k < 1:
            raise _bad(spec, f"K = {k} must be >= 1")
        return None, k
    try:
        r = float(text)
    except ValueError:
        raise _bad(spec, f"{text!r} is neither a ratio nor an integer count") from None
    if not 0.0 < r <= 1.0:  # also rejects NaN
        raise _bad(spec, f"ratio {r} must be in (0, 1]")
    return r, None
