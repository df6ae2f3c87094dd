"""The root of every exception the library raises on purpose.

``except gossip.GossipError`` catches a bad configuration, a malformed message, a silent
neighbor, a diverged run or an unusable checkpoint alike, while each concrete class also keeps
the builtin base it always had (``ValueError`` for bad input, ``RuntimeError`` for a run that
cannot go on), so existing ``except ValueError`` code keeps working.
"""

from __future__ import annotations


class GossipError(Exception):
    """Base class of the library's own exceptions; the message says what was wrong and the fix."""
