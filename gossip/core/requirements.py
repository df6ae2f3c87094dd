"""What an algorithm needs of a run: one :class:`Requirements` value per algorithm class.

The engine checks it once, before any node exists, with the same actionable messages for every
algorithm (a user's included)::

    class MyMethod(Algorithm):
        requires = Requirements(graph=Graph(static=False), gradients=True)

    class Exact(MyMethod):
        requires = replace(MyMethod.requires, compressor="identity")

What is left to :meth:`~gossip.core.algorithm.Algorithm.validate` is only what no field says
(a power-of-two node count, column-stochastic weights, a hyper-parameter against the graph).
Compressors are read through their properties (``is_identity``, ``bounded_variance``,
``stateful``), never their spec string, so a user's compressor is treated like a built-in one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gossip.errors import ConfigError

COMPRESSOR_NEEDS = ("any", "identity", "bounded-variance", "stateless")
"""What :attr:`Requirements.compressor` may say."""


@dataclass(frozen=True)
class Graph:
    """The graphs an algorithm runs on.

    Attributes:
        static: keeps per-neighbor state, so the graph cannot change between rounds
            (time-varying topologies are refused).
        symmetric: needs ``W = Wᵀ`` (directed graphs are refused).
        complete: an all-reduce in which every node talks to every other one: only the static
            complete graph (``--topology complete``) is accepted, and tests and tools that pick
            a graph pick that one for it.
        star: a federated method (server node 0, clients 1..n−1): only a static star whose
            hub is node 0 (``--topology star``) is accepted, and tests and tools that pick a
            graph pick that one for it.
    """

    static: bool = True
    symmetric: bool = True
    complete: bool = False
    star: bool = False


@dataclass(frozen=True)
class Requirements:
    """What an algorithm needs of a run; :meth:`check` refuses a run that lacks it.

    Attributes:
        graph: the graphs it runs on (:class:`Graph`; default: static and symmetric).
        gradients: it uses gradients and cannot run without an oracle per node
            (``consensus.py`` does not offer it).
        compressor: what compressor it takes: ``"any"`` (default); ``"identity"`` (only
            ``none``, ``compressor.is_identity``: it compresses by itself or mixes exact models,
            so ``optimize.py`` gives it ``none`` by default); ``"bounded-variance"``
            (``compressor.bounded_variance``: unbiased with a finite ω, or contractive up to a
            scale; low-rank is neither); ``"stateless"`` (not ``compressor.stateful``: one
            instance serves many streams of messages).
        compressor_message: the refusal of a compressor, when the default one of its kind is not
            specific enough; ``{name}`` and ``{spec}`` are filled in.
    """

    graph: Graph = field(default_factory=Graph)
    gradients: bool = False
    compressor: str = "any"
    compressor_message: str = ""

    def __post_init__(self) -> None:
        if self.compressor not in COMPRESSOR_NEEDS:
            raise ConfigError(f"Requirements(compressor={self.compressor!r}): use one of "
                              f"{', '.join(map(repr, COMPRESSOR_NEEDS))}")

    def check(self, topology: Any, compressor: Any, has_oracle: bool, *,
              name: str = "this algorithm") -> None:
        """Raise :class:`ConfigError` (saying what to use instead) unless ``topology``,
        ``compressor`` (an instance) and the presence of gradient oracles meet these needs."""
        self.check_graph(topology, name=name)
        if self.gradients and not has_oracle:
            raise ConfigError(f"{name} needs gradients: give it a problem (an oracle per node)")
        self.check_compressor(compressor, name=name)

    def check_graph(self, topology: Any, *, name: str = "this algorithm") -> None:
        """The graph part of :meth:`check`."""
        g = self.graph
        if g.complete:  # its message first: a complete graph is static and undirected too
            check_complete(name, topology)
        if g.star:
            check_star(name, topology)
        if g.static and getattr(topology, "time_varying", False):
            raise ConfigError(
                f"{name} keeps per-neighbor state and needs a static topology, but "
                f"'{topology.name}' changes every round; use a static graph, or an algorithm that "
                "keeps no per-neighbor state (gossip, dpsgd, push-sum, diging, c-gt)"
            )
        if g.symmetric and getattr(topology, "directed", False):
            raise ConfigError(
                f"{name} needs a symmetric mixing matrix, but '{topology.name}' is directed; use a "
                "symmetric graph (e.g. 'exponential' instead of 'directed-exponential')"
            )

    def check_compressor(self, compressor: Any, *, name: str = "this algorithm") -> None:
        """The compressor part of :meth:`check`."""
        need = self.compressor
        refused = ((need == "identity" and not compressor.is_identity)
                   or (need == "bounded-variance" and not compressor.bounded_variance)
                   or (need == "stateless" and compressor.stateful))
        if not refused:
            return
        spec = getattr(compressor, "spec", type(compressor).__name__)
        message = self.compressor_message or _DEFAULT_MESSAGES[need]
        raise ConfigError(message.format(name=name, spec=spec))


_DEFAULT_MESSAGES = {
    "identity": "{name} sends exact vectors and takes only the identity compressor (got "
                "'{spec}'): use --compressor none",
    "bounded-variance": "{name} needs a compressor of bounded variance (unbiased with a finite ω, "
                        "or contractive); '{spec}' has none: use a quantizer or a sparsifier "
                        "(lead:2, qsgd:4, randk:0.1:unbiased, topk:0.1)",
    "stateless": "{name} sends one message per stream with one compressor; '{spec}' keeps state "
                 "per stream: use a stateless compressor (topk, qsgd, lead, sign, ...)",
}


def check_complete(name: str, topology: Any) -> None:
    """Raise :class:`ConfigError` unless every node is linked to every other one, in every round."""
    if getattr(topology, "time_varying", False):
        raise ConfigError(f"{name} is an all-reduce method and needs the static complete graph: "
                          "use --topology complete")
    view_of = topology.at_round(1).view
    for i in range(topology.n):
        if len(view_of(i).out_neighbors) != topology.n - 1:
            raise ConfigError(
                f"{name} is an all-reduce method: every node talks to every other one, but node "
                f"{i} of '{topology.name}' has {len(view_of(i).out_neighbors)} of "
                f"{topology.n - 1} neighbors; use --topology complete"
            )


def check_star(name: str, topology: Any) -> None:
    """Refuse any graph but a static star whose hub is node 0 (the federated server)."""
    n = topology.n
    ok = (n >= 2 and not getattr(topology, "time_varying", False)
          and not getattr(topology, "directed", False))
    ok = ok and list(topology.view(0).in_neighbors) == list(range(1, n))
    ok = ok and all(list(topology.view(i).in_neighbors) == [0] for i in range(1, n))
    if not ok:
        raise ConfigError(f"{name} runs on a star whose node 0 is the server (--topology star), "
                          f"not on '{getattr(topology, 'name', topology)}'")
