"""Every built-in algorithm's trajectory is bit-identical to the recorded one (refactorings
must not change a number; regenerate with ``python tests/helpers/trajectories.py --write`` after a
change meant to)."""

import json

import pytest

from tests.helpers import trajectories


def test_trajectories_match_the_recorded_bits():
    golden = json.loads(trajectories.GOLDEN.read_text())
    if golden["platform"] != trajectories.platform_key():
        pytest.skip(f"recorded on {golden['platform']}, this is {trajectories.platform_key()}")
    hashes = trajectories.compute()
    assert set(hashes) == set(golden["hashes"])
    changed = sorted(name for name, digest in hashes.items() if golden["hashes"][name] != digest)
    assert not changed, f"trajectories changed: {changed}"
