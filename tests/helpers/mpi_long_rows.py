"""Exact gossip with rows long enough for the fused mix kernel where a process hosts a single
node (:func:`gossip.compress.dispatch.dense_mix`): under ``mpiexec -n 4`` with 4 nodes every rank
mixes by the kernel, in process the block of 4 rows takes the numpy path; tests/engine/test_mpi.py
compares the files. Kept apart from :mod:`tests.helpers.mpi_scenarios`, whose scenarios are the
trajectory guard's too. Usage: python tests/helpers/mpi_long_rows.py OUT.jsonl NODES
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers import mpi_scenarios  # noqa: E402

LONG = {  # γ ≠ 1: the kernel's x + γ·sum rounds as torch's add_(alpha=γ)
    "gossip-none-long": ("gossip", {"gamma": 0.8}, "none", "erdos-renyi:p=0.4", (5000,)),
}

if __name__ == "__main__":
    mpi_scenarios.SCENARIOS.update(LONG)  # engine_for reads them there (this process only)
    mpi_scenarios.main(scenarios=LONG)
