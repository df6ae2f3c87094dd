"""Keyed draws of synchronous rounds: which arcs lose their message of a phase, and how many
rounds late it arrives (``loss=``, ``stale=`` of :mod:`gossip.network.spec`).

Every draw is a pure function of its key, through :class:`gossip.rng.Stream` with the arc
``(i, j)`` as the stream's row (``i << 32 | j``, as :meth:`Block.arc_rng`):

* the loss of arc (i, j)'s message in phase k of round t: uniform ``u`` of stream
  ``"network.loss"`` at (round t, call k), lost when ``u < p`` (``p`` the arc's loss
  probability in that round);
* the lag of arc (i, j)'s message in phase k of round t (``stale=``): uniform ``u`` of stream
  ``"network.stale"`` at (round t, call k): ``K``; ``⌊log(1 − u) / log(1 − P)⌋`` (geometric);
  ``LO + ⌊u · (HI − LO + 1)⌋`` (uniform);
* a Gilbert-Elliott arc's state: at round 0 bad when ``u < π`` (stream ``"network.ge"``, round 0),
  then at round t ≥ 1 a transition drawn from ``u`` of (round t, call 0).

* the noise on arc (i, j)'s message in phase k of round t (``noise=``): normals of stream
  ``"network.noise"`` at (round t, call k), the message's decoded values in order (a packed
  phase: its parts' values one after the other), times σ;
* whether node i is active in round t (``active=``), stream ``"network.active"`` with node i as
  the row: uniform ``u`` at (round t, call 0), active when ``u < P`` (Bernoulli;
  ``P = 1 − exp(−RATE)`` for a Poisson clock); a Markov chain: active at round 0 when
  ``u < π`` (round 0), then at round t ≥ 1 it leaves its state when ``u`` is below that state's
  probability of leaving (``p_off`` active, ``p_on`` inactive); cyclic: no draw.

So the sender's and the receiver's processes compute the same drops whatever the placement,
and the state of an arc's chain at round t is a function of (seed, arc, rounds 0..t):
**recomputed, not checkpointed** — :class:`LossDraws` carries each arc's state forward round by
round and, asked for an earlier round than it holds (a resumed run, a fresh process), replays
the chain from round 0 (a few numpy operations per round and arc).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gossip.network.spec import (
    ActiveBernoulli,
    ActiveCyclic,
    ActiveMarkov,
    ActivePoisson,
    ActivityModel,
    ArcLags,
    Bernoulli,
    GilbertElliott,
    LagModel,
    LossModel,
)
from gossip.rng import Stream


def arc_keys(arcs: list[tuple[int, int]]) -> list[int]:
    """The stream rows of arcs ``(i, j)``: ``i << 32 | j`` (as :meth:`Block.arc_rng`)."""
    return [i << 32 | j for i, j in arcs]


class LossDraws:
    """The drops of a fixed list of arcs (:func:`arc_keys` order), round after round.

    ``lost(t, phase)`` is a bool array, True where the arc's message of that phase of round t is
    lost: a function of (seed, arc, round, phase) only (module doc). A Gilbert-Elliott model's
    chain state is carried from round to round (replayed from round 0 when an earlier round is
    asked for)."""

    def __init__(self, model: LossModel, seed: int, keys: list[int]):
        self.model = model
        self._loss = Stream(seed, keys, "network.loss")
        self._ge = Stream(seed, keys, "network.ge") if isinstance(model, GilbertElliott) else None
        self._bad: np.ndarray | None = None  # the chains' states at round self._at
        self._at = -1

    def _uniform(self, stream: Stream, t: int, call: int) -> np.ndarray:
        stream.begin_round(t)
        stream.call = call
        return stream.uniform(1, dtype=torch.float64)[:, 0].numpy()

    def bad(self, t: int) -> np.ndarray:
        """The Gilbert-Elliott states (True: bad) of every arc at round ``t``."""
        ge = self.model
        if self._bad is None or t < self._at:
            self._bad = self._uniform(self._ge, 0, 0) < ge.bad_share
            self._at = 0
        while self._at < t:
            self._at += 1
            u = self._uniform(self._ge, self._at, 0)
            self._bad = np.where(self._bad, u >= ge.p_bg, u < ge.p_gb)
        return self._bad

    def lost(self, t: int, phase: int) -> np.ndarray:
        """True where an arc's message of phase ``phase`` (0, 1, …) of round ``t`` is lost."""
        u = self._uniform(self._loss, t, phase)
        if isinstance(self.model, Bernoulli):
            return u < self.model.p
        p = np.where(self.bad(t), self.model.loss_bad, self.model.loss_good)
        return u < p


class LagDraws:
    """The lags, in rounds, of a fixed list of arcs (:func:`arc_keys` order): ``lags(t, phase)``
    is an int64 array, a function of (seed, arc, round, phase) only (module doc)."""

    def __init__(self, model: LagModel, seed: int, keys: list[int]):
        self.model = model
        self._stream = Stream(seed, keys, "network.stale")
        per_arc = ([model.of(k >> 32, k & 0xFFFFFFFF) for k in keys] if isinstance(model, ArcLags)
                   else [model] * len(keys))
        groups: dict[Any, list[int]] = {}
        for r, m in enumerate(per_arc):
            groups.setdefault(m, []).append(r)
        self._groups = [(m, np.array(rows, dtype=np.int64)) for m, rows in groups.items()]

    def lags(self, t: int, phase: int) -> np.ndarray:
        """How many rounds late each arc's message of phase ``phase`` of round ``t`` is drawn
        to be (before the per-arc order, :mod:`gossip.network.stale`)."""
        self._stream.begin_round(t)
        self._stream.call = phase
        u = self._stream.uniform(1, dtype=torch.float64)[:, 0].numpy()
        if len(self._groups) == 1:
            return self._groups[0][0].lags(u)
        out = np.zeros(u.shape, dtype=np.int64)
        for model, rows in self._groups:
            out[rows] = model.lags(u[rows])
        return out


class NoiseDraws:
    """The standard normals of the noise on a fixed list of arcs (:func:`arc_keys` order):
    ``normals(t, phase, d)`` is a [arcs, d] float64 tensor, a function of (seed, arc, round,
    phase) only (module doc)."""

    def __init__(self, seed: int, keys: list[int]):
        self._stream = Stream(seed, keys, "network.noise")

    def normals(self, t: int, phase: int, d: int) -> torch.Tensor:
        self._stream.begin_round(t)
        self._stream.call = phase
        return self._stream.normal(d, dtype=torch.float64)


class ActivityDraws:
    """Which of the ``n`` nodes are active, round after round: ``active(t)`` is a bool [n]
    array, a function of (seed, node, rounds 0..t) only (module doc). A Markov chain's states
    are carried from round to round (replayed from round 0 when an earlier round is asked
    for: recomputed, never checkpointed)."""

    def __init__(self, model: ActivityModel, seed: int, n: int):
        self.model = model
        self.n = n
        self._stream = Stream(seed, list(range(n)), "network.active")
        self._on: np.ndarray | None = None  # the chains' states at round self._at
        self._at = -1

    def _uniform(self, t: int) -> np.ndarray:
        self._stream.begin_round(t)
        return self._stream.uniform(1, dtype=torch.float64)[:, 0].numpy()

    def active(self, t: int) -> np.ndarray:
        """True where node i is active in round ``t`` (t ≥ 1)."""
        model = self.model
        if isinstance(model, ActiveCyclic):
            return (t - 1 - np.arange(self.n)) % model.period == 0
        if isinstance(model, ActiveBernoulli):
            return self._uniform(t) < model.p
        if isinstance(model, ActivePoisson):
            return self._uniform(t) < model.activity
        assert isinstance(model, ActiveMarkov)
        if self._on is None or t < self._at:
            self._on = self._uniform(0) < model.activity
            self._at = 0
        while self._at < t:
            self._at += 1
            u = self._uniform(self._at)
            self._on = np.where(self._on, u >= model.p_off, u < model.p_on)
        return self._on.copy()


__all__ = ["LossDraws", "LagDraws", "NoiseDraws", "ActivityDraws", "arc_keys"]
