"""What the network subsystem runs on: the nodes of this process as one block, their transport
and the run's records. :class:`gossip.engine.Engine` is one; the network's runs (the event loop,
a free run, the rounds' loss and lateness) read it through this protocol, so that nothing here
imports the engine (the engine sits above the network and drives it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gossip.comm.world import World
    from gossip.core.algorithm import Algorithm
    from gossip.core.block import Block
    from gossip.core.nodes import Node


class Host(Protocol):
    """The process's side of a run, as the network reads it."""

    algorithm: Algorithm
    block: Block
    """The local nodes as rows of one block (what the algorithm's steps and events work on)."""
    transport: Any
    """The world's transport: ``link``, ``placement``, ``timeout``, ``bytes_sent``, ``is_local``."""
    world: World
    topology: Any
    n: int
    seed: int
    nodes: dict[int, Node]
    local_ids: list[int]
    round: int
    """The run's round (a sweep of an asynchronous run); a free run sets it while it records."""

    def record(self, metrics: Any = ()) -> dict[str, Any]:
        """One log record of the current round (collective)."""
        ...

    def node_values(self, local: Mapping[int, float]) -> Any:
        """One float per node gathered on every process (collective)."""
        ...

    def elapsed_s(self) -> float:
        """Wall seconds since the run started (the records' ``time_s``)."""
        ...


__all__ = ["Host"]
