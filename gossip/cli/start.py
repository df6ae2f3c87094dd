"""From parsed flags to a started run: torch threads, logging, the world of processes, the
device and the validated topology (:func:`setup`), before any message is sent."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from gossip.cli.files import check_outputs

log = logging.getLogger("gossip.setup")

if TYPE_CHECKING:
    from gossip.comm.world import World


def setup(args: argparse.Namespace, before_topology: Any = None) -> tuple[World, Any]:
    """Threads, logging, the MPI world and the validated topology, before any message is sent.

    ``before_topology(world)`` runs once the world is known, before the graph is built (a
    memory check of the run's size, see :func:`gossip.cli.checks.check_memory`)."""
    import torch

    from gossip.comm.world import World

    torch.set_num_threads(max(1, args.threads))
    latency, timeout = getattr(args, "link_latency", 0.0) or 0.0, getattr(args, "timeout", None)
    if timeout is not None and latency >= timeout:
        raise SystemExit(f"error: --link-latency {latency:g} s is not shorter than --timeout "
                         f"{timeout:g} s: each message would take longer than the wait for it; give a "
                         "latency of a few milliseconds (e.g. 0.005), or raise --timeout above it")
    from gossip.errors import ConfigError

    try:
        world = World.detect(timeout=args.timeout, transport=getattr(args, "transport", "auto"),
                             device=_device_of(args.device), link_latency=latency)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    if getattr(args, "progress", False) is None:  # neither --progress nor --no-progress
        args.progress = sys.stderr.isatty()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else (logging.INFO if world.is_root else logging.WARNING),
        format=f"[rank {world.rank}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise SystemExit(f"error: --device {args.device!r} is not a torch device; use cpu, cuda or "
                         "cuda:K") from None
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"error: --device {args.device}: only cpu and cuda devices are supported")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no CUDA device")
    check_outputs(args, world.is_root)
    if args.device.startswith("cuda") and world.size > 1:
        torch.cuda.set_device(world.rank % torch.cuda.device_count())
    if before_topology is not None:
        before_topology(world)
    return world, build_topology(args, world)


def _device_of(spec: str) -> str | None:
    """The device type ``spec`` names (``cuda`` for cuda:1), None when it names none; the
    flag itself is validated after the world is known."""
    kind = spec.split(":")[0]
    return kind if kind in ("cpu", "cuda") else None


def build_topology(args: argparse.Namespace, world: World) -> Any:
    """The topology for ``args``, refusing sizes that do not match the MPI world or --nodes.

    A bad spec, graph file or weight rule ends in one ``error:`` line (SystemExit).
    """
    from topologies.errors import TopologyError

    try:
        return _build_topology(args, world)
    except TopologyError as exc:
        raise SystemExit(f"error: {exc}") from None


def _build_topology(args: argparse.Namespace, world: World) -> Any:
    import topologies

    spec = args.topology
    is_file = os.path.exists(spec)
    n = args.nodes
    if n is None:
        if world.size > 1:
            n = world.size
        elif not is_file:
            n = 8
    from gossip.comm.world import MPI_HINT

    kind, hint = getattr(world, "kind", "MPI world"), getattr(world, "launch_hint", MPI_HINT.format)
    if n is not None and n < world.size:
        raise SystemExit(
            f"error: --nodes {n} is smaller than the {kind} ({world.size} ranks); every rank needs "
            f"a node: run {hint(n)} or pass --nodes >= {world.size}"
        )
    if is_file:
        graph = topologies.load(spec)
        size = graph.number_of_nodes()
        if n is not None and size != n:
            if size < world.size:
                fix = f"run at most {hint(size)}"
            elif args.nodes is None:  # under a launcher, n is the world size
                fix = f"run {hint(size)}, or pass --nodes {size} to host several nodes per rank"
            else:
                fix = f"pass --nodes {size}" + (" or leave --nodes out" if world.size == 1 else "")
            where = f"the {kind} has {world.size} ranks" if args.nodes is None else f"--nodes is {n}"
            raise SystemExit(f"error: graph file {spec} has {size} nodes but {where}; {fix}")
        n = size
    topo = topologies.build(spec, n, weights=args.weights, lazy=args.lazy, seed=args.seed)
    if topo.n < world.size:
        raise SystemExit(f"error: the topology has {topo.n} nodes, fewer than the {world.size} ranks "
                         f"of the {kind}")
    return topo


SPECTRUM_NODES = 2000
"""Up to this many nodes a run's config record carries the graph's spectrum (rho, gap, beta)
even when nothing needed it (it costs well under a second there)."""


def topology_record(topology: Any) -> dict:
    """``topology.describe()`` for a run's config record, without computing a spectrum that
    nothing in the run needed: past :data:`SPECTRUM_NODES` nodes a static graph whose
    spectrum is not computed yet (no default step size asked for it) records ``rho``, ``gap``
    and ``beta`` as None and ``"spectrum": "not computed"`` (the sparse eigen-solve of a
    10⁵-node ring took 98 s before round 0), and the log says so."""
    import topologies

    if (not isinstance(topology, topologies.Topology) or topology.n <= SPECTRUM_NODES
            or "spectrum" in vars(topology)):
        return topology.describe()
    log.info("spectrum of the %d-node graph: not computed (nothing in this run needs it; "
             "topology.spectrum computes it)", topology.n)
    degrees = topology.degrees()
    return {
        "name": topology.name, "n": topology.n, "edges": topology.graph.number_of_edges(),
        "directed": topology.directed, "time_varying": False,
        "degree_min": int(degrees.min()), "degree_mean": float(degrees.mean()),
        "degree_max": int(degrees.max()), "rho": None, "gap": None, "beta": None,
        "weights": topology.rule, "stochastic": topology.stochastic, "lazy": topology.lazy,
        "spectrum": "not computed",
    }
