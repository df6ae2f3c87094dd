"""Time-varying topologies: one graph per round, each with its own (doubly stochastic) W."""

from __future__ import annotations

import networkx as nx
import numpy as np

from .builders import _check_n, _check_seed, _tau
from .io import call_graph, load_function
from .topology import TimeVaryingTopology, Topology

__all__ = ["from_function", "one_peer_exponential", "random_matchings"]


def one_peer_exponential(
    n: int, *, weights: str = "metropolis", lazy: bool = False
) -> TimeVaryingTopology:
    """One-peer exponential graph: in round t, m = (t-1) mod tau, W = (I + P^(2^m)) / 2.

    Node i receives from (i - 2^m) mod n and sends to (i + 2^m) mod n (one message per round).
    Each W is doubly stochastic; for n a power of 2 the product over one period of tau rounds is
    exactly J (Ying et al. 2021).  Every rule gives weight 1/2 here (each node has in- and
    out-degree 1).
    """
    n = _check_n(n, "one_peer_exponential")
    tau = _tau(n)

    def at(t: int) -> Topology:
        shift = 1 << ((t - 1) % tau)
        graph = nx.DiGraph(name="one-peer-exponential", layout="circular", shift=shift)
        graph.add_nodes_from(range(n))
        graph.add_edges_from((i, (i + shift) % n) for i in range(n))
        return Topology(graph, rule=weights, lazy=lazy, require_connected=False,
                        name=f"one-peer-exponential[shift={shift}]")

    return TimeVaryingTopology(n, at, name="one-peer-exponential", period=tau,
                               info={"exact_after_period": n & (n - 1) == 0})


def random_matchings(
    n: int, seed: int = 0, *, weights: str = "metropolis", lazy: bool = False
) -> TimeVaryingTopology:
    """Random perfect matching per round (one node idles when n is odd); pairs average with 1/2.

    Round t's matching comes from a generator seeded by (seed, t), so any round can be rebuilt on
    its own (same on every process).  Each W is symmetric and doubly stochastic.
    """
    n = _check_n(n, "random_matchings")
    seed = _check_seed(seed, "random_matchings")

    def at(t: int) -> Topology:
        rng = np.random.default_rng(np.random.SeedSequence([seed, t]))
        perm = rng.permutation(n)
        pairs = perm[: n - n % 2].reshape(-1, 2)
        graph = nx.Graph(name="matchings", layout="circular", round=t)
        graph.add_nodes_from(range(n))
        graph.add_edges_from((int(a), int(b)) for a, b in pairs)
        return Topology(graph, rule=weights, lazy=lazy, require_connected=False,
                        name=f"matchings[t={t}]")

    return TimeVaryingTopology(n, at, name="matchings", period=None, info={"seed": seed})


def from_function(
    target: str, n: int, seed: int = 0, *, weights: str = "metropolis", lazy: bool = False
) -> TimeVaryingTopology:
    """The schedule of a user's ``module:function`` ``f(n, t)`` (also ``path/to/file.py:f``):
    round t's graph is ``f(n, t)`` (with ``seed=`` if f takes one), t = 1, 2, ...

    Each round's graph is checked as a static function's is (a networkx graph of n nodes, no
    self-loop); round 1 is built here, so a bad return is refused before a run starts. The
    schedule has no period: a per-arc method keeps a copy for every pair of nodes.
    """
    n = _check_n(n, target)
    fn = load_function(target)

    def at(t: int) -> Topology:
        graph = call_graph(fn, target, n, seed, t)
        return Topology(graph, rule=weights, lazy=lazy, require_connected=False,
                        name=f"{target}[t={t}]")

    schedule = TimeVaryingTopology(n, at, name=target, period=None, info={"seed": seed})
    schedule.at_round(1)
    return schedule
