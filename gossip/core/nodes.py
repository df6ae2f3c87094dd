"""What the engine keeps per node besides its row of the block: oracle, generator,
compressors and the views of its state that checkpoints save.

A run may host 10⁶ nodes in one process, so a :class:`Node` is small and lazy: what every
node of the block shares (the round's graph, the round, the seed, the compressor factory)
sits once in :class:`NodeShared`, and a node's topology view, compressor and generator are
made on first use (most runs never ask for them: the block works on rows)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gossip.errors import ConfigError
from gossip.rng import generator as seeded_generator
from gossip.rng import node_seed

if TYPE_CHECKING:
    from gossip.compress.base import Compressor
    from gossip.layout import Layout


@dataclass(eq=False)
class NodeShared:
    """What every node of a block reads alike: ``topology`` (the current round's graph, whose
    views the nodes read), the run ``seed`` and ``device`` (each node's generator is seeded
    from them), the compressor factory, and the ``block`` (the rows the nodes' ``x`` are, and
    the round)."""

    topology: Any
    seed: int
    device: torch.device
    new_compressor: Callable[[], Compressor] | None = None
    block: Any = None
    oracles: Any = None
    """The block's oracles as one object when they were made so (``FullGradientRows``: its
    ``oracle(r)`` is row r's, ``owns(r, oracle)`` tells it from one put in its place), or None."""
    replaced: set[int] = field(default_factory=set)
    """Rows whose node's oracle is not :attr:`oracles`' own (one put in its place, as partial
    activation puts a sleeping one): the block asks those node by node."""


class Node:
    """One hosted node: ``x`` is its row ``row`` of ``block.x``, ``state`` the row views of the
    algorithm's state (what checkpoints save; made when asked, ``block.node_state``), ``view``
    its neighbors and weights this round.

    ``compressor`` encodes the node's main message stream; an extra stream (a gradient
    tracker) gets its own instance from :meth:`stream_compressor`, so stateful compressors
    never mix streams and checkpoints save every one. ``generator`` (a ``torch.Generator``
    seeded from ``(seed, id)``) drives the oracle's sampling; ``oracle`` gives gradients (None
    for pure consensus). ``view``, ``compressor`` and ``generator`` are made on first use."""

    __slots__ = ("id", "row", "layout", "_oracle", "compressors", "_shared",
                 "_compressor", "_generator")

    def __init__(self, id: int, row: int, layout: Layout, shared: NodeShared, *,
                 generator: torch.Generator | None = None, oracle: Any = None,
                 compressor: Compressor | None = None):
        self.id = id
        self.row = row
        self.layout = layout
        self._oracle = oracle
        self.compressors: dict[str, Compressor] = {}
        self._shared = shared
        self._compressor = compressor
        self._generator = generator

    @property
    def oracle(self) -> Any:
        """The node's gradient oracle (None: none)."""
        return self._oracle

    @oracle.setter
    def oracle(self, value: Any) -> None:
        self._oracle = value
        group = self._shared.oracles
        if group is not None:  # the block's oracles as one: note a row that leaves it
            if group.owns(self.row, value):
                self._shared.replaced.discard(self.row)
            else:
                self._shared.replaced.add(self.row)

    @property
    def x(self) -> torch.Tensor:
        """The node's model: its row of the block's ``x`` (a view)."""
        return self._shared.block.x[self.row]

    @property
    def state(self) -> dict[str, Any]:
        """The node's rows of the block's ``state`` and ``arc_state`` (views, made on each call)."""
        return self._shared.block.node_state(self.row)

    @property
    def view(self) -> Any:
        """``topologies.NodeView`` of the current round (the topology caches it)."""
        return self._shared.topology.view(self.id)

    @property
    def round(self) -> int:
        """The round in progress (the block's)."""
        block = self._shared.block
        return 0 if block is None else block.round

    @property
    def new_compressor(self) -> Callable[[], Compressor] | None:
        return self._shared.new_compressor

    @property
    def compressor(self) -> Compressor:
        comp = self._compressor
        if comp is None:
            comp = self._compressor = self._new("the main stream")
        return comp

    @property
    def generator(self) -> torch.Generator:
        gen = self._generator
        if gen is None:
            gen = self._generator = seeded_generator(node_seed(self._shared.seed, self.id),
                                                     self._shared.device)
        return gen

    def _new(self, stream: str) -> Compressor:
        if self._shared.new_compressor is None:
            raise ConfigError(f"node {self.id} has no compressor factory for {stream}",
                              node=self.id)
        return self._shared.new_compressor()

    def stream_compressor(self, stream: str) -> Compressor:
        """A compressor of the run's kind for the message stream ``stream`` (one per name)."""
        comp = self.compressors.get(stream)
        if comp is None:
            comp = self.compressors[stream] = self._new(f"stream {stream!r}")
        return comp

    def weight(self, j: int) -> float:
        """``w_ij``: the weight this node gives to neighbor ``j``'s value (or its own)."""
        if j == self.id:
            return self.view.self_weight
        return self.view.weight_of(j)


class NodeRows(Sequence[Node]):
    """A block's nodes by row, each :class:`Node` made the first time it is read (and kept): a
    block of 10⁶ nodes without gradients never pays for 10⁶ Python objects, which only a few
    paths ask for (checkpoints, per-node views, metrics of a block without rows).

    ``ids[r]`` is row r's node, ``layouts`` one layout for every row or one per row; a node
    made beforehand (with its oracle and generator) is placed with :meth:`put`."""

    __slots__ = ("ids", "any_oracle", "_layouts", "_shared", "_made")

    def __init__(self, ids: list[int], layouts: list[Layout], shared: NodeShared):
        if len(layouts) not in (1, len(ids)) and ids:
            raise ValueError(f"{len(layouts)} layouts for {len(ids)} nodes: give one or one per node")
        self.ids = ids
        self.any_oracle = False
        """Whether a node placed with :meth:`put` has an oracle (made ones have none)."""
        self._layouts = layouts
        self._shared = shared
        self._made: list[Node | None] = [None] * len(ids)

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, r: Any) -> Any:
        if isinstance(r, slice):
            return [self[k] for k in range(*r.indices(len(self._made)))]
        nd = self._made[r]  # (IndexError past the end: what iteration stops on)
        if nd is None:
            r = r + len(self._made) if r < 0 else r
            lay = self._layouts[0] if len(self._layouts) == 1 else self._layouts[r]
            group = self._shared.oracles
            nd = self._made[r] = Node(self.ids[r], r, lay, self._shared,
                                      oracle=None if group is None else group.oracle(r))
        return nd

    def __iter__(self) -> Iterator[Node]:
        for r in range(len(self._made)):
            yield self[r]

    def serve(self, oracles: Any) -> None:
        """Give the rows their oracles as one object (``FullGradientRows`` of these ids, in
        row order): each node made later reads its own, ``oracles.oracle(r)``; a block asks
        them all at once (:meth:`grouped`)."""
        if len(oracles) != len(self._made):
            raise ValueError(f"{len(oracles)} oracles for {len(self._made)} nodes")
        self._shared.oracles = oracles
        self._shared.replaced.clear()
        self.any_oracle = len(self._made) > 0

    def grouped(self, rows: Sequence[int]) -> Any:
        """The oracles object that serves every row of ``rows`` (:meth:`serve`; no node among
        them has another oracle in its place), or None."""
        group = self._shared.oracles
        replaced = self._shared.replaced
        if group is None:
            return None
        if replaced:
            asked = rows if isinstance(rows, range | set) else set(rows)
            if any(r in asked for r in replaced):
                return None
        return group

    def put(self, r: int, node: Node) -> None:
        """Place ``node`` (made with its oracle or generator) at row ``r``."""
        self._made[r] = node
        if node.oracle is not None:
            self.any_oracle = True


class NodeMap(Mapping[int, Node]):
    """The nodes of a :class:`NodeRows` by id, in row order (what ``Engine.nodes`` is): a
    read-only mapping whose nodes are made when read."""

    __slots__ = ("rows", "_first", "_row_of")

    def __init__(self, rows: NodeRows):
        ids = rows.ids
        self.rows = rows
        self._first = ids[0] if ids else 0
        contiguous = not ids or (ids[-1] - ids[0] == len(ids) - 1
                                 and ids == list(range(ids[0], ids[-1] + 1)))
        self._row_of = None if contiguous else {i: r for r, i in enumerate(ids)}

    def row(self, i: Any) -> int | None:
        """Row of node ``i`` (None when the block does not host it)."""
        if self._row_of is not None:
            return self._row_of.get(i)
        if not isinstance(i, int | np.integer):
            return None
        r = int(i) - self._first
        return r if 0 <= r < len(self.rows) else None

    def __getitem__(self, i: int) -> Node:
        r = self.row(i)
        if r is None:
            raise KeyError(i)
        return self.rows[r]

    def __contains__(self, i: object) -> bool:
        return self.row(i) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows.ids)

    def __len__(self) -> int:
        return len(self.rows)
