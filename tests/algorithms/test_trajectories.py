"""Every built-in algorithm's trajectory is bit-identical to the one recorded for this platform
(refactorings must not change a number; regenerate with ``python tests/helpers/trajectories.py
--write`` after a change meant to)."""

import pytest

from tests.helpers import trajectories


def test_trajectories_match_the_recorded_bits():
    recorded = trajectories.recorded()
    golden = recorded.get(trajectories.platform_key())
    if golden is None:
        pytest.skip(f"recorded on {', '.join(recorded)}; this is {trajectories.platform_key()}")
    hashes = trajectories.compute()
    assert set(hashes) == set(golden)
    changed = sorted(name for name, digest in hashes.items() if golden[name] != digest)
    assert not changed, f"trajectories changed: {changed}"
