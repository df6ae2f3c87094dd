"""Exact gossip (and D-PSGD) with rows long enough for the fused mix kernel where a process hosts a single
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
    # its local step changes x after the kernel's mix: the send's one-sum check, the replay
    "dpsgd-none-long": ("dpsgd", {"eta": 0.1}, "none", "ring", (5000,)),
}


def engine_for(name: str, n: int, world):
    """:func:`mpi_scenarios.engine_for`, D-PSGD's with the consensus problem's gradients."""
    if not name.startswith("dpsgd"):
        return mpi_scenarios.engine_for(name, n, world)
    import torch

    import topologies
    from gossip.algorithms import make_algorithm
    from gossip.engine import Engine
    from gossip.problems.consensus import Consensus
    from gossip.rng import generator, init_seed

    alg, hp, spec, topo_spec, shape = LONG[name]
    problem = Consensus(torch.randn((n, *shape), generator=generator(init_seed(7, 0)),
                                    dtype=torch.float64), dtype=torch.float64)
    engine = Engine(make_algorithm(alg, **hp), topologies.build(topo_spec, n, seed=3),
                    lambda i: torch.randn(shape, generator=generator(init_seed(5, i)),
                                          dtype=torch.float64),
                    compressor=spec, seed=11, world=world.configure(timeout=60),
                    oracles=lambda i, gen: problem.oracle(i, gen))
    return engine, {}


if __name__ == "__main__":
    mpi_scenarios.SCENARIOS.update(LONG)  # engine_for reads them there (this process only)
    mpi_scenarios.main(engine_for=engine_for, scenarios=LONG)
