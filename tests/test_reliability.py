"""Faults and hostile input end in one clean error, never a hang, a lost log or a traceback."""

from __future__ import annotations

import math

import pytest

from gossip.comm.base import CommConfigError
from gossip.comm.world import World
from gossip.errors import GossipError
from tests.conftest import run_py

CONSENSUS = ["experiments/consensus.py", "--nodes", "4", "--dim", "16", "--rounds", "10"]


def clean_error(res, *needles: str) -> str:
    """The run failed with one clean line (no traceback) that contains every needle."""
    err = res.stderr
    assert res.returncode != 0, res.stdout + err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "soon"])
def test_timeout_must_be_positive_seconds(value):
    with pytest.raises(CommConfigError, match="positive number of seconds"):
        World(None, timeout=value)
    with pytest.raises(GossipError):
        World(None).transport(2, timeout=value)


def test_timeout_flag_is_validated():
    for value in ("0", "-1", "nan"):
        res = run_py([*CONSENSUS, "--timeout", value])
        clean_error(res, "--timeout", "positive number of seconds")
