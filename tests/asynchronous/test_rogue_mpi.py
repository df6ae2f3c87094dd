"""A rogue peer of an asynchronous run under mpiexec (tests/helpers/mpi_rogue_async.py): what
it sends is checked as a synchronous round checks a message (size, wire header, NaN/Inf), and
the honest rank stops with one line naming the sender, whatever was wrong with it."""

from __future__ import annotations

import re

import pytest

from tests.helpers.launch import mpiexec, run_mpi

needs_mpi = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

EXPECTED = {  # case -> what the honest rank's line says was wrong
    "post-truncated": "message is truncated: 28 bytes",
    "post-appended-1MiB": "message is extended: 1048632 bytes",
    "post-bad-header": "bad magic byte",
    "post-nan": "values contain NaN/Inf",
    "post-sgp-nan-weight": "values contain NaN/Inf",
    "request-garbage": "bad magic byte",
    "reply-inf": "values contain NaN/Inf",
    "request-choco-bad-header": "bad magic byte",
    "reply-choco-bad-header": "bad magic byte",
    "virtual-exchange-nan": "values contain NaN/Inf",
    "virtual-exchange-bad-header": "bad magic byte",
    "virtual-post-inf": "values contain NaN/Inf",
    "snapshot-row-garbage": "sent a snapshot row whose fields",
}


@needs_mpi
@pytest.mark.slow
def test_a_rogue_peers_messages_are_refused_naming_it():
    from tests.helpers.mpi_rogue_async import CASES

    assert set(CASES) == set(EXPECTED)
    res = run_mpi(2, ["tests/helpers/mpi_rogue_async.py"], timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    lines = dict(re.findall(r"^CASE (\S+): (.*)$", res.stdout, re.M))
    assert set(lines) == set(EXPECTED), out[-3000:]
    for case, needle in EXPECTED.items():
        line = lines[case]
        assert needle in line, (case, line)
        if case.startswith("snapshot"):  # not a message of the algorithm's: the rank's record
            assert line.startswith("CommError: free run at ") and "node 1 (rank 1) sent" in line
            continue
        where = "virtual time" if case.startswith("virtual") else "free run at"
        assert line.startswith(f"RowsError: {where} "), (case, line)
        assert "node 0 (rank 0) refused the message from node 1 (rank 1): " in line, (case, line)
