"""Command-line pieces every experiment script shares: run flags, world, topology, logging.

One mechanism for all scripts: :func:`add_run_arguments` adds the topology / seed / MPI / output
flags, :func:`setup` turns them into a :class:`World` and a validated topology.

Building a parser imports neither torch nor networkx (``--help`` answers at once): torch, numpy,
the world and the topologies are imported by the functions that use them, after parsing.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import numpy as np
    import torch

    from gossip.comm.world import World

log = logging.getLogger("gossip")

DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
"""The ``--dtype`` choices; :func:`torch_dtype` gives the torch dtype of one."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--dtype`` name (``"float32"`` -> ``torch.float32``)."""
    import torch

    return getattr(torch, name) if name in DTYPE_NAMES else {}[name]


def __getattr__(name: str) -> Any:
    if name == "DTYPES":  # the former name -> torch dtype table, built (importing torch) when read
        return {n: torch_dtype(n) for n in DTYPE_NAMES}
    raise AttributeError(f"module 'gossip.cli' has no attribute {name!r}")


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
        # identity, not ==: a default of 0 or 0.0 is worth showing, and 0.0 == False
        if "default" in text.lower() or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


def topology_forms() -> str:
    """The topology specs ``topologies.build`` accepts, from its own tables (never stale)."""
    from topologies.spec import STATIC, TIME_VARYING

    return ", ".join(e.usage() for e in (*STATIC.values(), *TIME_VARYING.values()))


def positive_int(text: str) -> int:
    """a positive integer"""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """a non-negative integer"""
    return _int_at_least(text, 0)


MAX_THREADS = 1024
"""The most torch threads a process may ask for (torch crashes on 10^5)."""


def thread_count(text: str) -> int:
    """a thread count, 1 to MAX_THREADS"""
    value = _int_at_least(text, 1)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_THREADS} threads, got {text!r} (this machine has "
            f"{os.cpu_count() or 1} CPUs; more threads than CPUs only slow a run down)")
    return value


positive_int.toml_type = non_negative_int.toml_type = thread_count.toml_type = int  # type: ignore[attr-defined]


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < low:
        what = "a positive" if low == 1 else "a non-negative"
        raise argparse.ArgumentTypeError(f"expected {what} integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """a positive finite number"""
    return _finite(text, strict=True)


def non_negative_float(text: str) -> float:
    """a non-negative finite number"""
    return _finite(text, strict=False)


positive_float.toml_type = non_negative_float.toml_type = float  # type: ignore[attr-defined]


def _finite(text: str, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value) or value < 0 or (strict and value == 0):
        what = "a positive" if strict else "a non-negative"
        raise argparse.ArgumentTypeError(f"expected {what} finite number, got {text!r}")
    return value


def seconds(text: str) -> float:
    """a positive number of seconds"""
    from gossip.comm.base import check_timeout
    from gossip.errors import CommConfigError

    try:
        return check_timeout(text)
    except CommConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


LIST_KINDS = ("algorithms", "compressors", "topologies", "weights", "problems")
"""What ``--list KIND`` prints (``--list`` alone: all of them)."""


def listing(kind: str = "all", algorithms: Callable[[], list[str]] | None = None) -> str:
    """The registered names of ``kind`` (one of :data:`LIST_KINDS`, or ``"all"``), as ``--list``
    prints them; ``algorithms`` gives the names a script runs (default: every registered one).
    Built from :mod:`gossip.catalog` and the topology tables: nothing imports torch."""
    from gossip import catalog
    from topologies.spec import spec_help

    def section(name: str) -> str:
        if name == "algorithms":
            names = algorithms() if algorithms is not None else catalog.algorithms()
            return f"algorithms (--algorithm): {', '.join(names)}; or module:Class"
        if name == "compressors":
            usage = catalog.compressor_usage().split("; ")
            return "compressors (--compressor):\n" + "\n".join(f"  {u}" for u in usage)
        if name == "topologies":
            return f"topologies (--topology):\n{spec_help()}"
        if name == "weights":
            from topologies.mixing import RULES

            return f"weights (--weights): {', '.join(RULES)}"
        return f"problems (--problem, optimize.py): {', '.join(catalog.problems())}; or module:function"

    return "\n".join(section(k) for k in (LIST_KINDS if kind == "all" else (kind,)))


class ListAction(argparse.Action):
    """``--list [KIND]``: print :func:`listing` and exit 0, as ``--help`` does (before the
    other flags are checked, so it needs none of them). Not a run setting: a ``--config``
    file cannot set it."""

    not_a_setting = True

    def __init__(self, option_strings: list[str], dest: str,
                 algorithms: Callable[[], list[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", const="all", default=argparse.SUPPRESS,
                         choices=("all", *LIST_KINDS), metavar="KIND", **kwargs)
        self.algorithms = algorithms

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser._print_message(listing(values, self.algorithms) + "\n", sys.stdout)  # rank 0 only
        parser.exit(0)


def add_list_argument(parser: argparse.ArgumentParser,
                      algorithms: Callable[[], list[str]] | None = None) -> None:
    """``--list [KIND]`` on ``parser``; ``algorithms``: the algorithm names this script runs."""
    parser.add_argument("--list", action=ListAction, algorithms=algorithms,
                        help=f"print the registered names of KIND ({', '.join(LIST_KINDS)}; "
                             "default: all of them) and exit")


def network_spec(text: str) -> str:
    """a --network spec (gossip.network), returned in its canonical form"""
    from gossip.errors import ConfigError
    from gossip.network import parse_network

    try:
        return parse_network(text).spec()
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every script (topology, seed, devices, MPI, logs, plots)."""
    g = parser.add_argument_group("run")
    g.add_argument("--nodes", type=positive_int, default=None,
                   help="number of nodes. In process: required unless the topology is a file "
                        "(default 8). Under mpiexec or torchrun: defaults to the world size; a "
                        "larger value hosts several nodes per rank")
    g.add_argument("--topology", default="ring",
                   help=f"graph spec: {topology_forms()}, a graph file (edge list, GraphML, GML, "
                        "JSON node-link) or module:function: f(n) a graph, f(n, t) the graph of round t "
                        "(default: ring)")
    g.add_argument("--weights", default="metropolis",
                   help="mixing rule: metropolis, max-degree, uniform, weights (explicit edge "
                        "'weight' attributes), push / pull (column- / row-stochastic, directed "
                        "graphs) (default: metropolis)")
    g.add_argument("--lazy", action="store_true", help="use the lazy matrix (I + W)/2")
    g.add_argument("--seed", type=non_negative_int, default=0, help="run seed; same seed, same numbers (default 0)")
    g.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                   help="floating-point type of the models: what is stored, sent and mixed "
                        "(bfloat16/float16: half the bytes; docs/low-precision.md) (default "
                        "float32)")
    g.add_argument("--device", default="cpu", help="torch device: cpu or cuda (default cpu)")
    g.add_argument("--threads", type=thread_count, default=1,
                   help="torch threads per process (default 1: fastest under MPI and needed for "
                        "in-process runs to equal MPI runs bit for bit)")
    g.add_argument("--transport", default="auto",
                   choices=("auto", "local", "mpi", "torch", "gloo", "nccl"),
                   help="what carries messages between processes: auto (default: MPI under "
                        "mpiexec, torch.distributed under torchrun, else in process), local (one "
                        "process), mpi, torch (torchrun; NCCL for --device cuda, else gloo), "
                        "gloo (CPU tensors) or nccl (CUDA tensors); docs/transports.md")
    g.add_argument("--timeout", type=seconds, default=120.0,
                   help="seconds to wait for a neighbor, or for the other ranks at start-up, "
                        "before stopping with an error naming it (default 120)")
    g.add_argument("--network", type=network_spec, default="none", metavar="SPEC",
                   help="what messages meet on the way (docs/network.md): none (default), "
                        "loss=P (each message lost with probability P), loss=bernoulli:P, or "
                        "loss=ge:p_gb=P,p_bg=P[,loss_good=P][,loss_bad=P] (Gilbert-Elliott "
                        "bursts per arc). Lost messages move no bytes; the log gains "
                        "messages_lost. stale=K | geom:P | uniform:LO,HI | arcs:I>J@LAG+... "
                        "(messages of synchronous rounds handed over whole rounds late; the log "
                        "gains messages_late). Timing models (virtual time; the log gains "
                        "time_virtual_s): delay=DIST (seconds a message travels), compute=DIST "
                        "(seconds of one local step, default 1), DIST = S | fixed:S | exp:MEAN | "
                        "uniform:LO,HI | lognormal:MEDIAN,SIGMA; slow=FRACTIONxFACTOR or "
                        "slow=nodes:I+JxFACTOR (stragglers: compute times x FACTOR); "
                        "churn=rate:R,mean_away:S[,fresh] or churn=at:NODE@LEAVE-BACK+...[,fresh] "
                        "(asynchronous algorithms only). Join models with ';'")
    g.add_argument("--link-latency", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="simulate slow links: every round's messages arrive no earlier than "
                        "SECONDS after they are sent, in process and across processes "
                        "(default 0; e.g. 0.005 to measure what --overlap hides)")
    g.add_argument("--free-run", type=positive_float, default=None, metavar="SCALE",
                   help="under mpiexec with one node per rank, sleep the --network "
                        "compute/slow draws x SCALE wall seconds. Asynchronous algorithms run "
                        "free, in wall-clock order (loss= and delay= drawn per message); "
                        "--log-every K: the nodes' states at the "
                        "wall instants of every K sweeps, written after the run, then the end "
                        "record (docs/asynchronous.md). Synchronous ones keep their rounds, "
                        "each node sleeping its draw before sending; records gain wall_s "
                        "(docs/network.md). Default: virtual time only")
    g.add_argument("--log-every", type=positive_int, default=10, help="log every K rounds (default 10)")
    from gossip.memory import add_memory_argument

    add_memory_argument(g)
    g.add_argument("--out", default=None, help="JSON-lines log file (default: none)")
    g.add_argument("--plot", default=None, help="write a PNG plot here")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on rank 0's stderr, shown once a run has taken 2 s "
                        "(default: on when stderr is a terminal, off when it is a file or a "
                        "pipe); --no-progress turns it off")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    c = parser.add_argument_group("long runs")
    c.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="K",
                   help="write a checkpoint every K rounds (0: only on SIGINT/SIGTERM when "
                        "--checkpoint-dir is set)")
    c.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="where checkpoints go (one sub-directory per run)")
    c.add_argument("--resume", default=None, metavar="DIR",
                   help="continue from the checkpoints in DIR (same flags as the interrupted "
                        "run); finished runs are replayed from their records")


def setup(args: argparse.Namespace, before_topology: Any = None) -> tuple[World, Any]:
    """Threads, logging, the MPI world and the validated topology, before any message is sent.

    ``before_topology(world)`` runs once the world is known, before the graph is built (a
    memory check of the run's size, see :func:`check_memory`)."""
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
                             device=_device_of(args.device))
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


FEDERATED_FLAGS = ("clients_per_round", "local_steps", "server_optimizer", "server_lr",
                   "sampling", "availability", "mu", "downlink_compressor", "aggregation")
"""The federated methods' flags (``--clients-per-round`` ...), each a constructor keyword."""


def add_federated_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the federated methods (docs/algorithms/fedavg.md), for optimize.py and train.py."""
    f = parser.add_argument_group(
        "federated (fedavg, fedprox, fedadam, fedyogi, fedadagrad, scaffold, cada, g-cada: node 0 "
        "of a star is the server, the other --nodes the clients; the default topology is then star)")
    f.add_argument("--clients-per-round", type=positive_int, default=None,
                   help="clients sampled per round (default: all)")
    f.add_argument("--local-steps", type=int, default=None,
                   help="local steps K per round (>= 1; default 5)")
    f.add_argument("--server-optimizer", default=None,
                   help="sgd (fedavg's default), adam, yogi, adagrad or adamw")
    f.add_argument("--server-lr", type=positive_float, default=None,
                   help="server step (default 1 with sgd, 0.01 adaptive)")
    f.add_argument("--sampling", default=None,
                   help="uniform (k distinct clients, default), replacement, or weighted (k "
                        "draws with probability proportional to a client's data size)")
    f.add_argument("--aggregation", default=None,
                   help="mean (default) or data: the sampled deltas weighted by the clients' "
                        "data sizes (McMahan et al.)")
    f.add_argument("--downlink-compressor", default=None,
                   help="compressor of the server's messages (default: exact; --compressor is "
                        "the uplink's), against an EF21 copy per client")
    f.add_argument("--availability", type=float, default=None,
                   help="probability a client is online in a round (default 1)")
    f.add_argument("--mu", type=float, default=None, help="FedProx's proximal weight")


def federated_hparams(args: argparse.Namespace, accepted: set[str], name: str) -> dict[str, Any]:
    """The federated flags given, as keywords; one the algorithm does not take is refused."""
    out = {}
    for key in FEDERATED_FLAGS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if key not in accepted:
            raise SystemExit(f"error: --{key.replace('_', '-')} does not apply to {name} (the "
                             "federated methods take it: fedavg, fedprox, fedadam, ...)")
        out[key] = value
    return out


def add_overlap_argument(parser: argparse.ArgumentParser) -> None:
    """``--overlap``, for the scripts whose algorithms compute gradients."""
    parser.add_argument("--overlap", action="store_true",
                        help="compute the next gradients while a round's messages travel "
                             "(choco, dpsgd, ecd, c-ecl, choco-amsgrad): the same numbers, less "
                             "wall time when messages are slow (docs/overlap.md)")


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


def check_memory(args: argparse.Namespace, world: Any, *, numel: int, algorithms: list[Any],
                 compressors: list[str], lower: str, topology: Any = None, nodes: int | None = None,
                 shape: tuple[int, ...] | None = None, extra: dict[str, float] | None = None) -> None:
    """Refuse, before anything is allocated, a run larger than the memory this process may use
    (:mod:`gossip.memory`; ``--max-memory`` replaces the machine's figure).

    ``numel`` entries per node, the largest of ``algorithms``' (classes) ``state_copies`` (+
    ``neighbor_copies`` x the topology's largest degree), one message per node of the largest
    of ``compressors`` and, under MPI, one received per remote neighbor; ``extra`` adds the
    script's own allocations (a problem's data). Without a ``topology`` (the check before it is
    built, from ``nodes``) the graph is counted at its smallest. Under MPI the share of the rank
    with the most nodes is checked. ``lower``: the flags named in the refusal (which adds how
    more processes would help, :func:`spread_hint`).
    """
    from gossip import memory

    n = topology.n if topology is not None else (nodes or 8)
    local = memory.local_share(n, world.size)
    itemsize = 8 if getattr(args, "dtype", "float32") == "float64" else 4
    fp = memory.Footprint()
    degree = 0
    if topology is not None:
        degree = int(topology.at_round(1).degrees().max()) if n > 1 else 0
    else:
        fp.add("graph", n * 1200.0)  # a ring's networkx graph and CSR weights (measured)
    message = max([memory.message_bytes(c, numel, itemsize, shape) for c in compressors] or [0.0])
    state = max((cls.state_copies + cls.neighbor_copies * degree, cls.state_copies, cls.neighbor_copies)
                for cls in algorithms)
    memory.block_footprint(nodes=local, numel=numel, itemsize=itemsize, state_copies=state[1],
                           neighbor_copies=state[2], degree=degree, message=message,
                           remote_rows=local * degree if world.size > 1 else 0, footprint=fp)
    fp.add("per-node objects", local * 4096.0)
    for name, nbytes in (extra or {}).items():
        fp.add(name, nbytes)
    where = f"rank {world.rank}'s share: {local} of {n} nodes" if world.size > 1 else ""
    memory.check(fp, lower=lower + spread_hint(world.size, local), where=where,
                 limit=getattr(args, "max_memory", None))


def spread_hint(size: int, local: int) -> str:
    """How more processes would shrink each one's share of the nodes, for a memory refusal of
    a world of ``size`` processes whose largest share is ``local`` nodes ("" when every
    process already hosts one node)."""
    if local <= 1:
        return ""
    if size <= 1:
        return " (or start it on several processes, e.g. mpiexec -n 4, to spread the nodes over them)"
    return f" (or start more than {size} processes, up to one per node, to spread the nodes further)"


def check_outputs(args: argparse.Namespace, root: bool = True) -> None:
    """--out, --plot and --checkpoint-dir (or --resume), checked before anything runs: each
    can be created and written (nothing is created or truncated here), --out and --plot are
    distinct files, and the plot's format is one matplotlib writes. ``root``: this process
    writes the log and the plot (under MPI only rank 0 does; every rank writes checkpoints)."""
    from gossip.outputs import check_writable

    out, plot = getattr(args, "out", None), getattr(args, "plot", None)
    paths = [("--out", out, False), ("--plot", plot, False)] if root else []
    paths += [("--checkpoint-dir", getattr(args, "checkpoint_dir", None), True),
              ("--resume", getattr(args, "resume", None), True)]
    for flag, path, directory in paths:
        problem = None if path is None else check_writable(path, flag, directory)
        if problem:
            raise SystemExit(problem)
    check_no_overlap(args, [(flag, path) for flag, path, _ in paths
                            if path is not None and flag != "--resume"])
    if plot is None or not root:
        return
    suffix = Path(plot).suffix.lower().lstrip(".")
    if suffix:
        try:
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError as exc:
            raise SystemExit(f"error: --plot {plot} needs matplotlib, which cannot be imported "
                             f"({exc}); install it (pip install matplotlib) or leave --plot "
                             "out") from None

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise SystemExit(f"error: --plot {plot}: '.{suffix}' is not an image format matplotlib "
                             f"writes; use one of {', '.join('.' + f for f in sorted(formats))}")


INPUT_FLAGS = (("config", "--config"), ("init", "--init"), ("data", "--data"),
               ("topology", "--topology"))
"""The flags that may name a file a run reads, which no output may overwrite."""


def check_no_overlap(args: argparse.Namespace, outputs: list[tuple[str, str]]) -> None:
    """Refuse outputs (``(flag, path)``: --out, --plot, --checkpoint-dir) that name the same
    path as each other, or as a file the run reads (:data:`INPUT_FLAGS`): the run would write
    over its own input (a --config or --init file) or its log over its checkpoints."""
    seen: dict[Path, str] = {}
    for flag, path in outputs:
        where = Path(path).resolve()
        if where in seen:
            if {flag, seen[where]} == {"--out", "--plot"}:
                raise SystemExit(f"error: --plot and --out are the same file ({path}); the plot "
                                 "would overwrite the log: give the plot its own name, e.g. run.png")
            raise SystemExit(f"error: {seen[where]} and {flag} are the same path ({path}); give "
                             "each its own name")
        seen[where] = flag
    for dest, flag in INPUT_FLAGS:
        value = getattr(args, dest, None)
        if not isinstance(value, str) or not Path(value).is_file():
            continue
        used = seen.get(Path(value).resolve())
        if used:
            raise SystemExit(f"error: {used} {value} is the {flag} file this run reads; writing "
                             f"there would destroy it: give {used} another path")


def read_npy(path: str, flag: str) -> np.ndarray:
    """A numeric array from a ``.npy`` file given to ``flag``, memory-mapped, checked first.

    The file must be a regular file holding one ``.npy`` array (not ``.npz``, not pickled
    objects) whose header agrees with the file's length: the header alone is read and checked
    against the bytes that follow, so a header claiming a huge shape costs nothing and is
    refused; the array is then memory-mapped, and nothing is allocated until rows are read.
    """
    import numpy as np

    from gossip.config import user_file
    from gossip.errors import ConfigFileError

    try:
        file = user_file(path, flag)
    except ConfigFileError as exc:
        raise SystemExit(f"error: {exc}") from None
    fmt = np.lib.format
    readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    with open(file, "rb") as fh:
        magic = fh.read(6)
        if magic != b"\x93NUMPY":
            what = "an .npz archive" if magic[:2] == b"PK" else "not a .npy file"
            raise SystemExit(f"error: {flag} {path} is {what}; save one array with "
                             "numpy.save(path, a)")
        fh.seek(0)
        try:
            version = fmt.read_magic(fh)
            shape, _, dtype = readers[version](fh)
        except (KeyError, ValueError, OSError) as exc:
            why = "format version not supported" if isinstance(exc, KeyError) else str(exc)
            raise SystemExit(f"error: {flag} {path} has an unreadable .npy header ({why}); save "
                             "it again with numpy.save") from None
        body = file.stat().st_size - fh.tell()
    if dtype.hasobject or dtype.kind not in "biuf":
        raise SystemExit(f"error: {flag} {path} holds {dtype} values; expected numbers")
    need = math.prod(shape) * dtype.itemsize
    if need > body:
        raise SystemExit(f"error: {flag} {path}: its header announces shape {shape} ({need} bytes) "
                         f"but only {body} bytes follow; the file is truncated or corrupt")
    return np.load(file, mmap_mode="r", allow_pickle=False)


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


def checkpoint_options(args: argparse.Namespace, index: int) -> dict[str, Any]:
    """Keyword arguments of :func:`gossip.runner.execute` for the ``index``-th run of a script."""
    root = args.resume or args.checkpoint_dir
    if args.checkpoint_every and root is None:
        raise SystemExit("--checkpoint-every needs --checkpoint-dir DIR (where to write them)")
    if root is None:
        return {}
    if args.resume is not None:
        resume = Path(args.resume)
        if not resume.is_dir():
            raise SystemExit(f"error: --resume {args.resume}: no such directory; give the "
                             "--checkpoint-dir of the run to continue")
        if not any(resume.glob("run*/manifest.json")):
            raise SystemExit(f"error: --resume {args.resume} holds no checkpoint (no "
                             "run*/manifest.json); to start a new run use --checkpoint-dir")
    from gossip.config import flag_defaults

    return {"checkpoint_dir": os.path.join(root, f"run{index:02d}"),
            "checkpoint_every": args.checkpoint_every, "resume": args.resume is not None,
            "flags": flag_defaults(args)}


def check_entries(entries: list[tuple[str, Callable[[], Any]]], flag: str) -> None:
    """Build every entry of a multi-run script (``flag``: ``--compare``, ``--compressor``) and
    drop it, before the first one runs: each ``(label, build)`` goes through the same
    construction as its run (algorithm, compressor, network model, hyper-parameters, the
    algorithm's ``validate`` against the graph), so a refusal of the last entry comes at once,
    naming it, rather than after the earlier runs (whose table would be lost)."""
    from gossip.errors import GossipError

    for label, build in entries:
        try:
            build()
        except (GossipError, ValueError) as exc:
            raise SystemExit(f"error: {flag} '{label}': {exc}") from None
        except SystemExit as exc:
            if exc.code in (0, None):
                raise
            text = str(exc.code).removeprefix("error: ")
            raise SystemExit(f"error: {flag} '{label}': {text}") from None


def exit_status(rows: dict[str, Any] | list[dict[str, Any]]) -> None:
    """After a script printed its table: raise :class:`gossip.errors.RunFailed` (exit status 1
    under :func:`guarded`) unless every run ended "ok".

    ``rows`` are the script's table rows (one dict or a list), each with ``run`` and ``status``.
    """
    rows = [rows] if isinstance(rows, dict) else list(rows)
    bad = [f"{r['run']}: {r['status']}" for r in rows if r.get("status") != "ok"]
    if bad:
        hint = ("; a diverged run wants a smaller step (--eta, --lr) or consensus step (--gamma, or "
                "--gamma auto where offered), or another compressor"
                if any(str(r.get("status", "")).startswith("diverged") for r in rows) else "")
        from gossip.errors import RunFailed

        raise RunFailed(f"{len(bad)} of {len(rows)} run(s) did not finish ({'; '.join(bad)}){hint}")


def target_note(missed: list[tuple[str, int | None]], target: float, metric: str,
                rounds_flag: str) -> str | None:
    """The note printed under a table whose runs did not all reach ``--target``: which ran out
    of rounds (``missed``: each run's label and the last round it logged) before ``metric``
    fell to ``target``, and the flags that give them the chance; None when every run reached
    it."""
    if not missed:
        return None
    ended = "; ".join(f"{label} after {last} rounds" if last is not None else label
                      for label, last in missed)
    return (f"not reached: {len(missed)} run(s) ended before the {metric} fell to --target "
            f"{target:g} ({ended}); raise {rounds_flag} or --target to see it reached")


def gamma_value(text: str) -> float | str | None:
    """A consensus step, 'auto' for a short grid search, or 'default' (None: the algorithm's
    default, e.g. CHOCO's rule; for one run of a per-run list)."""
    if text == "auto":
        return text
    if text == "default":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"gamma must be a number, 'auto' or 'default', got '{text}'") from None


def split_per_run(values: list[Any] | None, count: int, name: str) -> list[Any]:
    """One value for all runs, or exactly one per run."""
    if not values:
        return [None] * count
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise SystemExit(f"{name}: give one value or one per run ({count}), got {len(values)}")
    return list(values)


BAD_INPUT = 2
"""Exit status of a run refused for its input (a bad flag or file, a run too large for the
memory), like argparse's own refusals."""
FAILED = 1
"""Exit status of a run that started and could not finish (a diverged or failed run, a silent
neighbor, memory exhausted mid-run, an internal error)."""

DEBUG_VAR = "GOSSIP_DEBUG"
"""Set to 1 to see an unexpected exception's traceback instead of its one-line summary."""

DEFAULT_MEMORY_HINT = "--nodes or the model's size (--dim, --shape)"


def guarded(main_fn, world_of=None, memory_hint: str = DEFAULT_MEMORY_HINT):
    """Run ``main_fn``; every error ends the job with one clean ``error:`` line, and under MPI
    with an abort.

    Exit status :data:`BAD_INPUT` (2, as argparse) for bad input: a ``SystemExit`` with a
    message (the scripts' own checks of flags and files) or a :class:`gossip.ConfigError` (a
    bad flag, file, compressor spec, or a run too large for the memory). Exit status
    :data:`FAILED` (1) for a run that could not finish: any other :class:`gossip.GossipError`
    (a refused checkpoint, a silent rank, runs that diverged), memory exhausted during the run
    (``MemoryError``, torch's out-of-memory errors; the line names ``memory_hint``, the flags to
    lower), and any other exception, printed as ``error: internal error: Type: message`` with a
    hint to set ``GOSSIP_DEBUG=1``, which shows the full traceback instead.

    Under MPI the job is then aborted, since the other ranks would otherwise wait for the failed
    one until their timeout. An error every rank meets alike (a configuration error) is printed
    by rank 0 only: when every rank reaches it within a few seconds they all exit with its
    status, without an abort (no launcher noise after the line); otherwise the other ranks wait
    a moment before printing, and rank 0's abort ends them first. A silent neighbor
    (:class:`CommError`), memory exhausted or an internal error is reported at once by every
    rank that saw it.
    SIGINT/SIGTERM during a checkpointed run end with exit status 128 + signal, after the
    final checkpoint (every rank stops at the same round, so nothing is aborted).
    ``world_of`` gives the world (default :meth:`World.current`, imported only on an error:
    the world the script detected, never a second wait at start-up).
    """
    from gossip.errors import CommError, ConfigError, GossipError, Interrupted

    if world_of is None:
        def world_of() -> World:
            from gossip.comm.world import World

            return World.current()

    try:
        return main_fn()
    except Interrupted as exc:
        log.warning("%s", exc)
        raise SystemExit(128 + int(exc.signum)) from None
    except SystemExit as exc:
        if exc.code in (0, None) or isinstance(exc.code, int):
            raise
        _fail(world_of(), str(exc.code), BAD_INPUT, at_once=False)
    except KeyboardInterrupt:
        if os.environ.get(DEBUG_VAR, "") not in ("", "0"):
            raise
        _interrupted()
    except Exception as exc:
        oom = out_of_memory(exc)
        if oom is not None:
            _fail(world_of(), f"out of memory during the run ({oom}); lower {memory_hint}, or "
                  "spread the nodes over more MPI ranks", FAILED, at_once=True)
        if isinstance(exc, GossipError):
            code = BAD_INPUT if isinstance(exc, ConfigError) else FAILED
            _fail(world_of(), str(exc), code, at_once=isinstance(exc, CommError))
        if os.environ.get(DEBUG_VAR, "") not in ("", "0"):
            world = world_of()
            if world.size > 1:
                log.error("rank %d stopping the job: %s", world.rank, exc, exc_info=True)
                world.abort(FAILED)  # after the log has been forwarded
            raise
        _fail(world_of(), f"internal error: {type(exc).__name__}: {one_line(str(exc))}; run with "
              f"{DEBUG_VAR}=1 for the traceback", FAILED, at_once=True)


INTERRUPTED = 130
"""Exit status of a run stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""


def _interrupted() -> NoReturn:
    """Ctrl-C outside a checkpointed run: one line (from the first rank alone; a launcher
    hands the signal to every rank) instead of the traceback of wherever the run was."""
    from gossip.comm.launch import launcher_rank

    if launcher_rank() == 0:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # below a progress bar's line
        print("error: interrupted (Ctrl-C): the log (--out) keeps every record written so far, "
              "without the run's summary; with --checkpoint-every K a run stopped so can be "
              "continued with --resume", file=sys.stderr, flush=True)
    raise SystemExit(INTERRUPTED) from None


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


_OOM_TEXTS = ("can't allocate memory", "out of memory", "not enough memory", "cannot allocate memory")


def out_of_memory(exc: BaseException) -> str | None:
    """What ran out, when ``exc`` (or an exception it was raised from) is an allocation failure:
    ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA), or the ``RuntimeError`` torch's CPU
    allocator raises ("can't allocate memory"); else None. torch is not imported for this."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        names = {c.__name__ for c in type(exc).__mro__}
        text = str(exc)
        if isinstance(exc, MemoryError) or "OutOfMemoryError" in names or (
                isinstance(exc, RuntimeError) and any(t in text.lower() for t in _OOM_TEXTS)
                and "GossipError" not in names):
            first = one_line(text, 160)
            return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        exc = exc.__cause__ or exc.__context__
    return None


def _fail(world: World, text: str, code: int, at_once: bool):
    """End the job with ``text`` as one ``error:`` line and exit status ``code``."""
    text = text if text.startswith("error:") else f"error: {text}"
    tell_torchrun(text)
    if _stop_job(world, text, code, at_once=at_once):
        raise SystemExit(code) from None
    if world.is_root or at_once:  # ranks whose group never formed: rank 0 says what all met
        print(text, file=sys.stderr, flush=True)
    raise SystemExit(code) from None


TORCHRUN_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun asks each worker to leave its error (the path, in the worker's environment)."""


def tell_torchrun(text: str) -> None:
    """Under torchrun, leave ``text`` in the worker's error file: torchrun's failure summary
    (the ``ChildFailedError`` report it prints after any worker fails) then shows this line as
    the root cause instead of "traceback: To enable traceback see ...". Elsewhere nothing."""
    import json

    path = os.environ.get(TORCHRUN_ERROR_FILE)
    if not path:
        return
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text,
                                                       "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except OSError:  # torchrun then reports the exit status alone, as before
        pass


AGREE_S = 3.0  # seconds the ranks take to find that all of them met the same error


def _stop_job(world: World, text: str, code: int, at_once: bool) -> bool:
    """Across processes: print ``text`` with the rank and end every process (all exit when all
    met a configuration error, else an abort), returning True; in process: False, the caller
    prints."""
    if world.size <= 1:
        return False
    if not at_once and world.all_stop(AGREE_S):  # every rank met it: rank 0 says it, all exit
        if world.is_root:
            print(f"[rank {world.rank}] {text}", file=sys.stderr, flush=True)
        return True
    if not at_once and not world.is_root:
        time.sleep(1.5)  # rank 0 meets the same error and aborts the job before this prints
    print(f"[rank {world.rank}] {text}", file=sys.stderr, flush=True)
    world.abort(code)  # after mpiexec has forwarded the message
    return True


def add_hparam_argument(group: Any, examples: str) -> None:
    """``--hparam KEY=VALUE ...``: any constructor argument of the algorithm, by name."""
    group.add_argument("--hparam", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                       help=f"other hyper-parameters of the algorithm by name, e.g. {examples}; "
                            "numbers, true/false and comma lists of integers are parsed")


def parse_hparams(items: list[str]) -> dict[str, Any]:
    """``["freeze_step=100", "byzantine=1,5"]`` -> ``{"freeze_step": 100, "byzantine": [1, 5]}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--hparam {item!r}: expected KEY=VALUE")
        out[key.strip().replace("-", "_")] = hparam_value(text.strip())
    return out


def check_hparam_types(name: str, given: dict[str, Any]) -> None:
    """Refuse an ``--hparam`` value of another kind than the algorithm's default for that key
    (text or a list where it takes a number, a number where it takes true/false), with the
    default as the example: the algorithm's own checks then meet only values of its kinds."""
    import inspect

    from gossip.algorithms import algorithm_class

    params = inspect.signature(algorithm_class(name).__init__).parameters
    for key, value in given.items():
        default = params[key].default if key in params else inspect.Parameter.empty
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        if default is None and key in params:  # resolved by the run: its annotation says the kind
            numeric = params[key].annotation in ("float | None", "int | None", "float | int | None")
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif numeric:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            kind = "a number"
        else:
            continue
        if not ok:
            example = (str(default).lower() if isinstance(default, bool)
                       else "0.1" if default is None else f"{default:g}")
            said = "set by the run" if default is None else example
            raise SystemExit(f"error: --hparam {key}={_label_value(value)}: {name}'s {key} is "
                             f"{kind} (default {said}); give one, e.g. --hparam {key}={example}")


def run_label(head: str, wire: str | None, hparams: dict[str, Any], sep: str = "@") -> str:
    """A run's label: what differs between runs, the algorithm, what it sends (its compressor or,
    for an all-reduce method, its codec) and every ``--hparam`` it was given, e.g.
    ``onebit-adam@sign_l1 freeze_step=20``; a plug-in by its short label
    (:func:`gossip.plugins.short_label`: ``int8``, not ``path/to/my_parts.py:StochasticInt8``)."""
    from gossip.plugins import short_label

    head, wire = short_label(head), None if wire is None else short_label(wire)
    label = head if wire is None else f"{head}{sep}{wire}"
    return label + "".join(f" {k}={_label_value(v)}" for k, v in hparams.items()
                           if not (k == "codec" and v == wire))


def _label_value(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return format(value, "g") if isinstance(value, float) else str(value)


def hparam_value(text: str) -> Any:
    """``--hparam`` values: int, float, true/false, a comma list of ints, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if "," in text or text == "":
        try:
            return [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            pass
    return text
