"""Loading graphs from files and callables: formats, relabeling, explicit weights, errors."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

import topologies as T
from topologies import GraphFileError, SpecError

DATA = Path(__file__).parents[1] / "data" / "graphs"


def test_edgelist_with_string_labels_comments_and_weights(caplog):
    with caplog.at_level(logging.INFO, logger="topologies.io"):
        g = T.load(DATA / "letters.edgelist")
    assert g.graph["labels"] == {0: "a", 1: "b", 2: "c", 3: "d"}
    assert sorted(g.edges(data="weight")) == [
        (0, 1, 0.25), (0, 2, 0.1), (0, 3, 0.25), (1, 2, 0.25), (2, 3, 0.25)]
    assert "relabeled 4 nodes" in caplog.text and "0<-'a'" in caplog.text
    W = T.mixing_matrix(g, "weights")
    np.testing.assert_allclose(W[0], [0.4, 0.25, 0.1, 0.25])
    np.testing.assert_allclose(W.sum(axis=0), 1)


def test_csv_with_header_and_integer_labels():
    g = T.load(DATA / "weighted.csv")
    assert g.graph["labels"] == {0: 1, 1: 2, 2: 3}  # integer labels stay integers
    assert {w for _, _, w in g.edges(data="weight")} == {0.3}


def test_graphml_numeric_ids_sorted_numerically():
    g = T.load(DATA / "numeric_ids.graphml")
    assert g.graph["labels"] == {0: "0", 1: "1", 2: "2", 3: "10"}
    assert sorted(g.edges()) == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert all(w == 0.25 for _, _, w in g.edges(data="weight"))


def test_gml_uses_labels():
    g = T.load(DATA / "greek.gml")
    assert g.graph["labels"] == {0: "alpha", 1: "beta", 2: "gamma"}
    assert sorted(g.edges()) == [(0, 1), (0, 2)]  # alpha-beta, alpha-gamma


def test_json_node_link_with_links_key():
    g = T.load(DATA / "ring4_links.json")
    assert g.graph["labels"] == {0: 10, 1: 20, 2: 30, 3: 40}
    assert sorted(g.edges()) == [(0, 1), (0, 3), (1, 2), (2, 3)]


def test_round_trip_every_writer(tmp_path):
    src = nx.relabel_nodes(T.ring(5), {i: f"v{i}" for i in range(5)})
    for u, v in src.edges():
        src.edges[u, v]["weight"] = 0.2
    nx.write_graphml(src, tmp_path / "g.graphml")
    nx.write_gml(src, tmp_path / "g.gml")
    (tmp_path / "g.json").write_text(json.dumps(nx.node_link_data(src)))  # "edges" key
    nx.write_weighted_edgelist(src, tmp_path / "g.edgelist")
    nx.write_weighted_edgelist(src, tmp_path / "g.txt", delimiter="\t")
    for name in ("g.graphml", "g.gml", "g.json", "g.edgelist", "g.txt"):
        g = T.load(tmp_path / name)
        assert g.graph["labels"] == {i: f"v{i}" for i in range(5)}, name
        assert nx.is_isomorphic(g, T.ring(5)), name
        assert {w for _, _, w in g.edges(data="weight")} == {0.2}, name


def test_mixed_label_types_sorted_by_str():
    g = nx.Graph([(1, "b"), ("b", (2, 3))])
    out = T.relabel(g)
    assert list(out.graph["labels"].values()) == sorted([1, "b", (2, 3)], key=str)


def test_isolated_node_line_and_directed_graphml(tmp_path):
    (tmp_path / "iso.txt").write_text("0 1\n1 2\n7\n")
    g = T.load(tmp_path / "iso.txt")
    assert g.number_of_nodes() == 4 and g.graph["labels"][3] == 7
    d = nx.DiGraph([("x", "y"), ("y", "z"), ("z", "x")])
    nx.write_graphml(d, tmp_path / "d.graphml")
    loaded = T.load(tmp_path / "d.graphml")
    assert loaded.is_directed() and sorted(loaded.edges()) == [(0, 1), (1, 2), (2, 0)]


def test_missing_file():
    with pytest.raises(GraphFileError, match=r"'no/such/graph.edgelist' does not exist"):
        T.load("no/such/graph.edgelist")


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("bad.graphml", "<graphml><graph><node id=", "could not parse as GraphML"),
        ("bad.gml", "graph [ node [ id 0 ", "could not parse as GML"),
        ("bad.json", "{not json", "could not parse as node-link JSON"),
        ("list.json", "[1, 2]", "node-link JSON"),
        ("bad.edgelist", "a b c d\n", r"bad.edgelist:1: expected 'u v \[weight\]'"),
        ("weight.txt", "0 1\n1 2 heavy\n", r"weight.txt:2: weight 'heavy'"),
        ("empty.edgelist", "# nothing here\n\n", "empty"),
        ("nodes.txt", "0\n1\n", "no edges"),
        ("twice.txt", "0 1 0.5\n1 0 0.25\n", "listed twice with different weights"),
        ("graph.xyz", "0 1\n", "unknown graph file suffix '.xyz'"),
    ],
)
def test_unparsable_files(tmp_path, name, text, match):
    (tmp_path / name).write_text(text)
    with pytest.raises(GraphFileError, match=match):
        T.load(tmp_path / name)


@pytest.mark.parametrize("bad, fragment", [
    ("-1", "signed"), ("+2", "signed"), ("12345678901234567890", "past the largest id"),
    ("$$$", "neither an id"), ("2.5", "neither an id"), ("n" * 201, "more than the 200"),
])
@pytest.mark.parametrize("other", ["0", "a"])
def test_bad_edge_list_labels_are_named_with_their_line(tmp_path, bad, fragment, other):
    """A signed or oversized id, a name too long and a token that is neither an id nor a name
    are errors naming the file and line, on the fast (integer pairs) path and the general one."""
    path = tmp_path / "g.txt"
    path.write_text(f"{other} 1\n1 {bad}\n")
    with pytest.raises(GraphFileError, match=r"g\.txt:2: .*" + fragment):
        T.load(path)


def test_ids_up_to_int64_and_names_with_punctuation_are_labels(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text(f"0 {2**63 - 1}\n0 7\n")
    assert T.load(path).graph["labels"] == {0: 0, 1: 7, 2: 2**63 - 1}
    path.write_text("host-1.lab:22 user@example.org/x\n_b Zürich\n_b host-1.lab:22\n")
    assert sorted(T.load(path).graph["labels"].values()) == sorted(
        ["host-1.lab:22", "user@example.org/x", "_b", "Zürich"])


def test_self_loops_are_named(tmp_path):
    (tmp_path / "loop.edgelist").write_text("a b\nb b\n")
    with pytest.raises(GraphFileError, match=r"loop.edgelist:2: self-loop on node 'b'"):
        T.load(tmp_path / "loop.edgelist")
    nx.write_graphml(nx.Graph([("p", "q"), ("q", "q")]), tmp_path / "loop.graphml")
    with pytest.raises(GraphFileError, match="self-loop on node 'q'"):
        T.load(tmp_path / "loop.graphml")


def test_parallel_edges_rejected(tmp_path):
    nx.write_graphml(nx.MultiGraph([(0, 1), (0, 1), (1, 2)]), tmp_path / "multi.graphml")
    with pytest.raises(GraphFileError, match="parallel edges"):
        T.load(tmp_path / "multi.graphml")


# -- callables --------------------------------------------------------------------------------

MODULE = textwrap.dedent(
    """
    import networkx as nx

    def cycle(n):
        return nx.relabel_nodes(nx.cycle_graph(n), {i: f"node{i:03d}" for i in range(n)})

    def seeded(n, seed=0):
        return nx.connected_watts_strogatz_graph(n, 4, 0.5, seed=seed)

    def wrong_size(n):
        return nx.path_graph(n + 1)

    def not_a_graph(n):
        return [(0, 1)]

    VALUE = 3
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_graphs_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "user_graphs_mod.py"


def test_load_callable(user_module):
    g = T.load_callable("user_graphs_mod:cycle", 6)
    assert nx.is_isomorphic(g, T.ring(6))
    assert g.graph["labels"][5] == "node005"
    a = T.load_callable("user_graphs_mod:seeded", 12, seed=1)
    b = T.load_callable("user_graphs_mod:seeded", 12, seed=2)
    assert sorted(a.edges()) != sorted(b.edges())
    g = T.load_callable(f"{user_module}:cycle", 5)  # path/to/file.py:function
    assert g.number_of_nodes() == 5


def test_load_callable_errors(user_module):
    with pytest.raises(GraphFileError, match="returned a graph with 7 nodes, but n=6"):
        T.load_callable("user_graphs_mod:wrong_size", 6)
    with pytest.raises(GraphFileError, match="returned list"):
        T.load_callable("user_graphs_mod:not_a_graph", 6)
    with pytest.raises(SpecError, match="cannot import module 'no_such_module_xyz'"):
        T.load_callable("no_such_module_xyz:f", 6)
    with pytest.raises(SpecError, match="has no attribute 'missing'"):
        T.load_callable("user_graphs_mod:missing", 6)
    with pytest.raises(SpecError, match="not callable"):
        T.load_callable("user_graphs_mod:VALUE", 6)
    with pytest.raises(SpecError, match="module:function"):
        T.load_callable("no_colon", 6)


def test_integer_pairs_read_fast_as_the_general_parser_does(tmp_path):
    """A plain "u v" file takes the vectorized path; the same file with a comment (the line-by-
    line parser) gives the same graph, labels and all."""
    pairs = "10 20\n20 35\n35 10\n35 7\n"
    fast, slow = tmp_path / "fast.edgelist", tmp_path / "slow.edgelist"
    fast.write_text(pairs)
    slow.write_text("# the same edges\n" + pairs)
    a, b = T.load(fast), T.load(slow)
    assert sorted(a.edges) == sorted(b.edges) and a.graph["labels"] == b.graph["labels"]
    assert a.graph["labels"] == {0: 7, 1: 10, 2: 20, 3: 35}
    loop = tmp_path / "loop.edgelist"
    loop.write_text("1 2\n2 2\n")
    with pytest.raises(GraphFileError, match="loop.edgelist:2: self-loop on node 2"):
        T.load(loop)


def test_an_oversized_edge_list_is_refused_unread(tmp_path, monkeypatch):
    from topologies import io

    path = tmp_path / "big.edgelist"
    path.write_text("0 1\n1 2\n" * 100)
    monkeypatch.setattr(io, "MAX_EDGELIST_BYTES", 100)
    with pytest.raises(GraphFileError, match=r"more than the 0 MiB an edge list may have.*module:function"):
        T.load(path)
