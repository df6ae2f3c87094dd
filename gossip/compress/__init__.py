"""Compressors: pure encode/decode of a tensor to one contiguous byte buffer.

Build one from a short spec with :func:`make`::

    c = make("topk:0.01")                    # whole vector
    c = make("sign", layout=layout)          # per tensor of a Layout (one message)
    p = c.encode(x, generator)               # Payload; p.buffer is the wire format
    y = c.decode(c.from_bytes(p.to_bytes(), like=x))

Built-in specs (:func:`available` lists every registered one; ``docs/compressors.md`` gives
the math). A user's own compressor joins with :func:`register_compressor`, or is named on the
command line as ``module:Class[:PARAMS]`` (see ``docs/extending.md``):

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
``vote[:ties]``         sign(x) unscaled; with :ties sign(0) = 0      error not bounded
``qsgd:BITS|s=LEVELS``  QSGD, s = 2^{BITS−1} levels of ‖x‖₂           ω = min(d/s², √d/s)
``qsgd:…:biased``       QSGD / (1 + ω)                                δ = 1/(1+ω)
``lead:BITS``           LEAD's ∞-norm quantizer, s = 2^{BITS−1}       ω ≤ min(d/4^b, √d/2^{b−1})
``natural``             natural compression, 9 bits per entry         ω = 1/8
``lowrank:RANK``        one warm-started PowerSGD step per matrix     —
``SPARSE+VALUES``       a sparsifier's k values sent by another one   δ = δ_S·δ_Q (:mod:`.compose`)
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

import copy
import inspect
from collections.abc import Callable

from gossip.catalog import COMPRESSOR_SPECS, PLUGIN_COMPRESSOR
from gossip.compress.base import Compressor, Payload
from gossip.compress.codec import Codec
from gossip.compress.compose import Composed, compose
from gossip.compress.dense import Bf16, Fp16, Identity
from gossip.compress.dispatch import reference_kernels
from gossip.compress.lowrank import LowRank
from gossip.compress.pertensor import PerTensor
from gossip.compress.quantize import QSGD, LeadQuantizer, Natural
from gossip.compress.rows import GRAIN_SIZE, pack_bits, unpack_bits
from gossip.compress.sign import ScaledSign, ScaledSignL2
from gossip.compress.sparse import RandK, TopK
from gossip.compress.vote import Vote
from gossip.compress.wire import HEADER_NBYTES, KINDS, PER_TENSOR, assigned_kind
from gossip.errors import CompressionError, CompressorSpecError, PluginError
from gossip.layout import Layout
from topologies.registry import Registry, parse_target

__all__ = [
    "CompressionError",
    "Compressor",
    "Codec",
    "Payload",
    "reference_kernels",
    "HEADER_NBYTES",
    "GRAIN_SIZE",
    "pack_bits",
    "unpack_bits",
    "make",
    "available",
    "usage",
    "register_compressor",
    "COMPRESSORS",
    "factory_for",
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
    "Vote",
    "Composed",
]

MAX_LEVELS = 1 << 16

Builder = Callable[..., Compressor]
"""``build(spec, *params) -> Compressor``: ``spec`` the whole spec string, ``params`` the
``:``-separated strings after the name (``"topk:0.01"`` -> ``build("topk:0.01", "0.01")``)."""


class _Compressors(Registry):
    """Compressor builders by name, with their spec ``forms`` and ``usage`` line as metadata;
    an unknown spec's error lists every valid one."""

    def unknown(self, spec: object) -> CompressionError:
        return _bad(spec, f"unknown compressor {str(spec).strip().split(':')[0]!r}"
                          f"{self.suggest(spec)}")


COMPRESSORS = _Compressors("compressor", error=CompressionError, plugin_error=PluginError, normalize=str.lower,
                           takes_params=True, form="module:Class[:PARAMS]")
"""Every compressor builder by name (a :class:`topologies.registry.Registry`); see
:func:`register_compressor`."""
_REGISTRY: dict[str, Builder] = COMPRESSORS.objects
_KIND_CLASS: dict[int, type] = {}
"""Wire kind -> the compressor class whose messages carry it (one class per kind)."""


_ASSIGNED: set[type] = set()
"""The classes whose wire kind the package assigned (:func:`_assign`)."""


def _assign(cls: type) -> None:
    """Give a :class:`Codec` class whose body sets no wire kind one the package chooses
    (:func:`gossip.compress.wire.assigned_kind`, from its module and name). A subclass gets
    its own rather than its parent's: each class its own kind, so their messages are never
    mistaken for each other's."""
    if not (inspect.isclass(cls) and issubclass(cls, Codec)) or "kind" in vars(cls):
        return
    kind = assigned_kind(f"{cls.__module__}.{cls.__qualname__}", _KIND_CLASS)
    cls.kind = kind
    _ASSIGNED.add(cls)


def _claim(kind: object, cls: type, name: str) -> None:
    """Reserve wire ``kind`` for ``cls`` (assigning one first when the class sets none);
    refuse it when another class already uses it."""
    if inspect.isclass(cls) and "kind" not in vars(cls) and isinstance(kind, int):
        _assign(cls)
        kind = cls.kind
    if not isinstance(kind, int) or kind == 0:
        return
    if not 1 <= kind < PER_TENSOR:
        raise CompressionError(f"{name}: wire kind {kind!r} must be an integer in 1..{PER_TENSOR - 1}")
    owner = _KIND_CLASS.get(kind)
    if owner is None:
        _KIND_CLASS[kind] = cls
        KINDS.setdefault(kind, name)
    elif owner is not cls:
        free = [k for k in range(1, PER_TENSOR) if k not in _KIND_CLASS]
        raise CompressionError(
            f"compressor {name!r} ({cls.__name__}): wire kind {kind} is already used by "
            f"{KINDS.get(kind, owner.__name__)!r} ({owner.__name__}), so their messages could be "
            f"mistaken for each other; leave `kind` out of the class (the package assigns a free "
            f"one) or give it another (free: {free[0]}..{free[-1]})"
        )


def register_compressor(
    name: str,
    build: Builder,
    *,
    forms: tuple[str, ...] | list[str] | None = None,
    usage: str | None = None,
    replace: bool = False,
) -> Builder:
    """Make ``make("NAME[:PARAMS]")`` (and every script's ``--compressor``) build ``build``.

    Args:
        name: the spec's name (lower case, no ``:``).
        build: a :class:`Compressor` subclass or a function, called as
            ``build(spec, *params)``; it raises :class:`CompressionError` (or ``ValueError``)
            for bad parameters, with the reason.
        forms: the spec forms it accepts, placeholders in capitals (``("mysign",)``,
            ``("myk:RATIO",)``); default: ``(name,)``.
        usage: one line for error messages and ``--help``; default: the forms joined.
        replace: let ``build`` take ``name`` from another builder. Without it, the same
            ``build`` again is a no-op (a module imported twice; the new ``forms`` and
            ``usage`` are kept) and another one is refused, naming the owner.

    The wire kind of its messages (the header byte that tells a receiver which encoding it
    holds) is assigned by the package when the class sets none (:func:`_assign`: here for a
    class, at the first build for a function or a ``module:Class`` spec). A class that sets
    ``kind`` itself (1..127) keeps it; a kind another class uses is refused, naming the owner
    and the free kinds, since two encodings with one kind could be mistaken for each other.
    Returns ``build``.
    """
    if not isinstance(name, str) or not name or ":" in name or name != name.strip().lower():
        raise CompressionError(f"compressor name {name!r} must be a non-empty lower-case string without ':'")
    if not callable(build):
        raise CompressionError(f"register_compressor({name!r}, ...): build must be callable, got {build!r}")
    COMPRESSORS.check(name, build, replace=replace)
    if inspect.isclass(build):
        _claim(getattr(build, "kind", None), build, name)
    forms = tuple(forms) if forms else (name,)
    return COMPRESSORS.register(name, build, replace=replace, forms=forms, usage=usage or " or ".join(forms))


def _forms_of(name: str) -> tuple[str, ...]:
    return COMPRESSORS.meta(name).get("forms", (name,))


def _usage_of(name: str) -> str:
    return COMPRESSORS.meta(name).get("usage", name)


def available() -> list[str]:
    """The spec forms :func:`make` accepts (placeholders in capitals), built-in and registered."""
    return [form for name in COMPRESSORS for form in _forms_of(name)]


def usage() -> str:
    """One line per registered compressor: how to write its spec (for ``--help`` and errors)."""
    return "; ".join(_usage_of(name) for name in COMPRESSORS) + f"; or {PLUGIN_COMPRESSOR}"


def make(spec: str, layout: Layout | None = None) -> Compressor:
    """Build the compressor ``spec`` names (see :func:`available`; also ``module:Class``).

    With a ``layout`` the compressor is applied per tensor of the layout (one message, one
    header; see :mod:`gossip.compress.pertensor`), and d-dependent constants are exact;
    without one it compresses whatever tensor it is given as a whole (``lowrank`` then needs a
    tensor with ndim > 1: a 1-D tensor is sent raw). Raises :class:`CompressionError` for an
    unknown or malformed spec, listing the valid ones.
    """
    return factory_for(spec, layout)()


def factory_for(compressor: str | Compressor, layout: Layout | None = None) -> Callable[[], Compressor]:
    """A function returning a fresh compressor per call (one per node and message stream).

    ``compressor`` is a spec or an instance (each call then returns an independent deep copy,
    so stateful instances never share memory). With a ``layout``, a :class:`Codec` is applied
    per tensor; other compressors, and those whose entries are encoded each on its own
    (:attr:`Compressor.layout_free`: per tensor they would send the same values), compress the
    flat vector.
    """
    if layout is not None and not isinstance(layout, Layout):
        raise CompressionError(f"layout must be a gossip.layout.Layout, got {type(layout).__name__}")
    if isinstance(compressor, Compressor):
        if "kind" not in vars(type(compressor)):  # a class never registered nor built by spec
            _claim(0, type(compressor), type(compressor).__name__)
        if isinstance(compressor, PerTensor):
            if layout is not None and compressor.layout != layout:
                raise CompressionError(f"{compressor!r} was built for another layout than {layout!r}")
            return lambda: copy.deepcopy(compressor)
        probe = compressor
        single = lambda: copy.deepcopy(compressor)  # noqa: E731
    elif isinstance(compressor, str):
        single = _factory(compressor)
        probe = single()
        if not isinstance(probe, Compressor):
            raise _bad(compressor, f"it built a {type(probe).__name__}, not a gossip Compressor")
    else:
        raise _bad(compressor, f"a spec is a string (or pass a Compressor instance), not a "
                               f"{type(compressor).__name__}")
    if layout is None or not isinstance(probe, Codec) or probe.layout_free:
        return single
    return lambda: PerTensor(single, layout)


def _bad(spec: object, why: str) -> CompressorSpecError:
    return CompressorSpecError(f"bad compressor spec {spec!r}: {why}. Valid specs: {usage()}")


def _factory(spec: str) -> Callable[[], Compressor]:
    spec = spec.strip()
    if "+" in spec:  # SPARSIFIER+VALUES (gossip.compress.compose)
        build = lambda s, *_: compose(s, lambda part: _factory(part)())  # noqa: E731
        return _checked(spec, build, [], None)
    found = COMPRESSORS.resolve(spec)
    if found.name is not None:
        return _checked(spec.lower(), found.obj, list(found.params), found.name)
    cls, target = found.obj, parse_target(spec)
    if not (inspect.isclass(cls) and issubclass(cls, Compressor)):
        raise _bad(spec, f"{target.module}:{target.attr} is not a gossip.compress.Compressor subclass")
    return _checked(spec, cls, list(found.params), cls.__name__)


def _checked(spec: str, build: Builder, params: list[str], name: str | None = None) -> Callable[[], Compressor]:
    """``build(spec, *params)`` as a factory, after one trial call that turns errors into ours
    and checks that a registered builder's compressors use the wire kind it owns."""
    try:
        probe = build(spec, *params)
    except CompressorSpecError:
        raise
    except CompressionError as exc:  # the builder refused its parameters: bad input
        raise CompressorSpecError(str(exc)) from exc
    except (TypeError, ValueError) as exc:
        raise _bad(spec, str(exc)) from exc
    if name is not None and not isinstance(probe, PerTensor):
        _claim(getattr(probe, "kind", None), type(probe), name)
    return lambda: build(spec, *params)


# ---------------------------------------------------------------- built-ins
def _plain(cls: type[Codec]) -> Builder:
    def build(spec: str, *params: str) -> Codec:
        if params:
            raise _bad(spec, f"'{spec.split(':')[0]}' takes no parameters")
        return cls(spec)

    build.__qualname__ = f"_plain({cls.__qualname__})"  # names the owner in 'already registered'
    return build


def _needs(spec: str, params: tuple[str, ...], most: int) -> None:
    name = spec.split(":")[0]
    if not params or not params[0]:
        raise _bad(spec, f"'{name}' needs a parameter: {_usage_of(name)}")
    if len(params) > most:
        raise _bad(spec, f"{name} takes {'one parameter' if most == 1 else f'at most {most} parameters'}")


def _topk(spec: str, *params: str) -> TopK:
    _needs(spec, params, 1)
    ratio, k = _ratio_or_k(spec, params[0])
    return TopK(spec, ratio=ratio, k=k)


def _randk(spec: str, *params: str) -> RandK:
    _needs(spec, params, 2)
    ratio, k = _ratio_or_k(spec, params[0])
    if params[1:] not in ((), ("unbiased",)):
        raise _bad(spec, f"unknown randk option {':'.join(params[1:])!r} (only ':unbiased')")
    return RandK(spec, ratio=ratio, k=k, rescale=len(params) > 1)


def _qsgd(spec: str, *params: str) -> QSGD:
    _needs(spec, params, 2)
    if params[1:] not in ((), ("biased",)):
        raise _bad(spec, f"unknown qsgd option {':'.join(params[1:])!r} (only ':biased')")
    if params[0].startswith("s="):
        s = _int(spec, params[0][2:], "LEVELS")
        if not 1 <= s <= MAX_LEVELS:
            raise _bad(spec, f"levels s = {s} must be in 1..{MAX_LEVELS}")
    else:
        s = 1 << (_bits(spec, params[0]) - 1)
    return QSGD(spec, s, "biased" if len(params) > 1 else "none")


def _lead(spec: str, *params: str) -> LeadQuantizer:
    _needs(spec, params, 1)
    return LeadQuantizer(spec, _bits(spec, params[0]))


def _lowrank(spec: str, *params: str) -> LowRank:
    _needs(spec, params, 1)
    r = _int(spec, params[0], "RANK")
    if r < 1:
        raise _bad(spec, f"rank {r} must be >= 1")
    return LowRank(spec, r)


def _vote(spec: str, *params: str) -> Vote:
    if params not in ((), ("ties",)):
        raise _bad(spec, f"unknown vote option {':'.join(params)!r} (only ':ties')")
    return Vote(spec, ties=bool(params))


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


_BUILTINS: dict[str, tuple[Builder, type[Codec]]] = {
    "none": (_plain(Identity), Identity),
    "fp16": (_plain(Fp16), Fp16),
    "bf16": (_plain(Bf16), Bf16),
    "topk": (_topk, TopK),
    "randk": (_randk, RandK),
    "sign": (_plain(ScaledSign), ScaledSign),
    "sign_l1": (_plain(ScaledSign), ScaledSign),
    "sign_l2": (_plain(ScaledSignL2), ScaledSignL2),
    "qsgd": (_qsgd, QSGD),
    "lead": (_lead, LeadQuantizer),
    "natural": (_plain(Natural), Natural),
    "lowrank": (_lowrank, LowRank),
    "vote": (_vote, Vote),
}
# names, spec forms and usage lines come from gossip.catalog (read by --help without torch)
for _name, (_forms, _usage) in COMPRESSOR_SPECS.items():
    _build, _cls = _BUILTINS[_name]
    _claim(_cls.kind, _cls, _name)
    register_compressor(_name, _build, forms=_forms, usage=_usage, replace=True)
_claim(Composed.kind, Composed, "sparsifier+values")
