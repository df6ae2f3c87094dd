"""Network models: what happens to a message between its sender and its receiver.

For now one model, **message loss** (docs/network.md). A spec, as ``--network`` takes it::

    SPEC  := "none" | MODEL (";" MODEL)*          one model of each kind at most
    MODEL := "loss=" LOSS
    LOSS  := P                                    Bernoulli(P): each message lost with prob. P
           | "bernoulli:" P                       the same
           | "ge:" KEY "=" P ("," KEY "=" P)*     Gilbert-Elliott bursts, one chain per arc
    KEY   := p_gb | p_bg | loss_good | loss_bad   (p_gb, p_bg required; loss_good 0, loss_bad 1)

Every probability is in [0, 1]. A Gilbert-Elliott arc is in a good or a bad state; each round
it moves good → bad with probability ``p_gb`` and bad → good with ``p_bg``, and each message of
the round on it is lost with ``loss_good`` or ``loss_bad``. Its stationary loss rate is
``(1 − π) loss_good + π loss_bad`` with ``π = p_gb / (p_gb + p_bg)``; its mean burst length
(rounds in the bad state) ``1 / p_bg``.

Every draw is a pure function of its key, through :class:`gossip.rng.Stream` with the arc
``(i, j)`` as the stream's row (``i << 32 | j``, as :meth:`Block.arc_rng`):

* the loss of arc (i, j)'s message in phase k of round t: uniform ``u`` of stream
  ``"network.loss"`` at (round t, call k), lost when ``u < p`` (``p`` the arc's loss
  probability in that round);
* a Gilbert-Elliott arc's state: at round 0 bad when ``u < π`` (stream ``"network.ge"``, round 0),
  then at round t ≥ 1 a transition drawn from ``u`` of (round t, call 0).

So the sender's and the receiver's processes compute the same drops whatever the placement,
and the state of an arc's chain at round t is a function of (seed, arc, rounds 0..t):
**recomputed, not checkpointed** — :class:`LossDraws` carries each arc's state forward round by
round and, asked for an earlier round than it holds (a resumed run, a fresh process), replays
the chain from round 0 (a few numpy operations per round and arc).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gossip.errors import ConfigError
from gossip.rng import Stream

GE_KEYS = ("p_gb", "p_bg", "loss_good", "loss_bad")
FORMS = ("none", "loss=P", "loss=bernoulli:P", "loss=ge:p_gb=P,p_bg=P[,loss_good=P][,loss_bad=P]")
"""The spec forms, for help texts and errors."""


@dataclass(frozen=True)
class Bernoulli:
    """Each message lost independently with probability ``p``."""

    p: float

    @property
    def rate(self) -> float:
        """The long-run fraction of messages lost."""
        return self.p

    def spec(self) -> str:
        return f"bernoulli:{self.p:g}"


@dataclass(frozen=True)
class GilbertElliott:
    """Bursts: a two-state (good/bad) Markov chain per arc, stepped once per round; a message
    is lost with ``loss_good`` in the good state and ``loss_bad`` in the bad one."""

    p_gb: float
    p_bg: float
    loss_good: float = 0.0
    loss_bad: float = 1.0

    @property
    def bad_share(self) -> float:
        """π, the stationary probability of the bad state (0 when the chain never moves)."""
        total = self.p_gb + self.p_bg
        return self.p_gb / total if total > 0 else 0.0

    @property
    def rate(self) -> float:
        """The stationary fraction of messages lost."""
        pi = self.bad_share
        return (1.0 - pi) * self.loss_good + pi * self.loss_bad

    def spec(self) -> str:
        return "ge:" + ",".join(f"{k}={getattr(self, k):g}" for k in GE_KEYS)


LossModel = Bernoulli | GilbertElliott


@dataclass(frozen=True)
class Network:
    """A parsed ``--network`` spec: the models messages go through (None: an ideal network)."""

    loss: LossModel | None = None

    @property
    def lossy(self) -> bool:
        """Whether a message can be lost at all (a probability-0 model cannot)."""
        if self.loss is None:
            return False
        if isinstance(self.loss, Bernoulli):
            return self.loss.p > 0
        ge = self.loss
        return ge.loss_good > 0 or (ge.loss_bad > 0 and ge.p_gb > 0)

    def spec(self) -> str:
        """The canonical spec (what the logs record)."""
        return "none" if self.loss is None else f"loss={self.loss.spec()}"


def _probability(what: str, text: str, spec: str) -> float:
    try:
        p = float(text)
    except ValueError:
        p = math.nan
    if not 0.0 <= p <= 1.0:  # NaN fails too
        raise ConfigError(f"network spec {spec!r}: {what} = {text!r} is not a probability in [0, 1]")
    return p


def _loss(text: str, spec: str) -> LossModel:
    kind, sep, rest = text.partition(":")
    if not sep:
        return Bernoulli(_probability("the loss probability", text, spec))
    if kind == "bernoulli":
        return Bernoulli(_probability("the loss probability", rest, spec))
    if kind != "ge":
        raise ConfigError(f"network spec {spec!r}: unknown loss model {kind!r}; use a probability, "
                          "bernoulli:P or ge:p_gb=P,p_bg=P[,loss_good=P][,loss_bad=P]")
    values: dict[str, float] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in GE_KEYS:
            raise ConfigError(f"network spec {spec!r}: {item!r} is not one of "
                              f"{', '.join(k + '=P' for k in GE_KEYS)}")
        if key in values:
            raise ConfigError(f"network spec {spec!r}: {key} is given twice")
        values[key] = _probability(key, value.strip(), spec)
    missing = [k for k in ("p_gb", "p_bg") if k not in values]
    if missing:
        raise ConfigError(f"network spec {spec!r}: Gilbert-Elliott needs {' and '.join(missing)} "
                          "(the good->bad and bad->good transition probabilities per round)")
    return GilbertElliott(**values)


def parse_network(spec: str | None) -> Network:
    """The :class:`Network` of a spec (module doc); :class:`ConfigError` in one line naming
    what is wrong and the forms that work."""
    text = (spec or "none").strip()
    if text in ("", "none"):
        return Network()
    models: dict[str, Any] = {}
    for part in text.split(";"):
        key, eq, value = part.strip().partition("=")
        if not eq:
            raise ConfigError(f"network spec {spec!r}: {part.strip()!r} is not MODEL=VALUE; forms: "
                              f"{' | '.join(FORMS)} (models joined with ';')")
        if key != "loss":
            raise ConfigError(f"network spec {spec!r}: unknown network model {key!r} (known: loss; "
                              f"forms: {' | '.join(FORMS)})")
        if key in models:
            raise ConfigError(f"network spec {spec!r}: {key} is given twice")
        models[key] = _loss(value.strip(), spec)
    return Network(**models)


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


__all__ = ["Network", "Bernoulli", "GilbertElliott", "LossDraws", "parse_network", "arc_keys",
           "FORMS"]
