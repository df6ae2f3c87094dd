"""Free runs under loss and delay (gossip/network/freerun.py, "Loss and delay"), one node per
rank, 4 ranks on a ring: each scenario's records (round 0, the end) go to a JSON-lines file,
followed by a ``check`` record: the messages lost as counted by the nodes and as the keyed
draws say for the messages each node sent on each arc, and for async-choco whether both ends of
every arc hold the same copy. Started under mpiexec by tests/asynchronous/test_freerun_mpi.py.
Usage: python tests/helpers/mpi_freerun_loss.py OUT.jsonl SECONDS
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
from gossip.metrics import JsonlLogger  # noqa: E402
from gossip.network.timing import Timing  # noqa: E402
from gossip.problems import make_problem  # noqa: E402

SCENARIOS = {
    "ad-psgd": ("ad-psgd", "loss=0.1;compute=exp:1;slow=nodes:0x5", "none"),
    "async-choco": ("async-choco", "loss=0.1;compute=exp:1", "qsgd:16"),
    "gossip-learning": ("gossip-learning", "loss=0.1;delay=exp:0.5;compute=exp:1", "none"),
    "late": ("gossip-learning", "delay=10;compute=exp:1", "none"),
}
"""name -> (algorithm, --network, compressor). The last one's posts take a tenth of the run:
those made in its last tenth are still on their way at the end."""


def copies_gap(engine: Engine) -> float:
    """async-choco: how far apart the two ends' copies of the arcs are, the largest relative
    difference between an arc's copy at its sender (x̂ out) and at its receiver (x̂ in),
    compared through their sums of squares. Rounding only (~1e-15) when both ends added the
    same messages: crossing exchanges make them add in different orders."""
    n, i = engine.n, engine.local_ids[0]
    block = engine.block
    arc = block.workspace["arc"]
    values = {}
    for name, j in (("right", (i + 1) % n), ("left", (i - 1) % n)):
        e = arc[(i, j)]
        for kind in ("out", "in"):
            x = block.arc_state[f"x_hat_{kind}"][e]
            values[kind, name] = engine.node_values({i: float((x * x).sum())})
    gaps = []
    for a in range(n):
        for out, inn in ((values["out", "right"][a], values["in", "left"][(a + 1) % n]),
                         (values["out", "left"][a], values["in", "right"][(a - 1) % n])):
            gaps.append(abs(out - inn) / max(abs(out), 1e-300))
    return max(gaps)


def main(out: str, seconds: float) -> None:
    torch.set_num_threads(1)
    world = World.detect()
    n = world.size
    problem = make_problem("least-squares", n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=1.0, dtype=torch.float64)
    x0 = problem.initial_point()
    with JsonlLogger(out, enabled=world.is_root) as logger:
        for name, (algorithm, network, compressor) in SCENARIOS.items():
            engine = Engine(make_algorithm(algorithm, eta=0.2 / problem.smoothness().L),
                            topologies.build("ring", n), lambda i: x0 + i, world=world.configure(timeout=5),
                            seed=5, network=network, compressor=compressor,
                            oracles=lambda i, gen: problem.oracle(i, gen, "full"),
                            free_run=seconds / 100)
            engine.run(100, log_every=100, on_record=lambda rec, name=name: logger.write(
                {**rec, "scenario": name}))
            free, i = engine.network.last_free_run, engine.local_ids[0]
            timing = Timing(engine.network.model, engine.seed, n)
            drawn = sum(timing.lost(i, j, k) for j, count in free.sent_on.items()
                        for k in range(1, count + 1))
            counted = engine.node_values({i: float(sum(free.lost_on.values()))})
            expected = engine.node_values({i: float(drawn)})
            check = {"type": "check", "scenario": name, "lost": counted.tolist(),
                     "drawn": expected.tolist(),
                     "dropped_in_flight": int(engine.node_values(
                         {i: float(free.dropped_in_flight)}).sum())}
            if algorithm == "async-choco":
                check["copies_gap"] = copies_gap(engine)
            logger.write(check)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
