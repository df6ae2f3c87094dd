"""Draw a topology to a PNG: layout by graph kind, edge widths (and labels) from the weights."""

from __future__ import annotations

import os
from pathlib import Path

import networkx as nx
import numpy as np

from .topology import TimeVaryingTopology, Topology

__all__ = ["draw", "layout"]

_SPRING_MAX_N = 400
_LABELS_MAX_N = 64
_EDGE_LABELS_MAX = 40
_ARROWS_MAX = 3000  # above this many edges, arcs are drawn as plain lines (patches are slow)


def layout(graph: nx.Graph) -> dict[int, tuple[float, float]]:
    """Positions: circular for ring-like graphs, grid for torus/grid, 'pos' if set, else spring."""
    nodes = sorted(graph.nodes)
    if "shape" in graph.graph:
        _, cols = graph.graph["shape"]
        return {i: (float(i % cols), -float(i // cols)) for i in nodes}
    if all("pos" in graph.nodes[i] for i in nodes):
        return {i: tuple(map(float, graph.nodes[i]["pos"])) for i in nodes}
    if graph.graph.get("layout") == "circular" or len(nodes) > _SPRING_MAX_N:
        angles = np.pi / 2 - 2 * np.pi * np.arange(len(nodes)) / len(nodes)
        return {i: (float(np.cos(a)), float(np.sin(a))) for i, a in zip(nodes, angles, strict=True)}
    return nx.spring_layout(graph, seed=0)


def _is_wrap(graph: nx.Graph, u: int, v: int) -> bool:
    """True for the wrap-around edges of a torus (drawn curved so they do not hide others)."""
    if graph.graph.get("name") != "torus":
        return False
    _, cols = graph.graph["shape"]
    return abs(u % cols - v % cols) > 1 or abs(u // cols - v // cols) > 1


def draw(
    topology: Topology | TimeVaryingTopology,
    path: str | os.PathLike[str],
    *,
    round: int = 1,
    title: str | None = None,
) -> Path:
    """Write a PNG of the topology (of `round` if time-varying); widths ~ weights, gap in title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    topo = topology.at_round(round)
    graph, n = topo.graph, topo.n
    pos = layout(graph)
    edges = list(graph.edges())
    # weight node v gives to u's value for an arc u -> v; for an edge {u, v} W[u, v] (= W[v, u])
    W = topo._rows
    if edges:
        u, v = np.array(edges, dtype=np.int64).T
        weights = np.asarray(W[v, u], dtype=np.float64).ravel()
    else:
        weights = np.zeros(0)
    wmax = float(weights.max()) if weights.size else 1.0
    widths = 0.6 + 3.4 * weights / wmax if wmax > 0 else np.ones(len(edges))

    fig = Figure(figsize=(7.5, 7.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    directed = graph.is_directed()
    node_size = 420 if n <= 32 else 160 if n <= _LABELS_MAX_N else max(8, 4000 // n)
    common = dict(ax=ax, edge_color="#4a6fa5", alpha=0.85, node_size=node_size)
    wrap = [_is_wrap(graph, u, v) for u, v in edges]
    straight = [k for k, is_wrap in enumerate(wrap) if not is_wrap]
    curved = [k for k, is_wrap in enumerate(wrap) if is_wrap]
    for group, rad in ((straight, 0.12 if directed else 0.0), (curved, 0.35)):
        if not group:
            continue
        style: dict = {"arrows": False}  # a LineCollection: fast, no arrow heads
        if (directed or rad > 0) and len(edges) <= _ARROWS_MAX:  # FancyArrowPatches (slow)
            style = dict(arrows=True, arrowstyle="-|>" if directed else "-", arrowsize=12,
                         connectionstyle=f"arc3,rad={rad}")
        if group is curved:  # torus wrap-around edges: lighter, so the grid stays readable
            style.update(edge_color="#a9bcd8", style="dashed")
        nx.draw_networkx_edges(
            graph, pos, edgelist=[edges[k] for k in group], width=[widths[k] for k in group],
            **{**common, **style},
        )
    self_weights = topo._rows.diagonal()
    nodes = nx.draw_networkx_nodes(
        graph, pos, ax=ax, node_size=node_size, node_color=self_weights, cmap="YlOrRd",
        vmin=0.0, vmax=1.0, edgecolors="#333333",
        linewidths=0.6,
    )
    fig.colorbar(nodes, ax=ax, shrink=0.6, label="self weight W[i, i]")
    if n <= _LABELS_MAX_N:
        for dark in (False, True):  # white ids on dark (high self weight) nodes
            ids = {i: str(i) for i in range(n) if (self_weights[i] > 0.6) == dark}
            nx.draw_networkx_labels(graph, pos, labels=ids, ax=ax, font_size=8 if n <= 32 else 6,
                                    font_color="white" if dark else "black")
    if not directed and len(edges) <= _EDGE_LABELS_MAX and straight:
        labels = {edges[k]: f"{weights[k]:.3g}" for k in straight}
        nx.draw_networkx_edge_labels(graph, pos, edge_labels=labels, ax=ax, font_size=7,
                                     label_pos=0.5, rotate=False)
    if title is None:
        head = f"{topology.name}" + (f", round {round}" if topology.time_varying else "")
        title = (f"{head}: n={n}, {len(edges)} {'arcs' if directed else 'edges'}, "
                 f"weights={topo.rule}{' (lazy)' if topo.lazy else ''}\n")
        if topology.time_varying:
            info = topology.describe()
            if info["product_rho"] is not None:
                title += (f"rho of the product over {info['product_rounds']} rounds = "
                          f"{info['product_rho']:.4g}")
        else:
            title += (f"spectral gap = {topo.gap:.4g}   rho = {topo.rho:.4g}   "
                      f"beta = {topo.beta:.4g}")
    ax.set_title(title, fontsize=10)
    ax.set_axis_off()
    ax.set_aspect("equal")
    ax.margins(0.08)
    path = Path(path)
    fig.savefig(path, bbox_inches="tight")
    return path
