"""Topology / NodeView / TimeVaryingTopology, and the `parse` / `build` entry points."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import topologies as T
from topologies import (
    MixingMatrixError,
    NodeView,
    SpecError,
    TimeVaryingTopology,
    Topology,
    TopologyError,
)

DATA = Path(__file__).parents[1] / "data" / "graphs"


# -- Topology and NodeView -----------------------------------------------------------------------


def test_ring_views():
    topo = Topology(T.ring(8))
    assert (topo.n, topo.name, topo.directed, topo.time_varying) == (8, "ring", False, False)
    v = topo.view(0)
    assert isinstance(v, NodeView)
    assert v.node == 0 and v.in_neighbors == (1, 7) == v.out_neighbors == v.neighbors
    assert v.weights == v.in_weights == pytest.approx((1 / 3, 1 / 3))
    assert v.self_weight == pytest.approx(1 / 3)
    assert v.weight_of(7) == pytest.approx(1 / 3) and v.weight_of(0) == v.self_weight
    assert topo.view(0) is v  # cached
    assert topo.view(np.int64(3)).neighbors == (2, 4)


def test_weight_of_non_neighbor_is_clear():
    v = Topology(T.ring(8)).view(0)
    with pytest.raises(KeyError) as info:
        v.weight_of(4)
    assert isinstance(info.value, TopologyError)
    assert str(info.value).startswith("node 4 is not an in-neighbor of node 0")


@pytest.mark.parametrize("spec,n", [("ring", 7), ("torus", 16), ("regular:k=3", 20),
                                    ("star", 6), ("directed-exponential", 9), ("complete", 5)])
def test_out_neighbor_lists_are_the_views_out_neighbors(spec, n):
    topo = T.build(spec, n)
    assert topo.out_neighbor_lists() == [list(topo.view(i).out_neighbors) for i in range(n)]


def test_view_out_of_range():
    topo = Topology(T.ring(4))
    with pytest.raises(IndexError, match="node 4 is out of range"):
        topo.view(4)
    with pytest.raises(TopologyError, match="integer"):
        topo.view(1.5)


def test_views_sum_to_one_and_match_w():
    topo = Topology(T.erdos_renyi(25, 0.3, seed=2))
    W = topo.dense()
    for i in range(topo.n):
        v = topo.view(i)
        assert v.self_weight + sum(v.weights) == pytest.approx(1)
        assert list(v.in_neighbors) == sorted(v.in_neighbors)
        assert v.in_neighbors == tuple(j for j in range(topo.n) if j != i and W[i, j] != 0)
        assert v.out_neighbors == tuple(j for j in range(topo.n) if j != i and W[j, i] != 0)


def test_directed_views():
    topo = T.build("directed-exponential", 8)
    assert topo.directed
    v = topo.view(0)
    assert v.in_neighbors == (4, 6, 7)  # receives from 0 - 2^m
    assert v.out_neighbors == (1, 2, 4)  # sends to 0 + 2^m
    assert v.weights == pytest.approx((0.25,) * 3) and v.self_weight == pytest.approx(0.25)
    assert topo.gap == pytest.approx(0.5)
    assert topo.lambda2 is None


def test_w_is_read_only_and_dense_is_a_copy():
    topo = Topology(T.ring(5))
    with pytest.raises(ValueError):
        topo.W[0, 0] = 1.0
    d = topo.dense()
    d[0, 0] = 5
    assert topo.W[0, 0] == pytest.approx(1 / 3)


def test_explicit_w_and_lazy():
    g = T.ring(6)
    W = T.mixing_matrix(g)
    topo = Topology(g, W, name="mine")
    assert topo.rule == "explicit" and topo.name == "mine"
    lazy = Topology(g, W, lazy=True)
    np.testing.assert_allclose(lazy.dense(), (np.eye(6) + W) / 2)
    assert Topology(g, rule="max-degree", lazy=True).gap == pytest.approx(lazy.gap)
    bad = W.copy()
    bad[0, 0] += 0.1
    with pytest.raises(MixingMatrixError):
        Topology(g, bad)
    sparse = Topology(g, sp.csr_array(W))
    assert sparse.view(2) == topo.view(2)


def test_non_integer_nodes_are_relabeled():
    g = nx.relabel_nodes(T.ring(4), {0: "w", 1: "x", 2: "y", 3: "z"})
    topo = Topology(g)
    assert topo.graph.graph["labels"] == {0: "w", 1: "x", 2: "y", 3: "z"}
    with pytest.raises(TopologyError, match="relabel"):
        Topology(g, np.eye(4))


def test_at_round_and_describe():
    topo = Topology(T.torus(16))
    assert topo.at_round(1) is topo and topo.at_round(1000) is topo
    with pytest.raises(TopologyError, match="t = 1, 2"):
        topo.at_round(0)
    info = topo.describe()
    assert info["n"] == 16 and info["edges"] == 32
    assert (info["degree_min"], info["degree_mean"], info["degree_max"]) == (4, 4.0, 4)
    assert info["gap"] == pytest.approx(0.4) and info["rho"] == pytest.approx(0.6)
    assert info["beta"] == pytest.approx(1.6) and info["weights"] == "metropolis"
    assert "Topology(name='torus'" in repr(topo)


def test_large_sparse_topology_views():
    topo = T.build("ring", 10_000)
    assert sp.issparse(topo.W)
    v = topo.view(0)
    assert v.neighbors == (1, 9999) and v.self_weight == pytest.approx(1 / 3)
    assert topo.view(5000).neighbors == (4999, 5001)


# -- time-varying ----------------------------------------------------------------------------------


def J(n):
    return np.full((n, n), 1 / n)


@pytest.mark.parametrize("n", [8, 16, 32])
def test_one_peer_exponential_is_exact_for_powers_of_two(n):
    tv = T.build("one-peer-exponential", n)
    assert isinstance(tv, TimeVaryingTopology) and tv.time_varying
    tau = n.bit_length() - 1
    assert tv.period == tau
    np.testing.assert_allclose(tv.product(tau), J(n), atol=1e-12)
    np.testing.assert_allclose(tv.product(tau, start=3), J(n), atol=1e-12)
    assert tv.describe()["product_rho"] == pytest.approx(0, abs=1e-12)


def test_one_peer_exponential_not_exact_otherwise():
    tv = T.one_peer_exponential(12)
    assert tv.period == 4
    residual = np.linalg.norm(tv.product(4) - J(12), 2)
    assert residual == pytest.approx(0.21, abs=0.01)


def test_one_peer_rounds():
    n = 12
    tv = T.one_peer_exponential(n)
    for t in range(1, 6):
        topo = tv.at_round(t)
        shift = 1 << ((t - 1) % 4)
        W = topo.dense()
        np.testing.assert_allclose(W.sum(0), 1)
        np.testing.assert_allclose(W.sum(1), 1)
        v = topo.view(5)
        assert v.in_neighbors == ((5 - shift) % n,) and v.out_neighbors == ((5 + shift) % n,)
        assert v.weights == (0.5,) and v.self_weight == 0.5
    assert tv.at_round(5) is tv.at_round(1)
    with pytest.raises(TopologyError, match="t = 1, 2"):
        tv.at_round(0)


def test_random_matchings():
    tv = T.random_matchings(9, seed=4)
    assert tv.period is None
    rounds = [tv.at_round(t).dense() for t in range(1, 6)]
    for W in rounds:
        np.testing.assert_array_equal(W, W.T)
        np.testing.assert_allclose(W.sum(0), 1)
        assert sorted(np.round(np.diag(W), 12)).count(1.0) == 1  # one idle node (n odd)
        assert set(np.round(W[W > 0], 12)) <= {0.5, 1.0}
    assert any(not np.array_equal(rounds[0], W) for W in rounds[1:])
    fresh = T.build("matchings", 9, seed=4)  # any round on its own, in any order
    np.testing.assert_array_equal(fresh.at_round(5).dense(), rounds[4])
    np.testing.assert_array_equal(fresh.at_round(2).dense(), rounds[1])
    other = T.build("matchings:seed=5", 9, seed=4)
    assert not np.array_equal(other.at_round(1).dense(), rounds[0])
    even = T.random_matchings(10)
    assert all(even.at_round(t).view(0).self_weight == 0.5 for t in range(1, 4))


# one peer per round: alternating-ring (any n >= 2) and alternating-exp-ring (n a power of 2)


def pairs_of(topo):
    """The round's pairs (i < j) and the nodes left out, checking W = I - (1/2) sum over pairs
    (e_i - e_j)(e_i - e_j)^T: symmetric, doubly stochastic, at most one peer per node."""
    W = topo.dense()
    n = W.shape[0]
    np.testing.assert_array_equal(W, W.T)
    np.testing.assert_allclose(W.sum(0), 1, atol=0)
    np.testing.assert_allclose(W.sum(1), 1, atol=0)
    assert topo.degrees().max() <= 1
    pairs = sorted((int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(W, 1)), strict=True))
    want = np.eye(n)
    for i, j in pairs:
        want[[i, i, j, j], [i, j, i, j]] = 0.5
    np.testing.assert_array_equal(W, want)
    paired = {i for pair in pairs for i in pair}
    return pairs, sorted(set(range(n)) - paired)


def contraction(tv):
    """||prod of W over one period - J||_2: the period's norm on the mean-zero subspace."""
    return np.linalg.norm(tv.product(tv.period) - J(tv.n), 2)


def decent_dp_ring(n, step):
    """Decent-DP 0.2.3's one-peer ring (topo.py, RingTopology), matching step mod 2: (i, i+1)
    for i even, then (i-1, i) for i even."""
    if step % 2 == 0:
        return sorted(tuple(sorted((i, (i + 1) % n))) for i in range(0, n, 2))
    return sorted(tuple(sorted((i, (i - 1) % n))) for i in range(0, n, 2))


def decent_dp_exp_ring(n, step):
    """Decent-DP 0.2.3's alternating exp-ring (AlternatingExpRingTopology) with one rank per
    machine, the pairs of its step mod 2 log2(n): for offsets 2^m, the greedy scan j = 0, 1, ...
    pairs each unused j with j + 2^m; the pairs, counted over all offsets, go to step 2m + 1
    when the count is even and to step 2m when odd."""
    steps, count = [], 0
    for m in range(n.bit_length() - 1):
        steps += [[], []]
        used = [False] * n
        for j in range(n):
            if not used[j]:
                k = (j + (1 << m)) % n
                used[j] = used[k] = True
                steps[-1 if count % 2 == 0 else -2].append(tuple(sorted((j, k))))
                count += 1
    return sorted(steps[step % len(steps)])


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 31, 32, 33])
def test_alternating_ring_pairs_ring_neighbors_one_peer_per_round(n):
    tv = T.build("alternating-ring", n)
    assert isinstance(tv, TimeVaryingTopology) and tv.time_varying and tv.n == n
    ring = {tuple(sorted((i, (i + 1) % n))) for i in range(n)}
    used, before = set(), None
    for t in range(1, 2 * tv.period + 1):
        pairs, idle = pairs_of(tv.at_round(t))
        assert set(pairs) <= ring and len(pairs) == n // 2 and len(idle) == n % 2
        if n % 2 == 0:
            assert pairs == decent_dp_ring(n, t)  # Decent-DP's k-th exchange uses step k
        used.update(pairs)
        if before is not None and n > 3:  # a node active twice in a row switches sides ...
            wrap = {(1, 2)} if n % 2 and t % tv.period == 1 else set()  # ... but where k jumps
            assert set(pairs) & set(before) == wrap
        before = pairs
        assert tv.at_round(t + tv.period) is tv.at_round(t)
    assert used == ring
    assert tv.period == (2 if n % 2 == 0 else min(n, 4))
    assert contraction(tv) < 1 - 1e-3
    assert tv.describe()["product_rho"] == pytest.approx(contraction(tv), abs=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_alternating_exp_ring_is_decent_dps_schedule(n):
    tv = T.build("alternating-exp-ring", n)
    tau = n.bit_length() - 1
    assert tv.period == 2 * tau
    for t in range(1, tv.period + 1):
        pairs, idle = pairs_of(tv.at_round(t))
        assert pairs == decent_dp_exp_ring(n, t)
        offset = 1 << ((t % tv.period) // 2)
        assert all(j - i == offset for i, j in pairs) and len(pairs) == n // 4 or n == 2
    for m in range(tau):  # each node exchanges in exactly one of the two rounds of offset 2^m
        steps = [t for t in range(1, tv.period + 1) if (t % tv.period) // 2 == m]
        counts = np.zeros(n, dtype=int)
        for t in steps:
            for pair in pairs_of(tv.at_round(t))[0]:
                counts[list(pair)] += 1
        np.testing.assert_array_equal(counts, 1)
    assert contraction(tv) < 1 - 1e-3


@pytest.mark.parametrize("n", [3, 5, 6, 12, 24, 100])
def test_alternating_exp_ring_refuses_n_not_a_power_of_two(n):
    with pytest.raises(TopologyError):
        T.build("alternating-exp-ring", n)
    with pytest.raises(TopologyError):
        T.alternating_exp_ring(n)


@pytest.mark.parametrize("spec", ["alternating-ring", "alternating-exp-ring"])
def test_one_peer_schedules_by_name(spec):
    with pytest.raises(TopologyError):
        T.build(spec, 1)
    with pytest.raises(SpecError, match="time-varying"):
        T.parse(spec, 8)
    lazy = T.build(spec.replace("-", "_").upper(), 8, lazy=True, weights="max-degree")
    W = lazy.at_round(1).dense()
    np.testing.assert_allclose(W, (np.eye(8) + T.build(spec, 8).at_round(1).dense()) / 2)
    assert T.build("one-peer-ring", 6).name == "alternating-ring"


# -- parse and build -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, n, edges",
    [
        ("ring", 8, 8),
        ("path", 8, 7),
        ("torus", 12, 24),
        ("torus:rows=2", 12, 18),
        ("grid", 12, 17),
        ("grid:rows=2", 12, 16),
        ("complete", 6, 15),
        ("star", 6, 5),
        ("hypercube", 8, 12),
        ("exponential", 8, 20),
        ("directed-exponential", 8, 24),
        ("directed_exponential", 8, 24),
        ("Erdos-Renyi:p=1", 6, 15),
        ("regular:k=4", 10, 20),
        ("regular:k=3,seed=9", 10, 15),
        ("geometric:r=2", 7, 21),
        ("watts-strogatz", 12, 24),
        ("watts-strogatz:k=6,p=0.1", 12, 36),
    ],
)
def test_parse_named_specs(spec, n, edges):
    g = T.parse(spec, n)
    assert g.number_of_nodes() == n and g.number_of_edges() == edges


def test_parse_seed_argument():
    a, b = T.parse("erdos-renyi:p=0.3", 20, seed=1), T.parse("erdos-renyi:p=0.3", 20, seed=2)
    assert sorted(a.edges()) != sorted(b.edges())
    assert sorted(T.parse("erdos-renyi:p=0.3,seed=2", 20, seed=1).edges()) == sorted(b.edges())


def test_parse_files(tmp_path, monkeypatch):
    g = T.parse(str(DATA / "letters.edgelist"), 4)
    assert g.graph["labels"][0] == "a"
    assert T.parse(str(DATA / "ring4_links.json"), None).number_of_nodes() == 4
    with pytest.raises(SpecError, match=r"has 4 nodes but n=5.*--nodes 4"):
        T.parse(str(DATA / "letters.edgelist"), 5)
    (tmp_path / "plainname").write_text("0 1\n1 2\n2 0\n")
    monkeypatch.chdir(tmp_path)
    assert T.parse("plainname", 3).number_of_edges() == 3  # an existing file without suffix
    with pytest.raises(T.GraphFileError, match="does not exist"):
        T.parse("missing.edgelist", 3)


def spec_module(n):
    """A user function for the module:function form."""
    return nx.circular_ladder_graph(n // 2)


def test_parse_callables(tmp_path, monkeypatch):
    (tmp_path / "my_topo_mod.py").write_text(textwrap.dedent(
        """
        import networkx as nx

        def wheel(n):
            return nx.wheel_graph(n)
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert T.parse("my_topo_mod:wheel", 7).number_of_edges() == 12
    assert T.parse(f"{__file__}:spec_module", 8).number_of_edges() == 12
    topo = T.build("my_topo_mod:wheel", 7)
    assert topo.name == "my_topo_mod:wheel" and topo.n == 7


@pytest.mark.parametrize(
    "spec, match",
    [
        ("rign", r"unknown topology 'rign' \(did you mean 'ring'\?\)"),
        ("banana", r"(?s)valid specs:\n.*ring.*\n.*erdos-renyi:p=P"),
        ("erdos-renyi", r"needs parameter 'p' \(edge probability"),
        ("erdos-renyi:p=abc", r"parameter 'p' must be a number"),
        ("regular:k=2.5", r"parameter 'k' must be an integer"),
        ("torus:cols=3", r"unknown parameter 'cols' for 'torus'; valid: rows"),
        ("ring:k=3", r"unknown parameter 'k' for 'ring'; valid: none"),
        ("watts-strogatz:k", r"parameter 'k' is not of the form key=value"),
        ("regular:k=3,k=4", r"parameter 'k' is given twice"),
        ("", "empty topology spec"),
        ("one-peer-exponential", r"time-varying.*topologies.build"),
    ],
)
def test_parse_errors(spec, match):
    with pytest.raises(SpecError, match=match):
        T.parse(spec, 12)


def test_builder_errors_pass_through_parse():
    with pytest.raises(TopologyError, match="prime"):
        T.parse("torus", 13)
    with pytest.raises(TopologyError, match="power of 2"):
        T.build("hypercube", 12)


def test_build_every_form():
    assert isinstance(T.build("ring", 8), Topology)
    assert T.build("ring", 8, weights="uniform").rule == "uniform"
    assert T.build("ring", 8, lazy=True).gap == pytest.approx(0.0976, abs=6e-5)
    assert T.build("torus:rows=4", 16).name == "torus:rows=4"
    assert isinstance(T.build("one-peer", 8), TimeVaryingTopology)
    assert T.build("matchings", 8, lazy=True).at_round(1).view(0).self_weight == 0.75
    assert T.build(str(DATA / "letters.edgelist"), None, weights="weights").view(0).weights == (
        pytest.approx((0.25, 0.1, 0.25)))
    with pytest.raises(T.MixingMatrixError, match="unknown weight rule"):
        T.build("ring", 8, weights="best")


def test_build_warns_when_weights_are_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="topologies.factory"):
        topo = T.build(str(DATA / "letters.edgelist"), 4)
    assert topo.rule == "metropolis"
    assert "weights='weights'" in caplog.text


SCHEDULES = textwrap.dedent(
    """
    import networkx as nx
    import numpy as np

    CALLS = []

    def shifting(n, t):
        CALLS.append(t)
        g = nx.Graph()
        g.add_nodes_from(range(n))
        shift = 1 + (t - 1) % (n - 1)
        g.add_edges_from((i, (i + shift) % n) for i in range(n))
        return g

    def matched(n, t, seed=0):
        perm = np.random.default_rng([seed, t]).permutation(n)
        return nx.Graph([tuple(map(int, p)) for p in perm.reshape(-1, 2)])

    def static_seeded(n, seed=0):
        return nx.cycle_graph(n)

    def late_garbage(n, t):
        return nx.cycle_graph(n) if t < 3 else "a ring"

    def shrinking(n, t):
        return nx.cycle_graph(n - t)

    def loop(n, t):
        g = nx.cycle_graph(n)
        g.add_edge(0, 0)
        return g
    """
)


@pytest.fixture
def schedules(tmp_path, monkeypatch):
    path = tmp_path / "user_schedules_mod.py"
    path.write_text(SCHEDULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def test_a_function_of_n_and_t_is_a_time_varying_topology(schedules):
    import user_schedules_mod as mod

    for spec in ("user_schedules_mod:shifting", f"{schedules}:shifting"):
        tv = T.build(spec, 6)
        assert isinstance(tv, TimeVaryingTopology) and tv.n == 6 and tv.period is None
        for t in (1, 2, 5, 6, 7):
            assert sorted(tv.at_round(t).graph.edges()) == sorted(mod.shifting(6, t).edges())
    a, b = T.build("user_schedules_mod:matched", 8, seed=1), T.build("user_schedules_mod:matched", 8, seed=2)
    assert sorted(a.at_round(3).graph.edges()) != sorted(b.at_round(3).graph.edges())  # seed= reaches f
    static = T.build("user_schedules_mod:static_seeded", 6)  # f(n, seed=...) stays static
    assert not static.time_varying
    with pytest.raises(SpecError, match="time-varying"):
        T.parse("user_schedules_mod:shifting", 6)


def test_a_bad_round_graph_is_a_one_line_error_naming_the_round(schedules):
    tv = T.build("user_schedules_mod:late_garbage", 5)  # rounds 1 and 2 are fine
    with pytest.raises(T.GraphFileError, match=r"round t=3\) returned str") as err:
        tv.at_round(3)
    assert "\n" not in str(err.value)
    with pytest.raises(T.GraphFileError, match=r"round t=1\) returned a graph with 5 nodes, but n=6"):
        T.build("user_schedules_mod:shrinking", 6)  # refused when built: round 1 is checked
    with pytest.raises(T.GraphFileError, match=r"round t=1\).*self-loop on node 0"):
        T.build("user_schedules_mod:loop", 6)
    with pytest.raises(SpecError, match="cannot import module 'no_such_schedule_mod'"):
        T.build("no_such_schedule_mod:f", 6)


def test_every_time_varying_name_has_its_builder():
    from topologies.spec import TIME_VARYING, Entry

    for name, entry in TIME_VARYING.items():
        tv = T.build(name, 8)
        assert tv.time_varying and entry.build.__module__ == "topologies.timevarying"
    by_name, by_function = T.build("matchings:seed=3", 8), T.random_matchings(8, 3)
    assert by_name.at_round(2).graph.edges() == by_function.at_round(2).graph.edges()
    with pytest.raises(SpecError, match="no builder"):
        Entry("spinning", None)
    TIME_VARYING.register("shuffles", Entry("shuffles", "random_matchings", module="timevarying"))
    try:  # a new name builds with its own builder
        assert T.build("shuffles", 8, seed=5).name == "matchings"
    finally:
        del TIME_VARYING.objects["shuffles"]
