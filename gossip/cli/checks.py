"""Refusals of a whole run before any work: flags an asynchronous algorithm cannot honour,
and a run larger than the memory this process may use."""

from __future__ import annotations

import argparse
import logging
from typing import Any

log = logging.getLogger("gossip.memory")

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per entry of each ``--dtype``."""


def check_asynchronous(args: argparse.Namespace, name: str) -> None:
    """Refuse, in one line and before any work, the flags an asynchronous algorithm (no rounds,
    virtual time: docs/asynchronous.md) cannot honour: ``--overlap``, ``--link-latency`` and,
    with ``--free-run``, the checkpoint flags (the engine and the runner refuse them too, but
    only once the data and models are built; in virtual time checkpoints work)."""
    from gossip.algorithms import algorithm_class

    if not algorithm_class(name).asynchronous:
        return
    why = []
    if getattr(args, "overlap", False):
        why.append("--overlap (its nodes never wait for messages: there is nothing to overlap)")
    if getattr(args, "link_latency", 0.0):
        why.append("--link-latency (a wall-clock delay of rounds: give messages a virtual delay "
                   "with --network delay=SECONDS)")
    ckpt = [flag for flag, dest in (("--checkpoint-dir", "checkpoint_dir"), ("--resume", "resume"),
                                    ("--checkpoint-every", "checkpoint_every"))
            if getattr(args, dest, None)]
    if ckpt and getattr(args, "free_run", None) is not None:
        why.append(f"--free-run and {'/'.join(ckpt)} together (a free run's events happen in "
                   "wall-clock time and differ from run to run: checkpoint it in virtual time)")
    if getattr(args, "free_run", None) is not None and str(getattr(args, "gamma", None)) == "auto":
        why.append("--free-run and --gamma auto together (a free run's numbers change from run "
                   "to run, so they cannot rank the candidates: tune in virtual time first)")
    if why:
        raise SystemExit(f"error: {name} is asynchronous (no rounds, virtual time; "
                         f"docs/asynchronous.md) and cannot run with {'; '.join(why)}")


INIT_NODE_BYTES = 8192
"""What a node's initial model made as its own tensor (a script's ``x0(i)``) and the per-node
objects of a script's run add besides its entries (measured: consensus.py, 20,000 nodes, ~5 KiB
in one run and ~7.5 KiB in another under load: the allocator's arenas vary, and the estimate
must stay above the peak)."""

LOG_ESTIMATE_FROM = 256 * 2**20
"""Runs whose estimate reaches this many bytes log it before allocating; smaller ones are checked
without a word, so a small run's output (and a bad flag's one error line) stays as it was."""


def check_memory(args: argparse.Namespace, world: Any, *, numel: int, algorithms: list[Any],
                 compressors: list[str], lower: str, topology: Any = None, nodes: int | None = None,
                 shape: tuple[int, ...] | None = None, extra: dict[str, float] | None = None) -> None:
    """Refuse, before anything is allocated, a run larger than the memory this process may use
    (:mod:`gossip.memory`; ``--max-memory`` replaces the machine's figure).

    ``numel`` entries per node, the largest of ``algorithms``' (classes) ``state_copies`` (+
    ``neighbor_copies`` x the topology's largest degree), one message per node of the largest
    of ``compressors`` and, under MPI, one received per remote neighbor; ``extra`` adds the
    script's own allocations (a problem's data). Without a ``topology`` (the check before it is
    built, from ``nodes``) the graph is counted at its smallest; with one, a run that fits and
    whose estimate reaches :data:`LOG_ESTIMATE_FROM` bytes logs it. Under MPI the share of the rank
    with the most nodes is checked. ``lower``: the flags named in the refusal (which adds how
    more processes would help, :func:`spread_hint`).
    """
    from gossip import memory

    n = topology.n if topology is not None else (nodes or 8)
    local = memory.local_share(n, world.size)
    dtype = getattr(args, "dtype", "float32")
    itemsize = ITEMSIZE.get(dtype, 4)
    degree = None
    if topology is not None:
        degree = int(topology.at_round(1).degrees().max()) if n > 1 else 0
    fp = run_footprint(nodes=local, numel=numel, itemsize=itemsize, algorithms=algorithms,
                       compressors=compressors, degree=degree, shape=shape,
                       remote=world.size > 1, extra=extra)
    where = f"rank {world.rank}'s share: {local} of {n} nodes" if world.size > 1 else ""
    smaller = "" if itemsize <= 2 else f", a smaller --dtype (float16 or bfloat16: {2 / itemsize:g} x)"
    memory.check(fp, lower=lower + smaller + spread_hint(world.size, local), where=where,
                 limit=getattr(args, "max_memory", None))
    if topology is not None and fp.total >= LOG_ESTIMATE_FROM:  # it fits: say what it takes
        log.info("memory estimate: %s for %d nodes x %s per node (%s; %s, d = %d)%s, before "
                 "anything is allocated", memory.format_size(fp.total), local,
                 memory.format_size(fp.total / max(local, 1)), fp.describe(), dtype, numel,
                 f", {where}" if where else "")


def run_footprint(*, nodes: int, numel: int, itemsize: int, algorithms: list[Any],
                  compressors: list[str], degree: int | None, shape: tuple[int, ...] | None = None,
                  remote: bool = False, extra: dict[str, float] | None = None,
                  per_node_init: bool = True) -> Any:
    """What a process hosting ``nodes`` nodes of ``numel`` entries will allocate
    (:class:`gossip.memory.Footprint`): the algorithms' state (the largest), one message per
    node (the largest compressor's), with ``remote`` one received per in-arc, the engine's own
    bytes per node and per arc (:data:`gossip.memory.NODE_BYTES`, ``ARC_BYTES``; an asynchronous
    algorithm's event loop :data:`~gossip.memory.EVENT_NODE_BYTES` more), the initial
    models handed to the engine (``per_node_init``: one tensor per node, as the scripts' ``x0(i)``;
    False: one tensor of every row), the metrics' scratch and ``extra``;
    ``degree`` None: the graph not built yet (counted at a ring's)."""
    from gossip import memory, metrics

    fp = memory.Footprint()
    if degree is None:
        degree = 0
        fp.add("graph", nodes * 1200.0)  # a ring's networkx graph and CSR weights (measured)
    message = max([memory.message_bytes(c, numel, itemsize, shape) for c in compressors] or [0.0])
    wider = memory.WIDER_ITEMSIZE.get(itemsize, itemsize)

    def per_node(cls: Any) -> float:  # bytes of its vectors per node (wide ones at their size)
        wide = min(getattr(cls, "wide_copies", 0), cls.state_copies)
        return (cls.state_copies - wide + cls.neighbor_copies * degree) * itemsize + wide * wider

    big = max(algorithms, key=per_node)
    rounds = not all(getattr(cls, "asynchronous", False) for cls in algorithms)
    memory.block_footprint(nodes=nodes, numel=numel, itemsize=itemsize,
                           state_copies=big.state_copies, neighbor_copies=big.neighbor_copies,
                           wide_copies=getattr(big, "wide_copies", 0), degree=degree,
                           message=message, remote_rows=nodes * degree if remote else 0,
                           block_mix=rounds, footprint=fp)
    fp.add("per-node objects", nodes * (memory.NODE_BYTES + memory.ARC_BYTES * max(degree, 2)))
    if any(getattr(cls, "asynchronous", False) for cls in algorithms):
        fp.add("event loop", nodes * memory.EVENT_NODE_BYTES)
    # the initial models, alive while the block is filled: one tensor per node from a script's
    # x0(i) (measured with consensus.py: ~5 KiB per node besides its entries), or one [n, d] tensor
    # (a script's are drawn in float64, then cast: both alive for a moment)
    init = float(numel) * (itemsize + 8) + INIT_NODE_BYTES if per_node_init else float(numel) * itemsize
    fp.add("initial models", nodes * init)
    fp.add("metrics", metrics.CHUNK_ENTRIES * 8.0)  # squared_distances' scratch chunk (float64)
    for name, nbytes in (extra or {}).items():
        fp.add(name, nbytes)
    return fp


def spread_hint(size: int, local: int) -> str:
    """How more processes would shrink each one's share of the nodes, for a memory refusal of
    a world of ``size`` processes whose largest share is ``local`` nodes ("" when every
    process already hosts one node)."""
    if local <= 1:
        return ""
    if size <= 1:
        return " (or start it on several processes, e.g. mpiexec -n 4, to spread the nodes over them)"
    return f" (or start more than {size} processes, up to one per node, to spread the nodes further)"
