"""Graph builders: sizes, degrees, connectivity, reproducibility and argument errors."""

from __future__ import annotations

import networkx as nx
import pytest

import topologies as T
from topologies import MixingMatrixError, TopologyError


def degrees(graph: nx.Graph) -> list[int]:
    return [d for _, d in sorted(graph.degree())]


def check_basic(graph: nx.Graph, n: int) -> None:
    assert sorted(graph.nodes) == list(range(n))
    assert nx.number_of_selfloops(graph) == 0
    if graph.is_directed():
        assert nx.is_strongly_connected(graph)
    else:
        assert nx.is_connected(graph)


@pytest.mark.parametrize(
    "graph, n, edges, degree_set",
    [
        (T.ring(8), 8, 8, {2}),
        (T.ring(2), 2, 1, {1}),
        (T.path(5), 5, 4, {1, 2}),
        (T.torus(16), 16, 32, {4}),
        (T.torus(12), 12, 24, {4}),
        (T.torus(6), 6, 9, {3}),  # 2 x 3: the doubled column edges collapse
        (T.torus(4), 4, 4, {2}),  # 2 x 2 torus = 4-cycle
        (T.grid(40), 40, 67, {2, 3, 4}),
        (T.grid(7), 7, 6, {1, 2}),  # prime n: a 1 x 7 path
        (T.complete(5), 5, 10, {4}),
        (T.star(6), 6, 5, {1, 5}),
        (T.hypercube(16), 16, 32, {4}),
        (T.exponential(8), 8, 20, {5}),
        (T.exponential(12), 12, 36, {6}),  # offsets 1, 2, 4, 8 = -4: still a circulant
        (T.random_regular(20, 3, seed=1), 20, 30, {3}),
        (T.watts_strogatz(20, 4, 0.3, seed=2), 20, 40, None),
    ],
)
def test_deterministic_and_regular_builders(graph, n, edges, degree_set):
    check_basic(graph, n)
    assert graph.number_of_edges() == edges
    if degree_set is not None:
        assert set(degrees(graph)) == degree_set


def test_torus_shape_and_neighbours():
    g = T.torus(12)
    assert g.graph["shape"] == (3, 4)
    assert set(g[0]) == {1, 3, 4, 8}  # right, left wrap, down, up wrap
    g = T.torus(12, rows=2)
    assert g.graph["shape"] == (2, 6)
    assert set(g[0]) == {1, 5, 6}
    assert T.grid(40).graph["shape"] == (5, 8)
    assert T.grid(40, rows=8).graph["shape"] == (8, 5)


def test_star_center_and_hypercube_bits():
    assert T.star(9).degree(0) == 8
    g = T.hypercube(8)
    assert set(g[5]) == {4, 7, 1}


def test_directed_exponential():
    for n, tau in [(8, 3), (12, 4), (2, 1)]:
        g = T.directed_exponential(n)
        assert g.is_directed()
        check_basic(g, n)
        assert {d for _, d in g.in_degree()} == {tau}
        assert {d for _, d in g.out_degree()} == {tau}
    g = T.directed_exponential(8)
    assert set(g.successors(0)) == {1, 2, 4}
    assert set(g.predecessors(0)) == {7, 6, 4}


@pytest.mark.parametrize(
    "make",
    [
        lambda s: T.erdos_renyi(40, 0.2, seed=s),
        lambda s: T.random_regular(30, 4, seed=s),
        lambda s: T.geometric(30, 0.4, seed=s),
        lambda s: T.watts_strogatz(30, 4, 0.3, seed=s),
    ],
)
def test_random_builders_connected_and_reproducible(make):
    a, b, c = make(0), make(0), make(1)
    check_basic(a, a.number_of_nodes())
    assert sorted(a.edges()) == sorted(b.edges())
    assert sorted(a.edges()) != sorted(c.edges())


def test_erdos_renyi_redraws_until_connected():
    g = T.erdos_renyi(30, 0.12, seed=3)  # near the threshold ln(30)/30 = 0.11: may need redraws
    assert nx.is_connected(g) and g.graph["draws"] >= 1
    assert T.erdos_renyi(6, 1.0).number_of_edges() == 15


def test_geometric_keeps_positions():
    g = T.geometric(20, 0.5, seed=0)
    assert all(len(g.nodes[i]["pos"]) == 2 for i in g)


@pytest.mark.parametrize(
    "builder",
    [T.ring, T.path, T.torus, T.grid, T.complete, T.star, T.hypercube, T.exponential,
     T.directed_exponential],
)
@pytest.mark.parametrize("n", [0, 1, -3])
def test_too_few_nodes(builder, n):
    with pytest.raises(TopologyError, match=f"n={n}"):
        builder(n)


@pytest.mark.parametrize("bad", [8.0, "8", True, None])
def test_n_must_be_an_integer(bad):
    with pytest.raises(TopologyError, match="integer"):
        T.ring(bad)


def test_torus_of_prime_n_suggests_alternatives():
    with pytest.raises(TopologyError) as info:
        T.torus(7)
    message = str(info.value)
    assert "n=7" in message and "prime" in message and "grid" in message
    assert "6" in message and "8" in message
    with pytest.raises(TopologyError, match="prime"):
        T.torus(2)


def test_torus_rows_must_divide():
    with pytest.raises(TopologyError, match="valid rows for n=12: 2, 3, 4, 6"):
        T.torus(12, rows=5)
    with pytest.raises(TopologyError, match="rows=1"):
        T.torus(12, rows=1)


def test_hypercube_needs_power_of_two():
    with pytest.raises(TopologyError, match=r"n=12 is not a power of 2.*n=8 or n=16"):
        T.hypercube(12)


def test_random_builder_argument_errors():
    with pytest.raises(TopologyError, match="n \\* k must be even"):
        T.random_regular(5, 3)
    with pytest.raises(TopologyError, match="k < n"):
        T.random_regular(4, 4)
    with pytest.raises(TopologyError, match="perfect matching"):
        T.random_regular(6, 1)
    for p in (0, -0.1, 1.5, "x"):
        with pytest.raises(TopologyError, match="p"):
            T.erdos_renyi(10, p)
    with pytest.raises(TopologyError, match="r"):
        T.geometric(10, 0)
    with pytest.raises(TopologyError, match="k must be even"):
        T.watts_strogatz(10, 3, 0.1)
    with pytest.raises(TopologyError, match="k must satisfy"):
        T.watts_strogatz(10, 10, 0.1)
    with pytest.raises(TopologyError, match="seed"):
        T.erdos_renyi(10, 0.5, seed=-1)


def test_hopeless_random_graphs_give_up_clearly():
    with pytest.raises(MixingMatrixError, match=r"all 100 draws.*increase p"):
        T.erdos_renyi(30, 0.001)
    with pytest.raises(MixingMatrixError, match="increase r"):
        T.geometric(30, 0.01)


def test_topology_error_is_a_value_error():
    assert issubclass(TopologyError, ValueError)
    assert issubclass(MixingMatrixError, TopologyError)
