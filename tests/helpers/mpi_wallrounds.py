"""Synchronous rounds in wall-clock time (gossip/network/clock.py), one node per rank: each
scenario runs D-PSGD twice, paced (``free_run=SCALE``) and not, and writes both runs' records
to a JSON-lines file (``run`` = "paced" / "plain"). Then a paced robust-push-sum whose node 1
sends a running sum with a counter from the future in round 3 (:func:`rogue`): its receiver
prints ``ROGUE rank R: ERROR`` and aborts the job. Started under mpiexec by
tests/engine/test_wallrounds_mpi.py.
Usage: python tests/helpers/mpi_wallrounds.py OUT.jsonl SCALE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.metrics import JsonlLogger, squared_distance  # noqa: E402
from gossip.problems import make_problem  # noqa: E402

ROUNDS, LOG_EVERY = 24, 4
SCENARIOS = {
    "straggler": "compute=exp:1;slow=nodes:0x5",
    "straggler-loss": "loss=0.1;compute=exp:1;slow=nodes:0x5",
}
"""name -> --network spec (node 0 five times slower; with 10 % of the messages lost)."""

def main(out: str, scale: float) -> None:
    torch.set_num_threads(1)
    world = World.detect()
    n = world.size
    problem = make_problem("least-squares", n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=1.0, dtype=torch.float64)
    x0, x_star = problem.initial_point(), problem.solution()

    def distance(engine, xbar):
        return {"distance_to_optimum": squared_distance(engine, x_star)}

    with JsonlLogger(out, enabled=world.is_root) as logger:
        for name, network in SCENARIOS.items():
            for run, free_run in (("paced", scale), ("plain", None)):
                engine = Engine(make_algorithm("dpsgd", eta=0.2 / problem.smoothness().L),
                                topologies.build("ring", n), lambda i: x0 + i, world=world.configure(timeout=30),
                                seed=3, network=network, free_run=free_run,
                                oracles=lambda i, gen: problem.oracle(i, gen, "full"))
                engine.run(ROUNDS, log_every=LOG_EVERY, metrics=[distance],
                           on_record=lambda rec, name=name, run=run: logger.write(
                               {**rec, "scenario": name, "run": run}))
    rogue(world, scale)


def rogue(world: World, scale: float) -> None:
    """A paced robust-push-sum under lags (stale=) whose node 1 writes counter 7 into its
    running sum of round 3: a receiver refuses it naming the sender, prints the error and
    aborts the job (what a user's script does)."""
    from gossip.core.running import RunningSums

    if world.rank == 1:
        send = RunningSums.send

        def forged(self, z):
            rows = send(self, z)
            if self.block.round == 3:
                rows.mine().view(torch.float64)[0, self.width] = 7.0
            return rows

        RunningSums.send = forged
    n = world.size
    engine = Engine(make_algorithm("robust-push-sum"), topologies.build("ring", n, weights="push"),
                    lambda i: torch.full((4,), float(i), dtype=torch.float64), compressor="none",
                    world=world.configure(timeout=30), seed=3, network="stale=geom:0.5;slow=nodes:0x5",
                    free_run=scale)
    try:
        engine.run(ROUNDS)
    except Exception as exc:
        print(f"ROGUE rank {world.rank}: {type(exc).__name__}: {exc}", flush=True)
        world.abort(1)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
