"""Network models: what happens to a message between its sender and its receiver, and how long
nodes take (docs/network.md). A spec, as ``--network`` takes it::

    SPEC  := "none" | MODEL (";" MODEL)*          one model of each kind at most
    MODEL := "loss=" LOSS | "stale=" LAG | "delay=" DIST | "compute=" DIST | "slow=" SLOW
           | "churn=" CHURN | "noise=" NOISE | "active=" ACTIVE
    LOSS  := P                                    Bernoulli(P): each message lost with prob. P
           | "bernoulli:" P                       the same
           | "ge:" KEY "=" P ("," KEY "=" P)*     Gilbert-Elliott bursts, one chain per arc
    KEY   := p_gb | p_bg | loss_good | loss_bad   (p_gb, p_bg required; loss_good 0, loss_bad 1)
    LAG   := K | "fixed:" K                       always K rounds late (an integer >= 0)
           | "geom:" P                            k rounds late with prob. P (1 − P)^k, P in (0, 1]
           | "uniform:" LO "," HI                 uniform on the integers LO..HI
           | "arcs:" ARC "@" LAG ("+" ARC "@" LAG)*  per arc (the others: "*@" LAG, default 0)
    ARC   := I ">" J | "*"                        the arc from node I to node J; every other arc
    DIST  := S | "fixed:" S                       always S seconds
           | "exp:" MEAN                          exponential of mean MEAN
           | "uniform:" LO "," HI                 uniform on [LO, HI]
           | "lognormal:" MEDIAN "," SIGMA        MEDIAN · exp(SIGMA · N(0, 1))
    SLOW  := FRACTION "x" FACTOR                  ⌈FRACTION · n⌉ stragglers chosen by the seed
           | "nodes:" NODE ("+" NODE)* "x" FACTOR these nodes; their compute times × FACTOR
    CHURN := "rate:" R ",mean_away:" S [",fresh"] per node: up-times Exp(mean 1/R), away-times
                                                  Exp(mean S), alternating from time 0 (up)
           | "at:" EVENT ("+" EVENT)* [",fresh"]  an explicit schedule
    EVENT := NODE "@" LEAVE "-" BACK              away on [LEAVE, BACK); BACK may be "inf"
    NOISE := V | "var:" V                         Gaussian noise of variance V per value
           | "std:" S                             the same with standard deviation S (V = S²)
    ACTIVE := P | "bernoulli:" P                  each round each node is active with prob. P
           | "markov:p_off=" P ",p_on=" P         a two-state chain per node, stepped per round
           | "poisson:" RATE                      active when its Poisson clock (RATE ticks per
                                                  round) ticks in the round: P = 1 − exp(−RATE)
           | "cyclic:" K                          node i active in rounds t with (t−1−i) mod K = 0

``stale``: whole rounds a message of a synchronous round arrives late (it moves in its round,
the engine hands it to the algorithm that many rounds later, :mod:`gossip.network.stale`).
``delay``: seconds a message takes from sender to receiver (default 0). ``compute``: seconds
one local step (a gradient, an activation) of a node takes (default 1). ``slow``: stragglers,
FRACTION in (0, 1], FACTOR ≥ 1. ``churn``: nodes leave and come back, with the state they had
or, with ``fresh``, a fresh one; modeled for asynchronous algorithms (event runs). Every number
is finite and ≥ 0 (BACK may be inf).

Every probability is in [0, 1]. A Gilbert-Elliott arc is in a good or a bad state; each round
it moves good → bad with probability ``p_gb`` and bad → good with ``p_bg``, and each message of
the round on it is lost with ``loss_good`` or ``loss_bad``. Its stationary loss rate is
``(1 − π) loss_good + π loss_bad`` with ``π = p_gb / (p_gb + p_bg)``; its mean burst length
(rounds in the bad state) ``1 / p_bg``.

``noise``: every delivered message of a synchronous round reaches its receiver as its decoded
values plus independent N(0, V) noise per value (:mod:`gossip.network.noise`); the bits sent do
not change. ``active``: synchronous partial activation (:mod:`gossip.network.activity`): an
inactive node neither computes nor sends nor receives in that round; its neighbors treat it as
silent, as the algorithm treats a lost message.

The draws of these models are keyed by (seed, arc or node, counter): synchronous rounds'
losses and lags in :mod:`gossip.network.draws`, virtual time in :mod:`gossip.network.timing`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gossip.errors import ConfigError

GE_KEYS = ("p_gb", "p_bg", "loss_good", "loss_bad")
FORMS = ("none", "loss=P", "loss=bernoulli:P", "loss=ge:p_gb=P,p_bg=P[,loss_good=P][,loss_bad=P]",
         "stale=K", "stale=geom:P", "stale=uniform:LO,HI", "stale=arcs:I>J@LAG+...[+*@LAG]",
         "delay=DIST", "compute=DIST", "slow=FRACTIONxFACTOR", "slow=nodes:I+JxFACTOR",
         "churn=rate:R,mean_away:S[,fresh]", "churn=at:NODE@LEAVE-BACK+...[,fresh]",
         "noise=V", "noise=var:V", "noise=std:S", "active=P", "active=bernoulli:P",
         "active=markov:p_off=P,p_on=P", "active=poisson:RATE", "active=cyclic:K")
"""The spec forms, for help texts and errors."""
DIST_FORMS = "S | fixed:S | exp:MEAN | uniform:LO,HI | lognormal:MEDIAN,SIGMA"
"""The forms of a duration distribution (``delay=``, ``compute=``)."""
LAG_FORMS = "K | fixed:K | geom:P | uniform:LO,HI | arcs:I>J@LAG+...[+*@LAG]"
"""The forms of a lag in rounds (``stale=``)."""
MODELS = ("loss", "stale", "delay", "compute", "slow", "churn", "noise", "active")
"""The model kinds, in the order a canonical spec lists them."""
MIN_PRESENT = 1e-3
"""The smallest long-run fraction of time rate churn may leave a node present
(:attr:`Churn.present_fraction`): below it nearly every event of an asynchronous run is the
clock ring of an away node, and the run makes next to no progress."""


def num(x: float) -> str:
    """A number as a spec writes it: exact (shortest round-trip repr), integers without '.0'."""
    if math.isinf(x):
        return "inf"
    if x == int(x) and abs(x) < 1e16:
        return str(int(x))
    return repr(float(x))


@dataclass(frozen=True)
class Bernoulli:
    """Each message lost independently with probability ``p``."""

    p: float

    @property
    def rate(self) -> float:
        """The long-run fraction of messages lost."""
        return self.p

    def spec(self) -> str:
        return f"bernoulli:{num(self.p)}"


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
        return "ge:" + ",".join(f"{k}={num(getattr(self, k))}" for k in GE_KEYS)


LossModel = Bernoulli | GilbertElliott


@dataclass(frozen=True)
class FixedLag:
    """Every message ``rounds`` rounds late."""

    rounds: int

    @property
    def low(self) -> int:
        """The smallest lag it draws."""
        return self.rounds

    @property
    def late(self) -> bool:
        """Whether a message can be late at all."""
        return self.rounds > 0

    def lags(self, u: np.ndarray) -> np.ndarray:
        """The lags of uniforms ``u`` in [0, 1) (module doc)."""
        return np.full(u.shape, self.rounds, dtype=np.int64)

    def spec(self) -> str:
        return f"fixed:{self.rounds}"


@dataclass(frozen=True)
class GeometricLag:
    """``k`` rounds late with probability ``p (1 − p)^k`` (k = 0, 1, …; mean ``(1 − p) / p``):
    each round the message is delivered with probability ``p``."""

    p: float
    low = 0  # the smallest lag it draws

    @property
    def late(self) -> bool:
        return self.p < 1.0

    def lags(self, u: np.ndarray) -> np.ndarray:
        if self.p == 1.0:
            return np.zeros(u.shape, dtype=np.int64)
        return np.floor(np.log1p(-u) / math.log1p(-self.p)).astype(np.int64)

    def spec(self) -> str:
        return f"geom:{num(self.p)}"


@dataclass(frozen=True)
class UniformLag:
    """Uniform on the whole numbers ``lo..hi`` of rounds."""

    lo: int
    hi: int

    @property
    def low(self) -> int:
        return self.lo

    @property
    def late(self) -> bool:
        return self.hi > 0

    def lags(self, u: np.ndarray) -> np.ndarray:
        return self.lo + np.floor(u * (self.hi - self.lo + 1)).astype(np.int64)

    def spec(self) -> str:
        return f"uniform:{self.lo},{self.hi}"


@dataclass(frozen=True)
class ArcLags:
    """A lag distribution per arc: ``arcs`` maps ``(i, j)`` to its model, every other arc
    draws from ``default`` (0 rounds unless given). Each arc's draws are its own stream's, as
    for a single model."""

    arcs: tuple[tuple[int, int, FixedLag | GeometricLag | UniformLag], ...]
    default: FixedLag | GeometricLag | UniformLag = FixedLag(0)

    @property
    def low(self) -> int:
        """The smallest lag any arc draws."""
        return min([self.default.low] + [m.low for _, _, m in self.arcs])

    @property
    def late(self) -> bool:
        return self.default.late or any(m.late for _, _, m in self.arcs)

    def of(self, i: int, j: int) -> FixedLag | GeometricLag | UniformLag:
        """Arc (i, j)'s model."""
        return next((m for a, b, m in self.arcs if (a, b) == (i, j)), self.default)

    def spec(self) -> str:
        items = [] if self.default == FixedLag(0) else [f"*@{self.default.spec()}"]
        return "arcs:" + "+".join(items + [f"{i}>{j}@{m.spec()}" for i, j, m in self.arcs])


LagModel = FixedLag | GeometricLag | UniformLag | ArcLags


@dataclass(frozen=True)
class Fixed:
    """Always ``seconds``."""

    seconds: float

    @property
    def mean(self) -> float:
        return self.seconds

    @property
    def low(self) -> float:
        """The smallest value it takes."""
        return self.seconds

    def spec(self) -> str:
        return f"fixed:{num(self.seconds)}"


@dataclass(frozen=True)
class Exponential:
    """Exponential of mean ``mean``: ``−mean · log(1 − u)``."""

    mean: float
    low = 0.0  # the smallest value it takes

    def spec(self) -> str:
        return f"exp:{num(self.mean)}"


@dataclass(frozen=True)
class Uniform:
    """Uniform on [lo, hi]: ``lo + (hi − lo) · u``."""

    lo: float
    hi: float

    @property
    def mean(self) -> float:
        return 0.5 * (self.lo + self.hi)

    @property
    def low(self) -> float:
        """The smallest value it takes."""
        return self.lo

    def spec(self) -> str:
        return f"uniform:{num(self.lo)},{num(self.hi)}"


@dataclass(frozen=True)
class LogNormal:
    """``median · exp(sigma · z)``, z standard normal (:meth:`Stream.normal`)."""

    median: float
    sigma: float

    @property
    def mean(self) -> float:
        return self.median * math.exp(0.5 * self.sigma**2)

    low = 0.0  # the smallest value it takes

    def spec(self) -> str:
        return f"lognormal:{num(self.median)},{num(self.sigma)}"


Dist = Fixed | Exponential | Uniform | LogNormal


@dataclass(frozen=True)
class Slow:
    """Stragglers: ``⌈fraction · n⌉`` nodes chosen by the seed, or the explicit ``nodes``;
    their compute times are ``factor`` times longer."""

    factor: float
    fraction: float | None = None
    nodes: tuple[int, ...] | None = None

    def count(self, n: int) -> int:
        """How many of ``n`` nodes are slow."""
        if self.nodes is not None:
            return len(self.nodes)
        return min(n, max(1, math.ceil(self.fraction * n - 1e-9)))  # 0.1 · 30 is 3, not 4

    def spec(self) -> str:
        which = num(self.fraction) if self.nodes is None else "nodes:" + "+".join(map(str, self.nodes))
        return f"{which}x{num(self.factor)}"


@dataclass(frozen=True)
class Churn:
    """Nodes leave and come back: from a ``rate`` (leaves per second of up-time, exponential
    up-times) and ``mean_away`` (exponential away-times), or an explicit ``schedule`` of
    ``(node, leave, back)`` (sorted; back may be inf). ``fresh``: a node comes back with a fresh
    state rather than the one it left with."""

    rate: float | None = None
    mean_away: float | None = None
    schedule: tuple[tuple[int, float, float], ...] | None = None
    fresh: bool = False

    @property
    def present_fraction(self) -> float | None:
        """Rate churn: the long-run fraction of time a node is present, ``1 / (1 + R·S)`` (mean
        up-time 1/R of every cycle of mean length 1/R + S); None for a schedule. An
        asynchronous run's clock rings find their node present about this often, so it takes
        about ``1 / present_fraction`` rings per activation."""
        if self.schedule is not None:
            return None
        return 1.0 / (1.0 + self.rate * self.mean_away)

    def spec(self) -> str:
        if self.schedule is None:
            text = f"rate:{num(self.rate)},mean_away:{num(self.mean_away)}"
        else:
            text = "at:" + "+".join(f"{i}@{num(a)}-{num(b)}" for i, a, b in self.schedule)
        return text + (",fresh" if self.fresh else "")


@dataclass(frozen=True)
class Noise:
    """Additive Gaussian noise on every delivered message's decoded values: N(0, :attr:`var`)
    per value, independent per (round, phase, arc, value). ``value`` is what the spec gave, a
    variance (``given="var"``: ``var:V``) or a standard deviation (``"std"``: ``std:S``), so
    the spec writes it back exactly."""

    value: float
    given: str = "var"  # "var" or "std"

    @property
    def var(self) -> float:
        """σ², the variance of the noise on each value."""
        return self.value * self.value if self.given == "std" else self.value

    @property
    def std(self) -> float:
        """σ, its standard deviation."""
        return self.value if self.given == "std" else math.sqrt(self.value)

    @property
    def noisy(self) -> bool:
        return self.value > 0

    def spec(self) -> str:
        return f"{self.given}:{num(self.value)}"


@dataclass(frozen=True)
class ActiveBernoulli:
    """Each round, each node active with probability ``p``, independently."""

    p: float

    @property
    def activity(self) -> float:
        """The long-run fraction of rounds a node is active."""
        return self.p

    def spec(self) -> str:
        return f"bernoulli:{num(self.p)}"


@dataclass(frozen=True)
class ActiveMarkov:
    """A two-state chain per node, stepped once per round: active → inactive with ``p_off``,
    inactive → active with ``p_on``; at round 0 drawn from its stationary law (active with
    ``p_on / (p_on + p_off)``; active when neither ever moves)."""

    p_off: float
    p_on: float

    @property
    def activity(self) -> float:
        total = self.p_off + self.p_on
        return self.p_on / total if total > 0 else 1.0

    def spec(self) -> str:
        return f"markov:p_off={num(self.p_off)},p_on={num(self.p_on)}"


@dataclass(frozen=True)
class ActivePoisson:
    """A Poisson clock of ``rate`` ticks per round at each node; a node is active in a round in
    which its clock ticks. Its ticks in disjoint rounds are independent, so a node is active
    with probability ``1 − exp(−rate)`` each round, independently (drawn as that)."""

    rate: float

    @property
    def activity(self) -> float:
        return -math.expm1(-self.rate)

    def spec(self) -> str:
        return f"poisson:{num(self.rate)}"


@dataclass(frozen=True)
class ActiveCyclic:
    """Node i is active in the rounds t with ``(t − 1 − i) mod period = 0``: the nodes take
    turns, each active once every ``period`` rounds (no draw)."""

    period: int

    @property
    def activity(self) -> float:
        return 1.0 / self.period

    def spec(self) -> str:
        return f"cyclic:{self.period}"


ActivityModel = ActiveBernoulli | ActiveMarkov | ActivePoisson | ActiveCyclic


@dataclass(frozen=True)
class Network:
    """A parsed ``--network`` spec: the models messages and nodes go through (None: ideal)."""

    loss: LossModel | None = None
    stale: LagModel | None = None
    delay: Dist | None = None
    compute: Dist | None = None
    slow: Slow | None = None
    churn: Churn | None = None
    noise: Noise | None = None
    active: ActivityModel | None = None

    @property
    def noisy(self) -> bool:
        """Whether delivered messages carry noise (``noise=`` with a variance above 0)."""
        return self.noise is not None and self.noise.noisy

    @property
    def partial(self) -> bool:
        """Whether nodes take part in rounds only when active (``active=``; built even when
        every node is always active, as ``active=1``, which then changes nothing)."""
        return self.active is not None

    @property
    def lossy(self) -> bool:
        """Whether a message can be lost at all (a probability-0 model cannot)."""
        if self.loss is None:
            return False
        if isinstance(self.loss, Bernoulli):
            return self.loss.p > 0
        ge = self.loss
        return ge.loss_good > 0 or (ge.loss_bad > 0 and ge.p_gb > 0)

    @property
    def late(self) -> bool:
        """Whether a message can arrive rounds late (``stale=`` with a lag that is not always 0)."""
        return self.stale is not None and self.stale.late

    @property
    def timed(self) -> bool:
        """Whether any timing model (delay, compute, slow, churn) is set: runs then keep a
        virtual clock (:mod:`gossip.network.timing`)."""
        return any(getattr(self, k) is not None for k in ("delay", "compute", "slow", "churn"))

    def spec(self) -> str:
        """The canonical spec (what the logs record): ``parse_network(spec()) == self``."""
        parts = [f"{k}={getattr(self, k).spec()}" for k in MODELS if getattr(self, k) is not None]
        return ";".join(parts) if parts else "none"

    def check(self, n: int, topology: Any = None) -> None:
        """Refuse (:class:`ConfigError`, one line) what cannot hold on ``n`` nodes: a slow or
        churning node that does not exist, a per-arc lag on an arc that does not exist (on a
        static ``topology``: not one of its arcs); and for a churn schedule, a time at which every node
        is away, or (``topology`` given, a static one) nodes present from some time until the end
        that leave the graph disconnected for good. Rate churn is checked as it is parsed (a node
        present at least :data:`MIN_PRESENT` of the time)."""
        where = f"--network {self.spec()}"
        if isinstance(self.stale, ArcLags):
            for i, j, _ in self.stale.arcs:
                if max(i, j) >= n:
                    raise ConfigError(f"{where}: stale names arc {i}>{j}, but node {max(i, j)} "
                                      f"does not exist (nodes 0..{n - 1})")
                if (topology is not None and not getattr(topology, "time_varying", False)
                        and j not in topology.view(i).out_neighbors):
                    raise ConfigError(f"{where}: stale names arc {i}>{j}, which is not an arc of "
                                      f"{getattr(topology, 'name', 'the topology')}")
        if self.slow is not None and self.slow.nodes is not None:
            bad = [i for i in self.slow.nodes if i >= n]
            if bad:
                raise ConfigError(f"{where}: slow node {bad[0]} does not exist (nodes 0..{n - 1})")
        churn = self.churn
        if churn is None or churn.schedule is None:
            return
        bad = [i for i, _, _ in churn.schedule if i >= n]
        if bad:
            raise ConfigError(f"{where}: churn names node {bad[0]}, which does not exist "
                              f"(nodes 0..{n - 1})")
        times = sorted({a for _, a, _ in churn.schedule} | {b for _, _, b in churn.schedule
                                                            if math.isfinite(b)})
        for t in times:  # presence changes only at these times
            away = {i for i, a, b in churn.schedule if a <= t < b}
            if len(away) == n:
                raise ConfigError(f"{where}: every node is away at time {num(t)} s")
        gone = {i for i, _, b in churn.schedule if math.isinf(b)}
        if topology is None or getattr(topology, "time_varying", False) or not gone:
            return
        import networkx as nx

        graph = topology.graph.subgraph([i for i in range(n) if i not in gone])
        connected = (nx.is_strongly_connected(graph) if graph.is_directed()
                     else nx.is_connected(graph))
        if not connected:
            raise ConfigError(f"{where}: once node(s) {', '.join(map(str, sorted(gone)))} leave "
                              "for good, the nodes left are disconnected for good")


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


def _rounds(what: str, text: str, spec: str) -> int:
    if not text.strip().isdigit():
        raise ConfigError(f"network spec {spec!r}: {what} = {text!r} is not a whole number of "
                          "rounds >= 0 (0, 1, 2, ...)")
    return int(text)


_ARC = re.compile(r"(\d+)>(\d+)")


def _arc_lags(text: str, spec: str) -> ArcLags:
    arcs: dict[tuple[int, int], Any] = {}
    default = None
    for item in text.split("+"):
        arc, at, lag = item.strip().partition("@")
        m = _ARC.fullmatch(arc.strip())
        if not at or (m is None and arc.strip() != "*"):
            raise ConfigError(f"network spec {spec!r}: stale arcs item {item!r} is not I>J@LAG or "
                              "*@LAG (e.g. 0>1@geom:0.5, *@1)")
        if lag.strip().startswith("arcs:"):
            raise ConfigError(f"network spec {spec!r}: stale arcs item {item!r} nests arcs:")
        model = _lag(lag.strip(), spec)
        if m is None:
            if default is not None:
                raise ConfigError(f"network spec {spec!r}: stale arcs gives *@LAG twice")
            default = model
            continue
        i, j = int(m[1]), int(m[2])
        if i == j or (i, j) in arcs:
            raise ConfigError(f"network spec {spec!r}: stale arcs item {item!r} is not an arc "
                              "between two nodes named once")
        arcs[(i, j)] = model
    return ArcLags(tuple((i, j, arcs[(i, j)]) for i, j in sorted(arcs)),
                   FixedLag(0) if default is None else default)


def _lag(text: str, spec: str) -> LagModel:
    kind, sep, rest = text.partition(":")
    if kind == "arcs" and sep:
        return _arc_lags(rest, spec)
    if not sep:
        kind, rest = "fixed", text
    if kind == "fixed":
        return FixedLag(_rounds("the lag", rest, spec))
    if kind == "geom":
        p = _probability("the geometric lag's delivery probability", rest, spec)
        if p == 0.0:
            raise ConfigError(f"network spec {spec!r}: stale=geom:0 never delivers; P is the "
                              "probability a message is delivered each round, in (0, 1]")
        return GeometricLag(p)
    args = rest.split(",")
    if kind != "uniform" or len(args) != 2:
        raise ConfigError(f"network spec {spec!r}: stale={text!r} is not one of {LAG_FORMS} "
                          "(rounds)")
    lo, hi = (_rounds(f"stale uniform {w}", a.strip(), spec) for w, a in zip(("LO", "HI"), args))
    if lo > hi:
        raise ConfigError(f"network spec {spec!r}: stale=uniform:LO,HI needs LO <= HI")
    return UniformLag(lo, hi)


def _seconds(what: str, text: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (v >= 0.0 and math.isfinite(v)):  # NaN fails too
        raise ConfigError(f"network spec {spec!r}: {what} = {text!r} is not a finite number >= 0")
    return v


def _dist(model: str, text: str, spec: str) -> Dist:
    kind, sep, rest = text.partition(":")
    args = rest.split(",") if sep else []
    shapes = {"fixed": 1, "exp": 1, "uniform": 2, "lognormal": 2}
    if not sep:
        kind, args = "fixed", [text]
    if kind not in shapes or len(args) != shapes[kind]:
        raise ConfigError(f"network spec {spec!r}: {model}={text!r} is not one of {DIST_FORMS}")
    v = [_seconds(f"{model} {kind}", a.strip(), spec) for a in args]
    if kind == "fixed":
        return Fixed(v[0])
    if kind == "exp":
        return Exponential(v[0])
    if kind == "uniform":
        if v[0] > v[1]:
            raise ConfigError(f"network spec {spec!r}: {model}=uniform:LO,HI needs LO <= HI")
        return Uniform(v[0], v[1])
    return LogNormal(v[0], v[1])


def _node(text: str, what: str, spec: str) -> int:
    if not text.strip().isdigit():
        raise ConfigError(f"network spec {spec!r}: {what} {text!r} is not a node id (0, 1, ...)")
    return int(text)


def _slow(text: str, spec: str) -> Slow:
    which, x, factor_text = text.rpartition("x")
    if not x:
        raise ConfigError(f"network spec {spec!r}: slow={text!r} is not FRACTIONxFACTOR "
                          "(e.g. 0.125x5) or nodes:I+JxFACTOR (e.g. nodes:0+3x5)")
    try:
        factor = float(factor_text)
    except ValueError:
        factor = math.nan
    if not (factor >= 1.0 and math.isfinite(factor)):
        raise ConfigError(f"network spec {spec!r}: slow factor {factor_text!r} is not a finite "
                          "number >= 1")
    if which.startswith("nodes:"):
        nodes = [_node(t, "slow node", spec) for t in which[len("nodes:"):].split("+")]
        if len(set(nodes)) != len(nodes):
            raise ConfigError(f"network spec {spec!r}: slow names a node twice")
        return Slow(factor, nodes=tuple(sorted(nodes)))
    try:
        fraction = float(which)
    except ValueError:
        fraction = math.nan
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"network spec {spec!r}: slow fraction {which!r} is not in (0, 1]")
    return Slow(factor, fraction=fraction)


_NUMBER = r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_EVENT = re.compile(rf"(\d+)@({_NUMBER})-({_NUMBER}|inf)")


def _churn(text: str, spec: str) -> Churn:
    fresh = text.endswith(",fresh")
    if fresh:
        text = text[: -len(",fresh")]
    kind, sep, rest = text.partition(":")
    if kind == "rate" and sep:
        rate_text, _, away = rest.partition(",")
        if not away.startswith("mean_away:"):
            raise ConfigError(f"network spec {spec!r}: churn=rate:R,mean_away:S[,fresh] needs "
                              "mean_away:S after the rate")
        churn = Churn(rate=_seconds("churn rate", rate_text, spec),
                      mean_away=_seconds("churn mean_away", away[len("mean_away:"):], spec),
                      fresh=fresh)
        present = churn.present_fraction
        if present < MIN_PRESENT:
            raise ConfigError(
                f"network spec {spec!r}: with churn=rate:R,mean_away:S a node is present "
                f"1 / (1 + R·S) = {present:.3g} of the time, so an asynchronous run would ring "
                f"about {1 / present:.3g} clocks of away nodes per activation and never get "
                f"through its sweeps; keep R·S <= {1 / MIN_PRESENT - 1:g} (a node present at "
                f"least {MIN_PRESENT:.1%} of the time), e.g. a smaller rate or mean_away")
        return churn
    if kind != "at" or not sep:
        raise ConfigError(f"network spec {spec!r}: churn={text!r} is not rate:R,mean_away:S[,fresh] "
                          "or at:NODE@LEAVE-BACK+...[,fresh]")
    events = []
    for item in rest.split("+"):
        m = _EVENT.fullmatch(item.strip())
        if m is None:
            raise ConfigError(f"network spec {spec!r}: churn event {item!r} is not NODE@LEAVE-BACK "
                              "(seconds; BACK may be inf), e.g. 3@10-25")
        i, a, b = int(m[1]), float(m[2]), float(m[3])
        if not b > a:
            raise ConfigError(f"network spec {spec!r}: churn event {item!r} comes back before it "
                              "leaves (BACK must be > LEAVE)")
        events.append((i, a, b))
    events.sort()
    for (i, _, b), (j, a, _) in zip(events, events[1:]):
        if i == j and a < b:
            raise ConfigError(f"network spec {spec!r}: churn names node {i} twice in overlapping "
                              "intervals")
    return Churn(schedule=tuple(events), fresh=fresh)


def _noise(text: str, spec: str) -> Noise:
    kind, sep, rest = text.partition(":")
    if not sep:
        kind, rest = "var", text
    if kind not in ("var", "std"):
        raise ConfigError(f"network spec {spec!r}: noise={text!r} is not V, var:V or std:S (the "
                          "variance or the standard deviation of the noise on each value)")
    return Noise(_seconds(f"noise {kind}", rest.strip(), spec), kind)


def _active(text: str, spec: str) -> ActivityModel:
    kind, sep, rest = text.partition(":")
    if not sep or kind == "bernoulli":
        p = _probability("the activation probability", rest if sep else text, spec)
        if p == 0:
            raise ConfigError(f"network spec {spec!r}: active=0 never activates a node; give "
                              "the probability a node is active in a round, in (0, 1]")
        return ActiveBernoulli(p)
    if kind == "poisson":
        rate = _seconds("the Poisson clock's rate (ticks per round)", rest, spec)
        if rate == 0:
            raise ConfigError(f"network spec {spec!r}: active=poisson:0 never ticks; give a rate "
                              "> 0 (ticks per round)")
        return ActivePoisson(rate)
    if kind == "cyclic":
        period = _rounds("the cycle's period", rest, spec)
        if period < 1:
            raise ConfigError(f"network spec {spec!r}: active=cyclic:K needs a period K >= 1")
        return ActiveCyclic(period)
    if kind != "markov":
        raise ConfigError(f"network spec {spec!r}: active={text!r} is not one of P, bernoulli:P, "
                          "markov:p_off=P,p_on=P, poisson:RATE, cyclic:K")
    values: dict[str, float] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("p_off", "p_on") or key in values:
            raise ConfigError(f"network spec {spec!r}: active=markov takes p_off=P,p_on=P once "
                              f"each (got {item!r})")
        values[key] = _probability(key, value.strip(), spec)
    if len(values) != 2:
        raise ConfigError(f"network spec {spec!r}: active=markov needs p_off and p_on (the "
                          "active->inactive and inactive->active probabilities per round)")
    if values["p_on"] == 0 and values["p_off"] > 0:
        raise ConfigError(f"network spec {spec!r}: active=markov with p_on=0 puts every node to "
                          "sleep for good; give p_on > 0")
    return ActiveMarkov(values["p_off"], values["p_on"])


def parse_network(spec: str | None) -> Network:
    """The :class:`Network` of a spec (module doc); :class:`ConfigError` in one line naming
    what is wrong and the forms that work."""
    text = (spec or "none").strip()
    if text in ("", "none"):
        return Network()
    models: dict[str, Any] = {}
    for part in text.split(";"):
        key, eq, value = part.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not eq:
            raise ConfigError(f"network spec {spec!r}: {part.strip()!r} is not MODEL=VALUE; forms: "
                              f"{' | '.join(FORMS)} (models joined with ';')")
        if key not in MODELS:
            raise ConfigError(f"network spec {spec!r}: unknown network model {key!r} (known: "
                              f"{', '.join(MODELS)}; forms: {' | '.join(FORMS)})")
        if key in models:
            raise ConfigError(f"network spec {spec!r}: {key} is given twice")
        if key == "loss":
            models[key] = _loss(value, spec)
        elif key == "stale":
            models[key] = _lag(value, spec)
        elif key in ("delay", "compute"):
            models[key] = _dist(key, value, spec)
        elif key == "slow":
            models[key] = _slow(value, spec)
        elif key == "noise":
            models[key] = _noise(value, spec)
        elif key == "active":
            models[key] = _active(value, spec)
        else:
            models[key] = _churn(value, spec)
    return Network(**models)


__all__ = ["Network", "Bernoulli", "GilbertElliott", "FixedLag",
           "GeometricLag", "UniformLag", "ArcLags", "LAG_FORMS", "parse_network",
           "FORMS", "DIST_FORMS", "Fixed", "Exponential", "Uniform", "LogNormal", "Dist", "Slow",
           "Churn", "Noise", "ActiveBernoulli", "ActiveMarkov", "ActivePoisson", "ActiveCyclic",
           "ActivityModel"]
