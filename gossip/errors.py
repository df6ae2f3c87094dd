"""The library's exceptions, in one place: what went wrong, where, and the fix.

``except gossip.GossipError`` catches a bad configuration, a malformed message, a silent
neighbor, a diverged run or an unusable checkpoint alike, while each concrete class also keeps
the builtin base it always had (``ValueError`` for bad input, ``RuntimeError`` for a run that
cannot go on), so existing ``except ValueError`` code keeps working.

Every error may carry where it happened as fields set at construction (``None`` when unknown):
``round``, ``node`` (the node whose round failed), ``sender`` and ``receiver`` (of a refused
message), ``rank`` (the MPI rank) and ``row`` (the message row of a block phase). Handlers read
the fields, never the text.
"""

from __future__ import annotations


class GossipError(Exception):
    """Base class of the library's own exceptions; the message says what was wrong and the fix."""

    def __init__(self, message: str = "", *, round: int | None = None, node: int | None = None,
                 sender: int | None = None, receiver: int | None = None,
                 rank: int | None = None, row: int | None = None):
        super().__init__(message)
        self.round = round
        self.node = node
        self.sender = sender
        self.receiver = receiver
        self.rank = rank
        self.row = row


class ConfigError(GossipError, ValueError):
    """A run was configured with values it cannot run with (named in the message)."""


class CompressionError(GossipError, ValueError):
    """Bad input to a compressor (NaN/Inf, wrong shape) or a malformed byte buffer."""


class RowsError(CompressionError):
    """A message of a block phase was refused; ``sender`` and ``receiver`` name the nodes."""


class DivergenceError(GossipError, RuntimeError):
    """A run blew up: NaN/Inf in a node's state, or an error past the divergence bound."""


class NodeError(GossipError, RuntimeError):
    """A node's round raised; the message names the node, its rank and the round."""
