"""Virtual-time draws of a ``--network`` spec's timing models (docs/network.md).

:class:`Timing` answers, for an event run (or a synchronous round's clock), how long a node's
k-th local step takes, how long the k-th message on an arc travels, whether it is lost, which
nodes are stragglers and when a node is away. Every value is a pure function of
(seed, node or arc, counter) through :class:`gossip.rng.Stream`, so any process computes the
same values in any order (placement independence), and nothing needs checkpointing.

The keys (``B = BLOCK = 256``; an arc ``i → j`` is the row ``i << 32 | j``, as
:func:`gossip.network.arc_keys`; "draw k" of a row is entry ``k % B`` of the row's draw at
(round ``k // B``, call 0) of the named stream):

* ``compute_s(i, k)``: draw k of stream ``"network.compute"``, row i, turned into seconds by the
  ``compute=`` distribution (uniform ``u`` of :meth:`Stream.uniform` in float64: exp
  ``−mean·log(1−u)``, uniform ``lo + (hi−lo)·u``; lognormal ``median·exp(σ·z)`` with z of
  :meth:`Stream.normal`: its Box–Muller on the same words, in numpy, equal to an ulp), times
  FACTOR on a slow node. No ``compute=``: 1 s, no draw.
* ``delay_s(i, j, k)``: draw k of stream ``"network.delay"``, row ``i << 32 | j``, by the
  ``delay=`` distribution (default 0 s).
* ``lost(i, j, k)``: Bernoulli(p): lost when draw k (uniform) of ``"network.loss.event"`` is
  ``< p``. Gilbert-Elliott: the arc's chain is stepped once per *message* (not per round): its
  state s_0 before message 1 is bad when draw 0 of ``"network.ge.event"`` is ``< π``, then
  s_k follows from s_{k−1} with draw k of ``"network.ge.event"`` (good → bad when ``< p_gb``,
  bad → good when ``< p_bg``), and message k is lost when draw k of ``"network.loss.event"`` is
  ``< loss_bad`` (state bad) or ``< loss_good`` (good). (Synchronous rounds draw their losses
  per round and phase from ``"network.loss"`` instead: :class:`gossip.network.LossDraws`.)
* ``slow_nodes``: ``slow=nodes:...`` as given; ``slow=FRACTIONxFACTOR``: the ⌈FRACTION·n⌉
  nodes with the smallest uniform ``u_i`` = draw 0 of stream ``"network.slow"``, row i (ties,
  which have probability ~2⁻⁵³, by node id).
* rate churn: node i is up from time 0; its m-th up-time (m = 1, 2, …) is draw 2m − 1 and its
  m-th away-time draw 2m of stream ``"network.churn"``, row i, both exponential (means 1/R and
  mean_away): it leaves at ``back_{m−1} + up_m`` (``back_0 = 0``) and comes back
  ``away_m`` later. The intervals are drawn lazily, as far as the times asked for.

Draws are made many counters of a row at once (a first chunk of 32, then blocks of B) and
cached (the latest of each row), so a scalar call costs under a microsecond amortized when a
row is asked for many counters, under two when each of many rows is asked for a few
(docs/network.md has the measured costs).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gossip.errors import ConfigError
from gossip.network.spec import Bernoulli, Exponential, Fixed, LogNormal, Network
from gossip.rng import _M64, _STEP, Stream, _finalize_np, _h, stream_id

BLOCK = 256
"""Counters drawn at once per row (and cached)."""
_SHIFT = 8  # BLOCK == 1 << _SHIFT
_MASK = BLOCK - 1


_IDX = np.arange(BLOCK, dtype=np.uint64)
_U11 = np.uint64(11)


@functools.lru_cache(maxsize=64)
def _prefix(seed: int, name: str) -> int:
    """The (seed, stream) part of a row's key (:class:`gossip.rng.Stream`)."""
    return _h(_h(seed & _M64) ^ stream_id(name))


def _words(seed: int, name: str, rows: list[int], b: int, start: int = 0,
           count: int = BLOCK) -> np.ndarray:
    """[len(rows), count] uint64: words ``start … start + count − 1`` of ``Stream(seed, rows,
    name)`` at (round b, call 0), bit for bit (:meth:`gossip.rng.Stream.words`), computed in
    numpy without the Stream object (a fraction of its cost for one row)."""
    prefix = _prefix(seed, name)
    if len(rows) == 1:
        a = _h((rows[0] & _M64) ^ prefix)
        k = _h(_h(a ^ (b & _M64)) ^ 0)
        g = _h(k ^ _STEP) | 1
        z = _IDX[start : start + count] * np.uint64(g)
        z += np.uint64(k)
        z = z.reshape(1, count)
    else:
        a = _h(np.array([r & _M64 for r in rows], dtype=np.uint64) ^ np.uint64(prefix))
        k = _h(_h(a ^ np.uint64(b & _M64)) ^ np.uint64(0))
        g = _h(k ^ np.uint64(_STEP)) | np.uint64(1)
        z = _IDX[None, start : start + count] * g[:, None] + k[:, None]
    _finalize_np(z, np.empty_like(z))
    return z


def _uniforms(seed: int, name: str, rows: list[int], b: int, start: int = 0,
              count: int = BLOCK) -> np.ndarray:
    """[len(rows), count] float64 uniforms on [0, 1): entries ``start …`` of
    ``Stream.uniform(BLOCK, float64)`` at (round b, call 0), bit for bit (``(word >> 11) · 2⁻⁵³``)."""
    return (_words(seed, name, rows, b, start, count) >> _U11).astype(np.float64) * 2.0**-53


def _normals(seed: int, name: str, rows: list[int], b: int, start: int = 0,
             count: int = BLOCK) -> np.ndarray:
    """[len(rows), count] standard normals (``start``, ``count`` even): entries ``start …`` of
    ``Stream.normal(BLOCK, float64)`` at (round b, call 0), the same Box-Muller on the same
    words (numpy's log/cos: equal to an ulp)."""
    w = _words(seed, name, rows, b, start, count).reshape(len(rows), count // 2, 2)
    j = (w >> _U11).astype(np.float64)
    r = np.sqrt(-2.0 * np.log((j[..., 0] + 1.0) * 2.0**-53))
    theta = j[..., 1] * (2.0**-53 * 2.0 * math.pi)
    return np.stack([r * np.cos(theta), r * np.sin(theta)], axis=-1).reshape(len(rows), count)


def _values(dist: Any, seed: int, name: str, rows: list[int], b: int, start: int = 0,
            count: int = BLOCK) -> np.ndarray:
    """[len(rows), count] durations of ``dist`` (None: the raw uniforms), entries ``start …``
    of block b (``start`` and ``count`` even)."""
    if isinstance(dist, Fixed):
        return np.full((len(rows), count), dist.seconds)
    if isinstance(dist, LogNormal):
        return dist.median * np.exp(dist.sigma * _normals(seed, name, rows, b, start, count))
    u = _uniforms(seed, name, rows, b, start, count)
    if dist is None:
        return u
    if isinstance(dist, Exponential):
        return -dist.mean * np.log1p(-u)
    return dist.lo + (dist.hi - dist.lo) * u


FIRST = 32
"""Draws of a row's first fill (then whole blocks): a row asked for a few counters only (one
of many arcs that carry few messages) costs a chunk, not a block."""


class KeyedDraws:
    """Keyed draws of one stream and distribution (``dist`` None: uniforms on [0, 1)), one at a
    time by :meth:`value` ``(row, k)``, cached per row as ``(lo, hi, values)``:
    draws lo … hi − 1 of the row (module doc: draw k is entry k % BLOCK of block k // BLOCK).
    A row's first fill is the FIRST-aligned chunk around the counter asked for, later ones the
    ``chunk``-aligned chunk (default the whole block); only the latest fill of each row is kept.
    A stream of 10⁶ rows each asked a few counters a sweep (an asynchronous run's clocks and
    peers) takes ``chunk=FIRST``: 256 bytes a row instead of 2 KiB once past FIRST draws."""

    __slots__ = ("seed", "name", "dist", "cache", "chunk")

    def __init__(self, seed: int, name: str, dist: Any, chunk: int = BLOCK) -> None:
        if chunk < FIRST or BLOCK % chunk:
            raise ValueError(f"chunk must divide {BLOCK} and be at least {FIRST}, got {chunk}")
        self.seed, self.name, self.dist, self.chunk = seed, name, dist, chunk
        self.cache: dict[int, tuple[int, int, np.ndarray]] = {}

    def make(self, rows: list[int], b: int, start: int = 0, count: int = BLOCK) -> np.ndarray:
        """[len(rows), count] values ``start …`` of block ``b`` (not cached)."""
        return _values(self.dist, self.seed, self.name, rows, b, start, count)

    def fill(self, row: int, k: int) -> tuple[int, int, np.ndarray]:
        """Draw (and cache) the chunk or block of ``row`` that holds counter ``k``."""
        b = k >> _SHIFT
        size = self.chunk if row in self.cache else FIRST
        start, count = (k & _MASK) & -size, size
        lo = (b << _SHIFT) + start
        hit = self.cache[row] = (lo, lo + count, self.make([row], b, start, count)[0])
        return hit

    def prefill(self, rows: Sequence[int], k: int, chunk: int = 1 << 16) -> None:
        """Fill, for each of ``rows`` not drawn yet, the chunk :meth:`fill` would draw first
        for counter ``k`` (the same numbers), ``chunk`` rows per vectorized draw: a loop that
        asks every node's first draws in turn (a sweep of an asynchronous run) would pay one
        small draw per row."""
        todo = [r for r in rows if r not in self.cache]
        b = k >> _SHIFT
        start = (k & _MASK) & -FIRST
        lo = (b << _SHIFT) + start
        for c in range(0, len(todo), chunk):
            part = todo[c:c + chunk]
            for r, values in zip(part, self.make(part, b, start, FIRST), strict=True):
                self.cache[r] = (lo, lo + FIRST, values)

    def value(self, row: int, k: int) -> float:
        hit = self.cache.get(row)
        if hit is None or not hit[0] <= k < hit[1]:
            hit = self.fill(row, k)
        return float(hit[2][k - hit[0]])


Z_MAX = math.sqrt(2.0 * 53.0 * math.log(2.0))
"""The largest |z| :func:`_normals` draws (Box-Muller of a 53-bit uniform): ≈ 8.57."""
E_MAX = 53.0 * math.log(2.0)
"""The largest ``−log(1−u)`` of a 53-bit uniform u: ≈ 36.7 means."""
_LOG_MAX = math.log(np.finfo(np.float64).max)


def _log_largest(dist: Any) -> float:
    """log of the largest value ``dist`` draws, or of its mean when larger (-inf for 0)."""
    if isinstance(dist, Fixed):
        top = dist.seconds
    elif isinstance(dist, Exponential):
        top = dist.mean * E_MAX
    elif isinstance(dist, LogNormal):
        if dist.median == 0.0:
            return -math.inf
        return math.log(dist.median) + max(dist.sigma * Z_MAX, 0.5 * dist.sigma**2)
    else:  # uniform
        top = dist.hi
    return math.log(top) if top > 0.0 else -math.inf


def check_finite(network: Network) -> None:
    """Refuse (:class:`ConfigError`, one line) a ``compute=`` or ``delay=`` distribution whose
    largest draw (times a straggler's factor) or mean is past the largest float: its draws
    would be infinite (and numpy would warn of an overflow at each one)."""
    slow = network.slow.factor if network.slow is not None else 1.0
    for model, factor in (("compute", slow), ("delay", 1.0)):
        dist = getattr(network, model)
        if dist is None or _log_largest(dist) + math.log(factor) < _LOG_MAX:
            continue
        fix = "give smaller values"
        if isinstance(dist, LogNormal):
            room = _LOG_MAX - math.log(factor) - math.log(dist.median)
            bound = min(room / Z_MAX, math.sqrt(2.0 * room)) if room > 0 else 0.0
            fix = f"give a SIGMA of at most {math.floor(bound * 10) / 10:g} with this median"
        scaled = f", times the slow factor {factor:g}," if factor != 1.0 else ""
        raise ConfigError(
            f"--network {network.spec()}: {model}={dist.spec()} draws values{scaled} past the "
            f"largest float ({np.finfo(np.float64).max:.3g} s), so its times would be infinite; "
            f"{fix}")


class Timing:
    """The virtual-time draws of ``network`` for a run of ``n`` nodes with seed ``seed``
    (module doc: every value a pure function of (seed, node or arc, counter)).

    Refuses (:meth:`Network.check`) a slow or churning node that does not exist, and a churn
    schedule under which every node is away at some time; and (:func:`check_finite`) a
    distribution whose draws or mean pass the largest float."""

    def __init__(self, network: Network, seed: int, n: int) -> None:
        network.check(n)
        check_finite(network)
        self.network, self.seed, self.n = network, int(seed), int(n)
        factor = np.ones(n)
        slow = network.slow
        self.slow_nodes: list[int] = []
        """The stragglers, sorted (their compute times are FACTOR times longer)."""
        if slow is not None:
            if slow.nodes is not None:
                self.slow_nodes = list(slow.nodes)
            else:
                u = Stream(self.seed, list(range(n)), "network.slow").uniform(
                    1, dtype=torch.float64)[:, 0].numpy()
                self.slow_nodes = sorted(np.argsort(u, kind="stable")[: slow.count(n)].tolist())
            factor[self.slow_nodes] = slow.factor
        self._factor = factor.tolist()
        self._nodes = list(range(n))
        self._batches: dict[tuple[str, int], tuple[list[int], int, Any]] = {}
        self._factor_np = factor
        compute = network.compute if network.compute is not None else Fixed(1.0)
        self._compute_fixed = compute.seconds if isinstance(compute, Fixed) else None
        self._compute = KeyedDraws(self.seed, "network.compute", compute)
        delay = network.delay if network.delay is not None else Fixed(0.0)
        self._delay_fixed = delay.seconds if isinstance(delay, Fixed) else None
        self._delay = KeyedDraws(self.seed, "network.delay", delay)
        loss = network.loss
        self._loss_p = loss.p if isinstance(loss, Bernoulli) else None
        self._loss_u = KeyedDraws(self.seed, "network.loss.event", None)
        self._ge_u = KeyedDraws(self.seed, "network.ge.event", None)
        self._lost: dict[int, tuple[int, int, np.ndarray]] = {}  # arc -> (lo, hi, lost flags)
        self._ge_end: dict[int, list[bool]] = {}  # arc -> chain state at the end of blocks 0, 1, ...
        churn = network.churn
        self.fresh = bool(churn is not None and churn.fresh)
        """A node that comes back starts from a fresh state (else with the state it left with)."""
        self._leave: dict[int, list[float]] = {}
        self._back: dict[int, list[float]] = {}
        self._churn = KeyedDraws(self.seed, "network.churn", None)
        if churn is not None and churn.schedule is not None:
            for i, a, b in churn.schedule:
                self._leave.setdefault(i, []).append(a)
                self._back.setdefault(i, []).append(b)
        self._rate = churn is not None and churn.schedule is None and churn.rate > 0

    # ------------------------------------------------------------------------ scalar draws
    def compute_s(self, node: int, k: int) -> float:
        """Seconds node ``node``'s k-th local step (k = 1, 2, …) takes."""
        fixed = self._compute_fixed
        if fixed is not None:
            return fixed * self._factor[node]
        hit = self._compute.cache.get(node)
        if hit is None or not hit[0] <= k < hit[1]:
            self._check_node(node)
            hit = self._compute.fill(node, k)
            np.multiply(hit[2], self._factor[node], out=hit[2])  # the slow factor, once per fill
        return float(hit[2][k - hit[0]])

    def delay_s(self, src: int, dst: int, k: int) -> float:
        """Seconds the k-th message on arc ``src → dst`` takes to arrive."""
        fixed = self._delay_fixed
        if fixed is not None:
            return fixed
        row = src << 32 | dst
        hit = self._delay.cache.get(row)
        if hit is None or not hit[0] <= k < hit[1]:
            self._check_node(src)
            self._check_node(dst)
            hit = self._delay.fill(row, k)
        return float(hit[2][k - hit[0]])

    def lost(self, src: int, dst: int, k: int) -> bool:
        """Whether the k-th message on arc ``src → dst`` is lost (module doc: Bernoulli per
        message, Gilbert-Elliott stepped once per message on the arc)."""
        if self.network.loss is None:
            return False
        row = src << 32 | dst
        hit = self._lost.get(row)
        if hit is None or not hit[0] <= k < hit[1]:
            self._check_node(src)
            self._check_node(dst)
            if self._loss_p is not None:
                lo, hi, u = self._loss_u.fill(row, k)
                hit = self._lost[row] = (lo, hi, u < self._loss_p)
            else:
                lo = k & -BLOCK
                hit = self._lost[row] = (lo, lo + BLOCK, self._ge_block(row, k >> _SHIFT))
        return bool(hit[2][k - hit[0]])

    def _ge_block(self, row: int, b: int) -> np.ndarray:
        """The loss flags of Gilbert-Elliott block ``b`` of an arc."""
        v = self._loss_u.make([row], b)[0]
        ge = self.network.loss
        ends = self._ge_end.setdefault(row, [])
        while len(ends) < b:  # the chain's state at the end of each earlier block
            ends.append(self._chain(row, len(ends), ends[-1] if ends else None)[1])
        states, end = self._chain(row, b, ends[b - 1] if b else None)
        if len(ends) == b:
            ends.append(end)
        return v < np.where(states, ge.loss_bad, ge.loss_good)

    def _chain(self, row: int, b: int, state: bool | None) -> tuple[np.ndarray, bool]:
        """The Gilbert-Elliott states of draws of block ``b`` (``state``: the one before it;
        None for block 0, whose draw 0 is the stationary start) and the last state."""
        ge = self.network.loss
        u = self._ge_u.make([row], b)[0].tolist()
        out = [False] * BLOCK
        s = bool(state)
        p_gb, p_bg = ge.p_gb, ge.p_bg
        for idx, x in enumerate(u):
            if state is None and idx == 0:
                s = x < ge.bad_share
            else:
                s = x >= p_bg if s else x < p_gb
            out[idx] = s
        return np.array(out), s

    def _check_node(self, node: int) -> None:
        if not 0 <= node < self.n:
            raise ConfigError(f"timing: node {node} does not exist (nodes 0..{self.n - 1})")

    # ---------------------------------------------------------------------------- churn
    def _extend(self, node: int, until: float) -> None:
        """Draw node's rate-churn intervals until one ends after ``until``."""
        if not math.isfinite(until):
            raise ConfigError("timing: rate churn draws away intervals up to a finite time, "
                              f"asked for {until}")
        churn = self.network.churn
        leave = self._leave.setdefault(node, [])
        back = self._back.setdefault(node, [])
        rows = self._churn
        while not back or back[-1] <= until:
            m = len(back) + 1
            up = self._churn_draw(rows, node, 2 * m - 1) * (1.0 / churn.rate)
            away = self._churn_draw(rows, node, 2 * m) * churn.mean_away
            start = (back[-1] if back else 0.0) + up
            leave.append(start)
            back.append(start + away)

    def _churn_draw(self, rows: KeyedDraws, node: int, k: int) -> float:
        """A unit exponential: draw k of stream "network.churn", row ``node``."""
        return -math.log1p(-rows.value(node, k))

    def away(self, node: int, until: float = math.inf) -> list[tuple[float, float]]:
        """Node's away intervals ``[leave, back)`` (back may be inf) that begin before ``until``
        (rate churn draws infinitely many: give a finite ``until``)."""
        self._check_node(node)
        if self._rate:
            if math.isinf(until):
                raise ConfigError("timing.away: rate churn has infinitely many away intervals; "
                                  "give a finite until")
            self._extend(node, until)
        leave, back = self._leave.get(node, []), self._back.get(node, [])
        return [(a, b) for a, b in zip(leave, back) if a < until]

    def present(self, node: int, time: float) -> bool:
        """Whether ``node`` is in the network at ``time`` (not inside an away interval)."""
        if self._rate:
            back = self._back.get(node)
            if not back or back[-1] <= time:
                self._check_node(node)
                self._extend(node, time)
        leave = self._leave.get(node)
        if not leave:
            return True
        idx = bisect.bisect_right(leave, time) - 1
        return idx < 0 or time >= self._back[node][idx]

    def next_change(self, node: int, time: float) -> float:
        """The first time after ``time`` at which ``node`` leaves or comes back (inf: never)."""
        if self._rate:
            self._extend(node, time)
        leave = self._leave.get(node, [])
        idx = bisect.bisect_right(leave, time) - 1
        if idx >= 0 and time < self._back[node][idx]:
            return self._back[node][idx]
        if idx + 1 < len(leave):
            return leave[idx + 1]
        return math.inf

    # ----------------------------------------------------------------- vectorized draws
    def compute_all(self, k: int) -> np.ndarray:
        """[n] the k-th local step's seconds of every node (as :meth:`compute_s`)."""
        if self._compute_fixed is not None:
            return self._compute_fixed * self._factor_np
        return self.compute_rows(self._nodes, k)

    def compute_rows(self, nodes: list[int], k: int) -> np.ndarray:
        """[len(nodes)] the k-th local step's seconds of ``nodes`` (as :meth:`compute_s`)."""
        if self._compute_fixed is not None:
            return self._compute_fixed * self._factor_np[nodes]
        return self._batch("compute", self._compute, nodes, k) * self._factor_np[nodes]

    def delay_arcs(self, keys: list[int], k: int) -> np.ndarray:
        """[len(keys)] the k-th message's seconds on arcs ``keys`` (:func:`arc_keys` rows; as
        :meth:`delay_s`)."""
        if self._delay_fixed is not None:
            return np.full(len(keys), self._delay_fixed)
        return self._batch("delay", self._delay, keys, k)

    def _batch(self, what: str, rows: KeyedDraws, keys: list[int], k: int) -> np.ndarray:
        """Column k of ``keys``' draws. A list object asked for again (a static graph's arcs,
        round after round) gets its whole block drawn and cached; one seen once (a graph that
        changes every round) only the pair of draws it needs."""
        b, idx = k >> _SHIFT, k & _MASK
        slot = (what, id(keys))
        hit = self._batches.get(slot)
        if hit is not None and hit[0] is keys:
            if hit[1] != b:
                hit = self._batches[slot] = (keys, b, rows.make(keys, b))
            return hit[2][:, idx]
        if len(self._batches) >= 64:
            self._batches.clear()
        self._batches[slot] = (keys, -1, None)
        return rows.make(keys, b, idx & ~1, 2)[:, idx & 1]


__all__ = ["Timing", "BLOCK"]
