"""The run's randomness: counter-based random numbers keyed by (seed, stream, node, round, call,
index), and the whole seeds derived from the run seed (:func:`node_seed`, :func:`data_seed`, ...).

A :class:`Stream` stands for the randomness of ``m`` nodes (row ``r`` = node ``nodes[r]``). Every
value it gives is a pure function of its key, never of a hidden generator state::

    word(seed, stream, node, round, call, i) = fmix64(K + i·G)       (64 bits, index i ≥ 0)
    K = H(H(A ^ round) ^ call),   A = H(H(H(seed) ^ stream) ^ node),   G = H(K ^ c) | 1
    H(x) = fmix64(x + 0x9E3779B97F4A7C15)

with ``fmix64`` SplitMix64's output finalizer (Steele, Lea & Flood 2014; Stafford's "mix13"
constants), all arithmetic mod 2⁶⁴. Consequences:

* **placement independence**: a node draws the same numbers whether it is alone in an MPI rank
  or row r of a block of 1000 nodes, in any order (row r of a draw equals the draw of
  ``row(r)``, a one-node stream, bit for bit);
* **CPU == CUDA**: only integer ops (wrap-around int64 multiplication, shifts made logical by
  masking) until an exact final conversion (a 24-bit integer times 2⁻²⁴ is exact in
  float32), so the bytes are the same on every device; only :meth:`Stream.normal`, which needs
  ``log``/``cos``, is computed in float64 and rounded to the dtype (see there);
* **no state to checkpoint**: the key is (round, call); the engine sets the round
  (:meth:`Stream.begin_round`) and the algorithm's calls in a round are deterministic, so a
  resumed run draws the same numbers without saving anything (hence no
  ``state_dict``/``load_state_dict``).

Why SplitMix64 rather than Philox: Philox4x32-10 needs 32×32→64-bit products, ten rounds and
4-lane shuffles (≈ 150 int64 torch ops per 128 bits); fmix64 is 12 int64 ops per 64 bits,
which is what makes a dither cheaper than ``torch.rand`` (one hashed word gives four 16-bit
dithers). SplitMix64's output passes BigCrush; as a counter-based generator each (key, index)
word is one fmix64 of a distinct-per-stream arithmetic progression ``K + i·G``. The per-key odd
step ``G`` makes two different keys' progressions cross in at most isolated points (rather than
share long runs, as they would with one common step), with probability ≈ n²/2⁶⁴ for two draws
of n words. The key derivation ``H`` chains fmix64, a bijection, so distinct (round, call) of
one node never collide by construction before the last step, and different nodes/seeds collide
only with probability 2⁻⁶⁴.

Words are split into 16- and 32-bit lanes by viewing the int64 tensor as int16/int32; lane
order is the little-endian byte order of every torch platform (x86, ARM, CUDA).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from gossip.errors import ConfigError, ConfigTypeError

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_STEP = 0xD1B54A32D192ED03  # xored into K before hashing the step G


def _s64(v: int) -> int:
    """``v`` mod 2⁶⁴ as a signed int64 (what a torch int64 scalar holds)."""
    v &= _M64
    return v - (1 << 64) if v >> 63 else v


_C1S, _C2S = _s64(_C1), _s64(_C2)


def _fmix(x: Any) -> Any:
    """SplitMix64's finalizer on a Python int or a uint64 array (mod 2⁶⁴): the key derivation,
    in Python ints for a one-node stream (no numpy call per operation)."""
    x = x ^ (x >> 30)
    x = (x * _C1) & _M64
    x = x ^ (x >> 27)
    x = (x * _C2) & _M64
    return x ^ (x >> 31)


def _h(x: Any) -> Any:
    """``H(x) = fmix64(x + 0x9E3779B97F4A7C15)`` on a Python int or a uint64 array."""
    return _fmix((x + _GOLDEN) & _M64)


def _fmix_(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer in place on int64 ``z`` (``t``: a scratch of z's shape).

    torch's ``>>`` on int64 is arithmetic; masking off the sign-extended bits makes it logical.
    """
    torch.bitwise_right_shift(z, 30, out=t)
    t.bitwise_and_((1 << 34) - 1)
    z.bitwise_xor_(t).mul_(_C1S)
    torch.bitwise_right_shift(z, 27, out=t)
    t.bitwise_and_((1 << 37) - 1)
    z.bitwise_xor_(t).mul_(_C2S)
    torch.bitwise_right_shift(z, 31, out=t)
    t.bitwise_and_((1 << 33) - 1)
    return z.bitwise_xor_(t)


def _finalize_np(z: np.ndarray, t: np.ndarray) -> None:
    """The SplitMix64 finalizer on uint64 words ``z`` in place (``t``: scratch of z's shape)."""
    np.right_shift(z, _U30, out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _UC1, out=z)
    np.right_shift(z, _U27, out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _UC2, out=z)
    np.right_shift(z, _U31, out=t)
    np.bitwise_xor(z, t, out=z)


def _hash_np(steps: np.ndarray, base: int, z: np.ndarray, t: np.ndarray) -> None:
    """Words ``z = fmix64(base + steps)`` (uint64; ``t``: scratch of z's size): with
    ``steps = j·G`` and ``base = K + a·G``, words a, a+1, … of the key (K, G)."""
    np.add(steps, np.uint64(base & _M64), out=z)
    _finalize_np(z, t)


def _words_np(k: np.ndarray, g: np.ndarray, z: np.ndarray) -> None:
    """The CPU twin of the torch path in :meth:`Stream.words` (same integers): numpy has
    logical shifts on uint64 and a vectorized 64-bit multiply, ~2x faster than torch's."""
    m, n = z.shape
    idx = _arange_np(n)
    t = _scratch_np(m * n).reshape(m, n)
    if m == 1:
        np.multiply(idx, g[0], out=z[0])
        np.add(z[0], k[0], out=z[0])
    else:
        np.multiply(idx[None, :], g[:, None], out=z)
        np.add(z, k[:, None], out=z)
    _finalize_np(z, t)


_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_UC1, _UC2 = np.uint64(_C1), np.uint64(_C2)


def _arange_np(n: int) -> np.ndarray:
    """``arange(n)`` as uint64 (a cached prefix)."""
    return _arange(n, torch.device("cpu")).numpy().view(np.uint64)


def _scratch_np(numel: int) -> np.ndarray:
    return _scratch("fmix", numel, torch.device("cpu")).numpy().view(np.uint64)


def stream_id(stream: int | str) -> int:
    """The 64-bit id of a named stream (an int is taken mod 2⁶⁴; a str is hashed, stably)."""
    if isinstance(stream, str):
        return int.from_bytes(hashlib.blake2b(stream.encode(), digest_size=8).digest(), "little")
    return int(stream) & _M64


_LOCAL = threading.local()


def _scratch(tag: str, numel: int, device: torch.device) -> torch.Tensor:
    """A thread-local int64 scratch (grown on demand; never outlives a draw)."""
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = {}
    key = (tag, device)
    buf = bufs.get(key)
    if buf is None or buf.numel() < numel:
        buf = bufs[key] = torch.empty(max(numel, 1), dtype=torch.int64, device=device)
    return buf[:numel]


def _arange(n: int, device: torch.device) -> torch.Tensor:
    """``arange(n)`` int64 on ``device`` (a cached prefix)."""
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = {}
    buf = bufs.get(("arange", device))
    if buf is None or buf.numel() < n:
        buf = bufs[("arange", device)] = torch.arange(max(n, 1024), device=device)
    return buf[:n]


#: bits of uniform resolution per float dtype (its significand, so the values are exact)
_UNIFORM_BITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


class Stream:
    """Counter-based random numbers for the nodes ``nodes`` (one row each); see the module doc.

    ``begin_round(t)`` sets the round and resets the call counter; every draw uses the current
    (round, call) and then advances the call counter by one. Draws return [m, n] tensors on the
    requested device, row r bit for bit what ``row(r)`` (a one-node stream for ``nodes[r]`` at
    the same round and call) returns.

    Args:
        seed: the run seed (any int; taken mod 2⁶⁴).
        nodes: the node ids of the rows (a sequence or a 1-D integer tensor).
        stream: which of a node's independent streams (an int or a name, e.g. ``"tracker"``).
    """

    __slots__ = ("seed", "stream", "nodes", "round", "call", "_a")

    def __init__(self, seed: int, nodes: Sequence[int] | torch.Tensor, stream: int | str = 0) -> None:
        if isinstance(nodes, torch.Tensor):
            nodes = nodes.reshape(-1).tolist()
        self.seed = int(seed)
        self.stream = stream
        self.nodes = tuple(map(int, nodes))
        self.round = 0
        self.call = 0
        prefix = _h(_h(self.seed & _M64) ^ stream_id(stream))
        try:  # (10^6 nodes: one conversion, not a Python step per node)
            ids = np.array(self.nodes, dtype=np.int64).view(np.uint64)  # n & 2^64-1 of n < 2^63
        except OverflowError:  # a key of 2^63 or more
            ids = np.array([n & _M64 for n in self.nodes], dtype=np.uint64)
        self._a = _h(ids ^ prefix)  # [m] uint64: the (seed, stream, node) part of the key

    @property
    def m(self) -> int:
        """Number of rows (nodes)."""
        return len(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        nodes = self.nodes if len(self.nodes) <= 4 else f"{self.nodes[:3]}... ({len(self.nodes)} nodes)"
        return (f"Stream(seed={self.seed}, nodes={nodes}, stream={self.stream!r}, "
                f"round={self.round}, call={self.call})")

    # ---------------------------------------------------------------- position
    def begin_round(self, t: int) -> None:
        """Set the round to ``t`` and reset the within-round call counter."""
        self.round = int(t)
        self.call = 0

    def row(self, r: int) -> Stream:
        """A one-node stream for ``nodes[r]`` at the same round and call (a copy; self does not
        advance)."""
        s = Stream.__new__(Stream)
        s.seed, s.stream, s.nodes = self.seed, self.stream, (self.nodes[r],)
        s.round, s.call = self.round, self.call
        s._a = self._a[r : r + 1].copy()
        return s

    def sync(self, other: Stream) -> None:
        """Set self's (round, call) position to ``other``'s."""
        self.round, self.call = other.round, other.call

    # ------------------------------------------------------------------- keys
    def _keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(K, G) of the current (round, call) as [m] int64 arrays; advances the call counter."""
        a = int(self._a[0]) if len(self._a) == 1 else self._a
        k = _h(_h(a ^ (self.round & _M64)) ^ (self.call & _M64))
        g = _h(k ^ _STEP) | 1
        self.call += 1
        return (np.asarray(k, np.uint64).reshape(-1).view(np.int64),
                np.asarray(g, np.uint64).reshape(-1).view(np.int64))

    # ------------------------------------------------------------------ draws
    def words(self, n: int, device: Any = "cpu", *, out: torch.Tensor | None = None) -> torch.Tensor:
        """[m, n] int64 hash words (64 random bits each): word i of row r is
        ``fmix64(K_r + i·G_r)``. ``out``: an optional contiguous int64 buffer of ≥ m·n entries
        the result is a view of."""
        device = torch.device(device)
        k, g = self._keys()
        m = len(k)
        if out is not None and out.dtype == torch.int64 and out.device == device \
                and out.is_contiguous() and out.numel() >= m * n:
            z = out.view(-1)[: m * n].view(m, n)
        else:
            z = torch.empty((m, n), dtype=torch.int64, device=device)
        if m == 0 or n == 0:
            return z
        if device.type == "cpu":
            _words_np(k.view(np.uint64), g.view(np.uint64), z.numpy().view(np.uint64))
            return z
        idx = _arange(n, device)
        if m == 1:  # python scalars: no host-to-device copy
            torch.mul(idx, int(g[0]), out=z[0]).add_(int(k[0]))
        else:
            kt = torch.from_numpy(k).to(device)
            gt = torch.from_numpy(g).to(device)
            torch.mul(idx.unsqueeze(0), gt.unsqueeze(1), out=z).add_(kt.unsqueeze(1))
        _fmix_(z, _scratch("fmix", m * n, device).view(m, n))
        return z

    def bits16(self, n: int, device: Any = "cpu", *, out: torch.Tensor | None = None) -> torch.Tensor:
        """[m, n] int16 of 16 random bits each (a view into ⌈n/4⌉ words per row: lane j of word
        i is entry 4i + j). Read as ``v + 32768`` they are uniform on {0, …, 2¹⁶ − 1}."""
        nw = -(-n // 4)
        return self.words(nw, device, out=out).view(torch.int16)[:, :n]

    def draw16(self, n: int) -> list[Draw16]:
        """What :meth:`bits16` draws (one call), one lazy :class:`Draw16` per row: row r's
        lanes ``a..b−1`` are hashed only when asked for, so a consumer streams a large draw
        through the cache chunk by chunk (CPU, numpy) instead of hashing it all first."""
        k, g = self._keys()
        return [Draw16(n, int(k[r]), int(g[r])) for r in range(len(k))]

    def bits32(self, n: int, device: Any = "cpu", *, out: torch.Tensor | None = None) -> torch.Tensor:
        """[m, n] int32 of 32 random bits each (two per word, as :meth:`bits16`)."""
        nw = -(-n // 2)
        return self.words(nw, device, out=out).view(torch.int32)[:, :n]

    def uniform(self, n: int, *, dtype: torch.dtype = torch.float32, device: Any = "cpu") -> torch.Tensor:
        """[m, n] uniform on [0, 1) with the dtype's full resolution: ``j·2⁻ᵖ``, j uniform on
        {0, …, 2ᵖ − 1}, p = 24 (float32), 53 (float64), 11 (float16), 8 (bfloat16). Exact, so
        identical on every device."""
        p = _UNIFORM_BITS.get(dtype)
        if p is None:
            raise ConfigTypeError(f"uniform: dtype must be a float dtype ({', '.join(map(str, _UNIFORM_BITS))}), "
                                  f"got {dtype}")
        if p <= 24:
            v = self.bits32(n, device)
            j = torch.bitwise_right_shift(v, 32 - p).bitwise_and_((1 << p) - 1)
        else:
            w = self.words(n, device)
            j = torch.bitwise_right_shift(w, 64 - p).bitwise_and_((1 << p) - 1)
        return j.to(dtype).mul_(2.0**-p)

    def normal(self, n: int, *, dtype: torch.dtype = torch.float32, device: Any = "cpu") -> torch.Tensor:
        """[m, n] standard normal (Box–Muller on pairs of 53-bit uniforms).

        Computed in float64 (``log``, ``sqrt``, ``cos``/``sin``) and rounded to ``dtype``. The
        uniforms are identical on every device; the transcendental functions may differ by an
        ulp of float64 between CPU and CUDA libraries, which changes a float32 result only when
        it falls within that ulp of a rounding boundary (probability ~2⁻²⁸ per value).
        """
        half = -(-n // 2)
        w = self.words(2 * half, device).view(-1, half, 2)
        j = torch.bitwise_right_shift(w, 11).bitwise_and_((1 << 53) - 1).to(torch.float64)
        u1 = j[..., 0].add_(1.0).mul_(2.0**-53)  # (0, 1]: log is finite
        theta = j[..., 1].mul_(2.0**-53 * 2.0 * math.pi)
        r = u1.log_().mul_(-2.0).sqrt_()
        z = torch.empty(w.shape[0], half, 2, dtype=torch.float64, device=w.device)
        torch.mul(r, torch.cos(theta), out=z[..., 0])
        torch.mul(r, torch.sin(theta), out=z[..., 1])
        return z.view(w.shape[0], 2 * half)[:, :n].to(dtype)

    def seeds(self, device: Any = "cpu") -> torch.Tensor:
        """[m] non-negative int64 seeds (63 random bits each): one word per row."""
        return self.words(1, device)[:, 0].bitwise_and_((1 << 63) - 1)

    def generator(self, device: Any = "cpu") -> torch.Generator:
        """A ``torch.Generator`` on ``device`` seeded with this draw's seed (one-node streams):
        for code written against torch generators (a user's compressor)."""
        if len(self.nodes) != 1:
            raise ConfigError(f"generator(): a torch.Generator serves one node, this stream draws for "
                              f"{len(self.nodes)}; take one node's stream with row(r) first")
        gen = torch.Generator(device=device)
        gen.manual_seed(int(self.seeds()[0]))
        return gen


class Draw16:
    """One row's 16-bit draw of ``n`` lanes (``bits16(n)[r]`` of the stream that made it),
    computed on demand: :meth:`lanes` hashes only the words of the asked range, :meth:`chunks`
    the whole draw a cache-sized chunk at a time.

    Made by :meth:`Stream.draw16`, or wrapping lanes already drawn (``given``, a [n] int16
    tensor, e.g. a row of a batched :meth:`Stream.bits16`).
    """

    __slots__ = ("n", "_k", "_g", "_given")

    def __init__(self, n: int, k: int = 0, g: int = 1, given: torch.Tensor | None = None) -> None:
        self.n = int(n)
        self._k, self._g = k & _M64, g & _M64
        self._given = given

    @property
    def key(self) -> tuple[int, int] | None:
        """``(K, G)``: lane i is 16-bit lane i % 4 of ``fmix64(K + (i // 4)·G)`` (for a kernel
        that hashes the words itself); None when the lanes were given."""
        return None if self._given is not None else (self._k, self._g)

    def lanes(self, a: int, b: int) -> np.ndarray:
        """Lanes ``a..b−1`` as a numpy int16 array (CPU): a view of a thread-local scratch,
        valid until the next ``lanes`` call of this thread (or of ``given``). A consumer of the
        whole draw streams it with :meth:`chunks` instead."""
        if self._given is not None:
            return self._given[a:b].numpy()
        wa, wb = a // 4, -(-b // 4)
        nw = wb - wa
        buf = _scratch("draw16", 2 * nw, torch.device("cpu")).numpy().view(np.uint64)
        z, t = buf[:nw], buf[nw:]
        np.multiply(_arange_np(wb)[wa:], np.uint64(self._g), out=z)
        _hash_np(z, self._k, z, t)
        off = a - 4 * wa
        return z.view(np.int16)[off : off + b - a]

    def chunks(self, step: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(a, b, lanes a..b−1)`` for a = 0, step, 2·step, … (``step`` a multiple of 4): the
        whole draw streamed through the cache, each chunk hashed right before its consumer reads
        it (CPU, numpy int16 views of a thread-local scratch, each valid until the next chunk
        of any draw of this thread).
        One progression j·G per draw and three chunk-sized buffers, so a chunk costs the nine
        word passes of :func:`_hash_np` and no allocation."""
        if step <= 0 or step % 4:
            raise ConfigError(f"Draw16.chunks: step must be a positive multiple of 4, got {step}")
        n = self.n
        if self._given is not None:
            given = self._given.numpy()
            for a in range(0, n, step):
                yield a, min(a + step, n), given[a : a + step]
            return
        nw = min(step, n + 3) // 4
        buf = _scratch("draw16.chunks", 3 * nw, torch.device("cpu")).numpy().view(np.uint64)
        steps, z, t = buf[:nw], buf[nw : 2 * nw], buf[2 * nw :]
        np.multiply(_arange_np(nw), np.uint64(self._g), out=steps)
        for a in range(0, n, step):
            b = min(a + step, n)
            m = -(-(b - a) // 4)
            _hash_np(steps[:m], self._k + a // 4 * self._g, z[:m], t[:m])
            yield a, b, z.view(np.int16)[: b - a]

    def tensor(self, device: Any = "cpu") -> torch.Tensor:
        """All ``n`` lanes as a [1, n] int16 tensor on ``device`` (what ``bits16(n)`` gives)."""
        device = torch.device(device)
        if self._given is not None:
            return self._given.view(1, -1).to(device)
        if device.type == "cpu":
            return torch.from_numpy(self.lanes(0, self.n).copy()).view(1, -1)
        nw = -(-self.n // 4)
        z = _arange(nw, device).mul(_s64(self._g)).add_(_s64(self._k))
        _fmix_(z, torch.empty_like(z))
        return z.view(torch.int16)[: self.n].view(1, -1)


def as_generator(rng: Any, device: Any = "cpu") -> Any:
    """The reverse of :func:`as_stream` for legacy code: a one-node Stream becomes a
    ``torch.Generator`` on ``device`` seeded from its next draw; anything else passes."""
    if isinstance(rng, Stream):
        return rng.generator(device)
    return rng


def as_stream(generator: Any) -> Stream | None:
    """A :class:`Stream` for what a caller passed as randomness.

    A Stream passes through; a ``torch.Generator`` (legacy callers, user code) becomes a
    one-node Stream (node 0, stream 0, round 0) whose seed is drawn from the generator, so the
    same generator state gives the same stream and the generator advances; None stays None.
    """
    if generator is None or isinstance(generator, Stream):
        return generator
    if isinstance(generator, torch.Generator):
        seed = int(torch.randint(0, (1 << 63) - 1, (1,), generator=generator, device=generator.device))
        return Stream(seed, (0,))
    raise ConfigTypeError(f"expected a gossip.rng.Stream, a torch.Generator or None as randomness, got "
                          f"{type(generator).__name__}")


# ---------------------------------------------------------------- seeds of the run seed
# Whole seeds, each a pure function of (run seed, purpose, node id), never of the MPI layout:
# what keeps an MPI run and an in-process run equal. The purposes are fixed numbers: changing
# one changes every run's numbers. The engine's (node, init) and the training side's (model,
# data, split, partition, oracle) purposes are disjoint, so adding data shuffling or a model
# never shifts a compressor's randomness.
_NODE, _INIT = 1, 3
_MODEL, _DATA, _SPLIT, _PARTITION, _ORACLE, _QUANTIZE = 11, 12, 13, 14, 15, 16


def derive(*words: int) -> int:
    """A 63-bit seed from non-negative integers (``numpy.random.SeedSequence``)."""
    state = np.random.SeedSequence([int(w) for w in words]).generate_state(1, np.uint64)[0]
    return int(state >> 1)


_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4


def _words32(value: int) -> list[int]:
    """``value`` as SeedSequence reads an int: its 32-bit words, least significant first."""
    words = [value & 0xFFFFFFFF]
    value >>= 32
    while value:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
    return words


def derive_many(prefix: Sequence[int], last: Any) -> np.ndarray:
    """``[derive(*prefix, v) for v in last]`` as one uint64 array, without a Python loop.

    :func:`derive`'s ``numpy.random.SeedSequence`` hash (numpy's ``mix_entropy`` and
    ``generate_state``, pool of 4 words) written over arrays of uint32 lanes, so a block's
    10⁶ node seeds take milliseconds instead of a minute; every ``last`` value must be
    below 2³² (node ids), and ``tests/engine/test_seeds.py`` checks it equals :func:`derive`."""
    last = np.asarray(last, dtype=np.uint64)
    if last.size and int(last.max()) >= 1 << 32:
        raise ConfigError("derive_many: the varying word must be below 2**32 (a node id)")
    head = [w for v in prefix for w in _words32(int(v))]
    count = last.size
    entropy = [np.full(count, w, dtype=np.uint32) for w in head] + [last.astype(np.uint32)]
    with np.errstate(over="ignore"):
        hash_const = [np.uint32(_INIT_A)]

        def hashmix(value: np.ndarray) -> np.ndarray:
            value = value ^ hash_const[0]
            hash_const[0] = np.uint32(int(hash_const[0]) * _MULT_A & 0xFFFFFFFF)
            value = value * hash_const[0]
            return value ^ (value >> np.uint32(16))

        def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            result = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
            return result ^ (result >> np.uint32(16))

        zero = np.zeros(count, dtype=np.uint32)
        pool = [hashmix(entropy[i] if i < len(entropy) else zero) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(_POOL, len(entropy)):
            for dst in range(_POOL):
                pool[dst] = mix(pool[dst], hashmix(entropy[src]))
        const, state = _INIT_B, []
        for i in range(2):  # one uint64 = two uint32 words, little-endian
            value = pool[i] ^ np.uint32(const)
            const = const * _MULT_B & 0xFFFFFFFF
            value = value * np.uint32(const)
            state.append(value ^ (value >> np.uint32(16)))
    word = state[0].astype(np.uint64) | (state[1].astype(np.uint64) << np.uint64(32))
    return word >> np.uint64(1)


def node_seeds(seed: int, nodes: Any) -> np.ndarray:
    """:func:`node_seed` of every node of ``nodes`` (uint64 array; vectorized)."""
    return derive_many((seed, _NODE), nodes)


def init_seeds(seed: int, nodes: Any) -> np.ndarray:
    """:func:`init_seed` of every node of ``nodes`` (uint64 array; vectorized)."""
    return derive_many((seed, _INIT), nodes)


def node_seed(seed: int, node: int) -> int:
    """Seed of node ``node``'s private generator (compressor dither, sample draws)."""
    return derive(seed, _NODE, node)


def init_seed(seed: int, node: int) -> int:
    """Seed for drawing node ``node``'s initial vector (separate from its run-time stream)."""
    return derive(seed, _INIT, node)


def model_seed(seed: int) -> int:
    """Seed for initialising the model (the same initial model on every node and process)."""
    return derive(seed, _MODEL)


def data_seed(seed: int, node: int) -> int:
    """Seed of node ``node``'s mini-batch shuffling."""
    return derive(seed, _DATA, node)


def split_seed(seed: int) -> int:
    """Seed of the train/test split of a built-in data set."""
    return derive(seed, _SPLIT)


def partition_seed(seed: int) -> int:
    """Seed of the split of the training set over the nodes."""
    return derive(seed, _PARTITION)


def oracle_seed(seed: int, node: int) -> int:
    """Seed of node ``node``'s private state of torch's global generator (its model's dropout)."""
    return derive(seed, _ORACLE, node)


def quantize_seed(oracle: int) -> int:
    """Seed of the stochastic rounding of a node's 8-bit compute, from its :func:`oracle_seed`
    (a stream apart from the node's dropout draws; docs/low-precision.md)."""
    return derive(oracle, _QUANTIZE)


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


__all__ = ["Stream", "Draw16", "as_stream", "as_generator", "stream_id", "derive", "node_seed",
           "init_seed", "node_seeds", "init_seeds", "derive_many",
           "model_seed", "data_seed", "split_seed", "partition_seed", "oracle_seed",
           "quantize_seed", "generator"]
