"""Command-line pieces every experiment script shares: run flags, world, topology, logging.

One mechanism for all scripts: :func:`add_run_arguments` adds the topology / seed / MPI / output
flags, :func:`setup` turns them into a :class:`World` and a validated topology.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
import time
from typing import Any

import torch

from gossip.comm.world import World

log = logging.getLogger("gossip")

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to a flag's help once: not when the help already states its
    default, nor for flags whose default is None or False (nothing useful to show). Lines
    wrap at spaces only, so names such as ``zero-one-adam`` or ``sign_l2`` stay whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def topology_forms() -> str:
    """The topology specs ``topologies.build`` accepts, from its own tables (never stale)."""
    from topologies.spec import STATIC, TIME_VARYING

    return ", ".join(e.usage() for e in (*STATIC.values(), *TIME_VARYING.values()))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every script (topology, seed, devices, MPI, logs, plots)."""
    g = parser.add_argument_group("run")
    g.add_argument("--nodes", type=int, default=None,
                   help="number of nodes. In process: required unless the topology is a file "
                        "(default 8). Under mpiexec: defaults to the world size; a larger value "
                        "hosts several nodes per rank")
    g.add_argument("--topology", default="ring",
                   help=f"graph spec: {topology_forms()}, a graph file (edge list, GraphML, GML, "
                        "JSON node-link) or module:function (default: ring)")
    g.add_argument("--weights", default="metropolis",
                   help="mixing rule: metropolis, max-degree, uniform, weights (explicit edge "
                        "'weight' attributes) (default: metropolis)")
    g.add_argument("--lazy", action="store_true", help="use the lazy matrix (I + W)/2")
    g.add_argument("--seed", type=int, default=0, help="run seed; same seed, same numbers (default 0)")
    g.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="floating-point type of the models (default float32)")
    g.add_argument("--device", default="cpu", help="torch device: cpu or cuda (default cpu)")
    g.add_argument("--threads", type=int, default=1,
                   help="torch threads per process (default 1: fastest under MPI and needed for "
                        "in-process runs to equal MPI runs bit for bit)")
    g.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for a neighbor before stopping with an error naming it "
                        "(default 120)")
    g.add_argument("--log-every", type=int, default=10, help="log every K rounds (default 10)")
    g.add_argument("--out", default=None, help="JSON-lines log file (default: none)")
    g.add_argument("--plot", default=None, help="write a PNG plot here")
    g.add_argument("--progress", action="store_true", help="show a progress bar (rank 0)")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    c = parser.add_argument_group("long runs")
    c.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                   help="write a checkpoint every K rounds (0: only on SIGINT/SIGTERM when "
                        "--checkpoint-dir is set)")
    c.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="where checkpoints go (one sub-directory per run)")
    c.add_argument("--resume", default=None, metavar="DIR",
                   help="continue from the checkpoints in DIR (same flags as the interrupted "
                        "run); finished runs are replayed from their records")


def setup(args: argparse.Namespace) -> tuple[World, Any]:
    """Threads, logging, the MPI world and the validated topology, before any message is sent."""
    torch.set_num_threads(max(1, args.threads))
    world = World.detect()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else (logging.INFO if world.is_root else logging.WARNING),
        format=f"[rank {world.rank}] %(levelname)s %(name)s: %(message)s",
    )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no CUDA device")
    if args.device.startswith("cuda") and world.size > 1:
        torch.cuda.set_device(world.rank % torch.cuda.device_count())
    return world, build_topology(args, world)


def build_topology(args: argparse.Namespace, world: World) -> Any:
    """The topology for ``args``, refusing sizes that do not match the MPI world or --nodes."""
    import topologies

    spec = args.topology
    is_file = os.path.exists(spec)
    n = args.nodes
    if n is None:
        if world.size > 1:
            n = world.size
        elif not is_file:
            n = 8
    if n is not None and n < world.size:
        raise SystemExit(
            f"--nodes {n} is smaller than the MPI world ({world.size} ranks); every rank needs a "
            f"node: run mpiexec -n {n} or pass --nodes >= {world.size}"
        )
    if is_file:
        graph = topologies.load(spec)
        size = graph.number_of_nodes()
        if n is not None and size != n:
            where = f"the MPI world has {world.size} ranks" if args.nodes is None else f"--nodes is {n}"
            raise SystemExit(
                f"graph file {spec} has {size} nodes but {where}; run mpiexec -n {size}, or pass "
                f"--nodes {size} to host several nodes per rank"
            )
        n = size
    topo = topologies.build(spec, n, weights=args.weights, lazy=args.lazy, seed=args.seed)
    if topo.n < world.size:
        raise SystemExit(f"the topology has {topo.n} nodes, fewer than the {world.size} MPI ranks")
    return topo


def checkpoint_options(args: argparse.Namespace, index: int) -> dict[str, Any]:
    """Keyword arguments of :func:`gossip.runner.execute` for the ``index``-th run of a script."""
    root = args.resume or args.checkpoint_dir
    if args.checkpoint_every and root is None:
        raise SystemExit("--checkpoint-every needs --checkpoint-dir DIR (where to write them)")
    if root is None:
        return {}
    return {"checkpoint_dir": os.path.join(root, f"run{index:02d}"),
            "checkpoint_every": args.checkpoint_every, "resume": args.resume is not None}


def gamma_value(text: str) -> float | str:
    """A consensus step, or 'auto' for a short grid search."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be a number or 'auto', got '{text}'") from None


def split_per_run(values: list[Any] | None, count: int, name: str) -> list[Any]:
    """One value for all runs, or exactly one per run."""
    if not values:
        return [None] * count
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise SystemExit(f"{name}: give one value or one per run ({count}), got {len(values)}")
    return list(values)


def guarded(main_fn, world_of=World.detect):
    """Run ``main_fn``; under MPI an uncaught error is logged with its rank, then the job aborts.

    Without the abort, the other ranks would wait for the failed one until their timeout.
    SIGINT/SIGTERM during a checkpointed run end with exit status 128 + signal, after the
    final checkpoint (every rank stops at the same round, so nothing is aborted).
    """
    from gossip.checkpoint import Interrupted

    try:
        return main_fn()
    except Interrupted as exc:
        log.warning("%s", exc)
        raise SystemExit(128 + int(exc.signum)) from None
    except SystemExit as exc:
        world = world_of()
        if exc.code not in (0, None) and world.size > 1:
            print(f"[rank {world.rank}] error: {exc.code}", file=sys.stderr, flush=True)
            time.sleep(0.5)  # let mpiexec forward the message before the abort tears down I/O
            world.abort(2)
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        world = world_of()
        if world.size > 1:
            log.error("rank %d stopping the job: %s", world.rank, exc, exc_info=True)
            time.sleep(0.5)
            world.abort(1)
        raise
