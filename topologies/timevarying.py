"""Time-varying topologies: one graph per round, each with its own (doubly stochastic) W."""

from __future__ import annotations

import numpy as np

from .builders import _check_n, _check_seed, _tau
from .edgelist import EdgeList
from .errors import TopologyError
from .io import call_graph, load_function
from .topology import TimeVaryingTopology, Topology

__all__ = [
    "alternating_exp_ring", "alternating_ring", "from_function", "one_peer_exponential",
    "random_matchings",
]


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
        i = np.arange(n, dtype=np.int64)
        graph = EdgeList(n, i, (i + shift) % n, directed=True,
                         attrs={"name": "one-peer-exponential", "layout": "circular", "shift": shift})
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
        pairs = perm[: n - n % 2].reshape(-1, 2).astype(np.int64)
        graph = EdgeList(n, pairs[:, 0], pairs[:, 1],
                         attrs={"name": "matchings", "layout": "circular", "round": t})
        return Topology(graph, rule=weights, lazy=lazy, require_connected=False,
                        name=f"matchings[t={t}]")

    return TimeVaryingTopology(n, at, name="matchings", period=None, info={"seed": seed})


def _pairs(n: int, pairs: list[tuple[int, int]], name: str, weights: str, lazy: bool) -> Topology:
    """One round of pairwise averaging: the graph of `pairs` (a matching) on nodes 0..n-1.

    Every node has degree 0 or 1, so every weight rule gives 1/2 on a pair and 1 to an idle
    node: W = I - (1/2) sum over pairs (e_i - e_j)(e_i - e_j)^T, symmetric, doubly stochastic.
    """
    ends = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    graph = EdgeList(n, ends[:, 0], ends[:, 1], attrs={"name": name, "layout": "circular"})
    return Topology(graph, rule=weights, lazy=lazy, require_connected=False, name=name)


def alternating_ring(
    n: int, *, weights: str = "metropolis", lazy: bool = False
) -> TimeVaryingTopology:
    """One-peer ring: every node averages with its right, then its left ring neighbor, in turn.

    Round t (t = 1, 2, ...) leaves out node k and pairs the others along the ring after it,
    (k+1, k+2), (k+3, k+4), ... (mod n), floor(n/2) pairs: one message out and one in per node.

    * Even n: k = (t - 1) mod 2 and no node is left out (the pairs wrap around to k): the
      ring's two perfect matchings in turn, period 2.  Odd rounds pair (1, 2), (3, 4), ...,
      (n-1, 0), even rounds (0, 1), (2, 3), ..., (n-2, n-1): Decent-DP's ``ring`` (Wang et al.,
      ICLR'25, arXiv 2410.11998; ``decent_dp/topo.py``, v0.2.3) round for round, whose k-th
      exchange (k = 1, 2, ...) uses its matching k mod 2.
    * Odd n (Decent-DP refuses it; an odd ring has no perfect matching): node k = (t - 1) mod 4
      idles (k = (t - 1) mod 3 for n = 3), period 4.  While k moves by one, every node that
      exchanges in two consecutive rounds switches sides; only where k jumps back from 3 to 0
      does one pair, (1, 2), meet twice in a row.  The four rounds use every edge of the ring,
      so their product contracts.  By the asymptotic rate per round it needs 1.05-1.2x the
      rounds of the even ring of n + 1 nodes (n = 9..101).  Three fixed matchings (period 3)
      make most nodes meet the same neighbor twice at each wrap and need 1.1-1.4x the rounds
      for 9 <= n <= 101; idling every node in turn (period n) needs 0.8-0.95x the rounds but
      keeps n rounds' matrices.
    """
    n = _check_n(n, "alternating_ring")
    period = 2 if n % 2 == 0 else min(n, 4)

    def at(t: int) -> Topology:
        k = (t - 1) % period
        pairs = [((k + 1 + 2 * m) % n, (k + 2 + 2 * m) % n) for m in range(n // 2)]
        return _pairs(n, pairs, f"alternating-ring[t={t}]", weights, lazy)

    return TimeVaryingTopology(n, at, name="alternating-ring", period=period,
                               info={"idle_per_round": n % 2})


def alternating_exp_ring(
    n: int, *, weights: str = "metropolis", lazy: bool = False
) -> TimeVaryingTopology:
    """Decent-DP's alternating exponential ring, one node per process: pairs i ~ i + 2^m, half
    of them per round.

    For each offset d = 2^m (m = 0, ..., log2(n) - 1) the nodes j with j & d == 0 pair with
    j + d (a perfect matching); these n/2 pairs, in increasing j, are dealt alternately to two
    rounds, so each node exchanges in one of the two and keeps its model in the other.  The
    period is 2 log2(n) rounds; round t uses the schedule's step t mod period, as Decent-DP's
    k-th exchange does (k = 1, 2, ...): step 2m + 1 holds the 1st, 3rd, ... pairs of offset
    2^m, step 2m the 2nd, 4th, ... (n = 2: the one pair exchanges in odd rounds only).

    Source: ``AlternatingExpRingTopology`` in ``decent_dp/topo.py`` of Decent-DP 0.2.3 (Wang et
    al., "From Promise to Practice", ICLR'25, arXiv 2410.11998, Fig. 12).  Decent-DP builds it
    over machines of LOCAL_WORLD_SIZE ranks: a round averages the ranks of a machine pair (2L
    ranks) or of each machine alone (L ranks), so with L > 1 a node talks to more than one peer.
    This is its schedule for L = 1 (each node its own machine), where the second kind of round
    leaves a node idle.  Like Decent-DP, n must be a power of 2.
    """
    n = _check_n(n, "alternating_exp_ring")
    if n & (n - 1):
        low = 1 << (n.bit_length() - 1)
        raise TopologyError(
            f"alternating_exp_ring: n={n} is not a power of 2 (Decent-DP's rule pairs i with "
            f"i + 2^m); use n={low} or n={2 * low}, or 'one-peer-exponential' or "
            "'alternating-ring', which work for any n"
        )
    period = 2 * _tau(n)

    def at(t: int) -> Topology:
        step = t % period
        offset = 1 << (step // 2)
        lows = [j for j in range(n) if not j & offset]
        dealt = lows[0::2] if step % 2 else lows[1::2]
        pairs = [(j, j + offset) for j in dealt]
        return _pairs(n, pairs, f"alternating-exp-ring[offset={offset},t={t}]", weights, lazy)

    return TimeVaryingTopology(n, at, name="alternating-exp-ring", period=period, info={})


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
