"""The error handler's world (World.current): the one the script detected, and never a second
wait at start-up after the detection itself failed."""

from __future__ import annotations

import pytest

import gossip.comm.world as world_mod
from gossip.comm.world import World
from gossip.errors import CommTimeout


def test_a_failed_detection_is_not_retried_by_the_error_handler(monkeypatch):
    monkeypatch.setattr(world_mod, "_DETECTED", {"world": None, "failed": False})
    calls = []

    def failing(cls, timeout, transport, device):
        calls.append(timeout)
        raise CommTimeout("rank 0 waited 3 s at start-up for the other ranks")

    monkeypatch.setattr(World, "_detect", classmethod(failing))
    with pytest.raises(CommTimeout):
        World.detect(timeout=3)
    lone = World.current()  # what guarded()'s handler uses: no second rendezvous
    assert calls == [3] and lone.size == 1 and lone.link is None


def test_the_handler_gets_the_detected_world(monkeypatch):
    monkeypatch.setattr(world_mod, "_DETECTED", {"world": None, "failed": False})
    world = World.detect(timeout=5, transport="local")
    assert World.current() is world and world.timeout == 5
