"""Fingerprints of every built-in algorithm's trajectory: one SHA-256 per scenario over every
round's models and byte counts, so a refactoring can show it changed no bit of any run.

The scenarios are those of the MPI equality scripts (every algorithm at least once) plus
Prox-LEAD and BEER. ``tests/algorithms/test_trajectories.py`` compares them with
``tests/data/trajectories.json``, which holds one set per platform (torch's version and CPU
kernels decide the last bits: AVX2 and AVX512 builds round some products differently). After a
change that is meant to alter numbers, regenerate this platform's set (and, on a machine of the
other kind, that one; a set left stale is dropped by ``--write --only-this-platform``)::

    python tests/helpers/trajectories.py --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.problems import make_problem  # noqa: E402
from tests.helpers import mpi_adaptive, mpi_scenarios, mpi_tracking_scenarios  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "trajectories.json"
NODES = 8


def _extra(name: str, n: int, world: World) -> tuple[Engine, dict]:
    """Prox-LEAD (with an l1 prox) and BEER, which the MPI scripts do not cover."""
    alg, kind, spec = {"prox-lead-lasso": ("prox-lead", "lasso", "qsgd:4bit"),
                       "beer-topk": ("beer", "least-squares", "topk:0.25")}[name]
    problem = make_problem(kind, n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    eta = 0.2 / problem.smoothness().L
    x0 = problem.initial_point()
    engine = Engine(make_algorithm(alg, eta=eta), topologies.build("ring", n), lambda i: x0,
                    compressor=spec, seed=11, world=world, timeout=60,
                    oracles=lambda i, gen: problem.oracle(i, gen, "sgd", 2))
    return engine, {}


def scenarios() -> dict[str, object]:
    """Scenario name -> ``engine_for(name, n, world)``."""
    table: dict[str, object] = {}
    for module in (mpi_scenarios, mpi_tracking_scenarios, mpi_adaptive):
        table.update({name: module.engine_for for name in module.SCENARIOS})
    table.update({"prox-lead-lasso": _extra, "beer-topk": _extra})
    return table


def fingerprint(engine: Engine, rounds: int) -> str:
    """SHA-256 of every node's model and cumulative bytes after each of ``rounds`` rounds."""
    h = hashlib.sha256()
    for _ in range(rounds):
        engine.step()
        for i in sorted(engine.nodes):
            h.update(engine.nodes[i].x.detach().cpu().contiguous().numpy().tobytes())
            h.update(int(engine.transport.bytes_sent.get(i, 0)).to_bytes(8, "little"))
    return h.hexdigest()


def platform_key() -> str:
    """What the bits depend on besides the code: torch's version and CPU kernels."""
    return f"torch {torch.__version__}, {platform.machine()}, {torch.backends.cpu.get_cpu_capability()}"


def recorded() -> dict[str, dict[str, str]]:
    """The recorded hashes, per platform (:func:`platform_key`)."""
    return json.loads(GOLDEN.read_text())["platforms"] if GOLDEN.exists() else {}


def compute(names: list[str] | None = None) -> dict[str, str]:
    torch.set_num_threads(1)
    world = World.detect()
    out = {}
    for name, engine_for in scenarios().items():
        if names and name not in names:
            continue
        built = engine_for(name, NODES, world)
        if built is None:
            continue
        engine, options = built
        out[name] = fingerprint(engine, options.get("rounds", 20))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help=f"record this platform's hashes in {GOLDEN.name}")
    parser.add_argument("--only-this-platform", action="store_true",
                        help="with --write: drop the other platforms' sets (after a change of numbers)")
    parser.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    args = parser.parse_args()
    hashes = compute(args.names)
    platforms = recorded()
    if args.write:
        platforms = {} if args.only_this_platform else platforms
        platforms[platform_key()] = hashes
        GOLDEN.write_text(json.dumps({"platforms": platforms}, indent=1) + "\n")
    golden = platforms.get(platform_key(), {})
    for name, digest in hashes.items():
        print(f"{'same' if golden.get(name) == digest else 'DIFF'}  {name}  {digest[:16]}")


if __name__ == "__main__":
    main()
