"""Average consensus: compare compressors (and algorithms) by consensus error per round and per bit.

In process:      python experiments/consensus.py --nodes 25 --compressor none topk:0.01 --gamma 1 0.05
Under MPI:       mpiexec -n 8 python experiments/consensus.py --compressor none sign --gamma 1 0.4
Trials:          python experiments/consensus.py --compressor none sign --gamma 1 0.4 --seeds 0..9 --jobs 2

Every compressor gets its own run from the same initial vectors; the script prints one table
row per run (final error, rounds and bits per node to reach --target, mean round time), writes
JSON lines (--out) and plots error against rounds and against bits (--plot).
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Only what the parser needs is imported here, so --help answers without torch; the run's own
# imports (torch, numpy, the engine) are in the functions below.
from gossip import catalog  # noqa: E402
from gossip.cli import (  # noqa: E402
    HelpFormatter,
    add_hparam_argument,
    add_list_argument,
    add_rounds_argument,
    add_run_arguments,
    check_asynchronous,
    check_entries,
    check_hparam_types,
    check_memory,
    checkpoint_options,
    exit_status,
    gamma_value,
    guarded,
    parse_hparams,
    positive_float,
    positive_int,
    read_npy,
    run_label,
    setup,
    split_per_run,
    topology_record,
    torch_dtype,
)
from gossip.cli.trials import add_trials_arguments, check_trials, run_seeds  # noqa: E402

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("gossip.consensus")

MEMORY_FLAGS = "--nodes, --dim or --shape"


def averaging() -> list[str]:
    """Registered algorithms that run without gradients (not ``requires.gradients``): plain averaging."""
    return catalog.algorithms(lambda t: not t.gradients)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("consensus")
    g.add_argument("--algorithm", default="choco",
                   help=f"algorithm run for every compressor: {', '.join(averaging())}, or "
                        "module:Class")
    g.add_argument("--compressor", nargs="+", default=["none"], metavar="SPEC",
                   help=f"compressor specs, one run each: {catalog.compressor_usage()}")
    g.add_argument("--gamma", nargs="+", type=gamma_value, default=None, metavar="G",
                   help="consensus step: one for all runs or one per compressor; 'auto' "
                        "searches the grid 1, 0.5, 0.2, ..., 0.01 on a tenth of the rounds, "
                        "'default' takes the algorithm's default for that run "
                        "(default: the algorithm's own default; CHOCO's is sized from the "
                        "compressor's contraction and the mixing weights, the label gives it)")
    g.add_argument("--rank", type=positive_int, default=None,
                   help="PowerGossip's rank (only with --algorithm powergossip)")
    add_hparam_argument(g, "--hparam arcs=true (the per-arc form: exact under --network "
                        "loss=...), --hparam alpha=0.5 (lead)")
    g.add_argument("--dim", type=positive_int, default=None,
                   help="vector dimension d (default 2000, or the --init file's)")
    g.add_argument("--shape", default=None, metavar="MxK",
                   help="matrix-shaped vectors (for low-rank compressors and PowerGossip); "
                        "overrides --dim (default: the --init file's when it is (n, m, k))")
    g.add_argument("--init", default="gaussian",
                   help="'gaussian' (x_i ~ N(0, I), seeded per node) or a .npy file of shape "
                        "(n, d) or (n, m, k); d or (m, k) are then read from the file")
    add_rounds_argument(g, 1000)
    g.add_argument("--target", type=positive_float, default=1e-6,
                   help="consensus error, relative to the initial one, that counts as reached")
    add_run_arguments(p)
    add_list_argument(p, algorithms=averaging)
    add_trials_arguments(p, costs=False)
    from gossip.config import parse_args_with_config

    return parse_args_with_config(p, argv)  # --config run.toml; flags override it


def load_init(args: argparse.Namespace, n: int) -> np.ndarray | None:
    """The ``--init`` file's array (one row per node), or None for Gaussian starts."""
    import numpy as np

    if args.init == "gaussian":
        return None
    path = Path(args.init)
    if not path.exists():
        raise SystemExit(f"--init {args.init}: no such file (give 'gaussian' or a .npy file)")
    data = read_npy(args.init, "--init")
    if data.ndim not in (2, 3) or data.shape[0] != n or 0 in data.shape:
        raise SystemExit(
            f"--init {path} has shape {data.shape}; expected ({n}, d) or ({n}, m, k): one row per "
            f"node of the {n}-node topology"
        )
    if not np.issubdtype(data.dtype, np.floating) and not np.issubdtype(data.dtype, np.integer):
        raise SystemExit(f"--init {path} holds {data.dtype} values; give real numbers")
    return data


def initial_vectors(args: argparse.Namespace, data: np.ndarray | None, shape: tuple[int, ...],
                    n: int):
    """x_i^0 for every node of ``n``: seeded Gaussians, or rows of a user's .npy file."""
    import numpy as np
    import torch

    from gossip.rng import init_seeds

    dtype = torch_dtype(args.dtype)
    if data is None:  # seeds of every node at once, one generator reseeded: 10^6 nodes in seconds
        seeds = init_seeds(args.seed, np.arange(n))
        gen = torch.Generator()

        def draw(i: int) -> torch.Tensor:
            gen.manual_seed(int(seeds[i]))
            return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        return draw
    if int(np.prod(data.shape[1:])) != int(np.prod(shape)):
        raise SystemExit(
            f"--init {args.init} has shape {data.shape}, but --dim/--shape ask for "
            f"({data.shape[0]}, {', '.join(map(str, shape))}); drop --dim/--shape to use the file's"
        )
    return lambda i: torch.from_numpy(np.array(data[i])).to(dtype).reshape(shape)


def parse_shape(args: argparse.Namespace, data: np.ndarray | None = None) -> tuple[int, ...]:
    """The vectors' shape: --shape, else --dim, else the --init file's, else (2000,)."""
    if args.shape is None:
        if args.dim is None:
            return tuple(int(s) for s in data.shape[1:]) if data is not None else (2000,)
        if args.dim < 1:
            raise SystemExit(f"--dim must be positive, got {args.dim}")
        return (args.dim,)
    m = re.fullmatch(r"(\d+)x(\d+)", args.shape)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise SystemExit(f"--shape must look like 100x100, got '{args.shape}'")
    return (int(m[1]), int(m[2]))


def check(argv: list[str] | None = None) -> None:
    """Parse and build every run ``argv`` asks for, then stop (compare.py's check of a sweep
    entry before any entry runs); a run that cannot start raises ``SystemExit``."""
    main(argv, check_only=True)


def main(argv: list[str] | None = None, check_only: bool = False) -> list[dict]:
    """Run what ``argv`` asks for, print its table (and plot), and return the table's rows
    (with ``--seeds``: every trial's rows, each with its ``seed``)."""
    args = parse_args(argv)
    check_trials(args)
    if args.seeds is not None and not check_only:  # one process per trial, each trial(args)
        return run_seeds(args, __file__, metric="consensus_error_rel",
                         final=("final_rel_error", "final error (rel.)"),
                         columns=[("rounds_to_target", "rounds"), ("bits_to_target", "bits/node")],
                         reached="rounds_to_target", ms="ms_per_round",
                         title=f"consensus, {args.algorithm}", target=args.target)
    return run(args, check_only)


def trial(args: argparse.Namespace) -> list[dict]:
    """One trial of ``--seeds`` (in its own process): the runs of ``args`` (one seed, records
    to ``args.out``), without their table."""
    return run(args, report=False)


def run(args: argparse.Namespace, check_only: bool = False, report: bool = True) -> list[dict]:
    """The runs of ``args``: their table rows (``report``: print the table, write the plot)."""
    import numpy as np

    from gossip.algorithms import form_class, make_algorithm
    from gossip.engine import Engine
    from gossip.errors import GossipError
    from gossip.layout import Layout
    from gossip.metrics import JsonlLogger, versions
    from gossip.runner import execute
    from gossip.tuning import tune_gamma

    extra = parse_hparams(args.hparam)
    try:
        cls = form_class(args.algorithm, extra)
    except GossipError as exc:
        raise SystemExit(f"--algorithm: {exc}") from None
    check_hparam_types(args.algorithm, {k: v for k, v in extra.items() if k != "arcs"})
    check_asynchronous(args, args.algorithm)
    if cls.requires.gradients:
        raise SystemExit(f"--algorithm {args.algorithm} needs gradients and consensus has none: use "
                         f"one of {', '.join(averaging())} here, or experiments/optimize.py or train.py")
    gaussian = args.init == "gaussian"

    def memory(world, topology=None, shape=None) -> None:
        shape = shape or parse_shape(args)
        check_memory(args, world, numel=math.prod(shape), algorithms=[cls],
                     compressors=args.compressor, lower=MEMORY_FLAGS, topology=topology,
                     nodes=args.nodes, shape=shape)

    world, topology = setup(args, before_topology=memory if gaussian else None)
    data = load_init(args, topology.n)
    shape = parse_shape(args, data)
    memory(world, topology, shape)
    layout = Layout([shape]) if len(shape) > 1 else None
    x0 = initial_vectors(args, data, shape, topology.n)
    node_metrics = [] if args.free_run is None else [average_distance(x0, topology.n)]
    gammas = split_per_run(args.gamma, len(args.compressor), "--gamma")

    def builder(spec: str) -> Callable[[float | None], Engine]:
        def build(gamma: float | None) -> Engine:
            hp = dict(extra) if gamma is None else extra | {"gamma": gamma}
            if args.rank is not None:
                hp["rank"] = args.rank
            return Engine(
                make_algorithm(args.algorithm, **hp), topology, x0, compressor=spec,
                layout=layout, seed=args.seed, world=world, network=args.network,
                device=args.device, dtype=torch_dtype(args.dtype),
                free_run=args.free_run,
            )
        return build

    builds = [builder(spec) for spec in args.compressor]
    if check_only or len(builds) > 1:  # every entry before the first run ('auto': the default)
        check_entries([(spec, lambda b=b, g=g: b(None if g == "auto" else g))
                       for spec, g, b in zip(args.compressor, gammas, builds)], "--compressor")
    if check_only:
        return []
    logger = JsonlLogger(args.out, enabled=world.is_root)
    rows, curves = [], {}
    for index, (spec, gamma, build) in enumerate(zip(args.compressor, gammas, builds)):
        search = None
        if gamma == "auto":
            search = tune_gamma(build, max(1, args.rounds // 10), "consensus_error")
            gamma = search.pick
            if world.is_root:
                print(f"{args.algorithm} {spec}: {search.describe()}")
        engine = build(gamma)
        if gamma is None:  # the algorithm's default, as its setup resolved it (CHOCO's rule)
            gamma = engine.hparams.get("gamma")
        label = run_label(args.algorithm, spec, extra, sep=" ") + (
            f" γ={gamma:.3g}" if isinstance(gamma, float) else "")
        config = {
            "script": "consensus", "args": vars(args), "algorithm": args.algorithm,
            "hparams": engine.hparams, "compressor": spec, "nodes": topology.n,
            "world_size": world.size, "topology": topology_record(topology), "versions": versions(),
        }
        if search is not None:
            config["gamma_search"] = search.record()
        result = execute(engine, label=label, config=config, logger=logger, rounds=args.rounds,
                         log_every=args.log_every, progress=args.progress,
                         node_metrics=node_metrics, **checkpoint_options(args, index))
        curves[label] = result.records
        rows.append(table_row(label, result.records, result.summary, args.target))
    logger.close()
    if world.is_root and report:
        from gossip.outputs import clocks_of

        print(format_table(rows, args.target, clocks_of(curves.values())))
        if args.plot:
            from gossip.plot import plot_runs

            path = plot_runs(curves, args.plot, metric="consensus_error_rel",
                             title=f"consensus on {topology.name}, n={topology.n}, d={int(np.prod(shape))}",
                             flag="--plot")
            log.info("plot written to %s", path)
    return rows


def average_distance(x0, n: int):
    """A free run's node metric: ``distance_to_average`` = ‖x_i − x̄⁰‖², node i's distance to
    the average it should reach (x̄⁰ from all n initial vectors, drawn on every rank: free runs
    have one node per rank, so n is small)."""
    import torch

    target = sum(x0(i).reshape(-1).to(torch.float64) for i in range(n)) / n

    def metric(i, x):
        return {"distance_to_average": float(((x.to(torch.float64) - target) ** 2).sum())}

    return metric


def table_row(label: str, records: list[dict], summary: dict, target_rel: float) -> dict:
    from gossip.metrics import first_reach
    from gossip.outputs import CLOCKS

    reached = first_reach(records, "consensus_error_rel", target_rel)
    final = records[-1] if records else {}
    return {
        "run": label,
        "final_rel_error": 0.0 if final.get("consensus_error_rel", 0) is None
        else final.get("consensus_error_rel", float("nan")),
        "rounds_to_target": reached["round"] if reached else None,
        "bits_to_target": reached["bits_per_node"] if reached else None,
        **{key: (reached or {}).get(key) for key, _ in CLOCKS},  # seconds to target
        # the rounds after the first (setup, warm-up and metrics apart: Engine.summary)
        "ms_per_round": 1e3 * (summary.get("steady_s_per_round") or summary["seconds_per_round"]),
        "setup_s": summary.get("setup_s"),
        "first_round_ms": None if summary.get("first_round_s") is None
        else 1e3 * summary["first_round_s"],
        "status": summary["status"],
        "rounds_run": final.get("round"),
    }


def format_table(rows: list[dict], target: float, clocks: list[tuple[str, str]] = ()) -> str:
    """The markdown table of the runs; a run whose error never fell to ``target`` says "not
    reached" in every to-target column, and a note under the table says when it ended. The
    times are the setup's, the first round's (numba's and the kernels' warm-up) and the steady
    rounds' after it (ms/round), none counting the metrics. Runs on
    a clock (``clocks``, :func:`gossip.outputs.clocks_of`: virtual time of the network's timing
    models, wall time of ``--free-run``) also show the seconds they took to reach it."""
    from gossip.cli import target_note

    head = (f"| run | final error (rel.) | rounds to {target:g} | bits/node to {target:g} |"
            + "".join(f" {name} to {target:g} |" for _, name in clocks)
            + " setup s | 1st round ms | ms/round | status |")
    lines = [head, "|---|---|---|---|" + "---|" * len(clocks) + "---|---|---|---|"]
    for r in rows:
        missed = r["rounds_to_target"] is None
        rounds = "not reached" if missed else str(r["rounds_to_target"])
        bits = "not reached" if missed else f"{r['bits_to_target']:.3g}"
        times = "".join(" not reached |" if missed else
                        f" {'—' if r.get(key) is None else format(r[key], '.4g')} |"
                        for key, _ in clocks)
        lines.append(f"| {r['run']} | {r['final_rel_error']:.3g} | {rounds} | {bits} |{times} "
                     f"{_cell(r.get('setup_s'), '.3g')} | {_cell(r.get('first_round_ms'), '.4g')} | "
                     f"{r['ms_per_round']:.3f} | {r['status']} |")
    note = target_note([(r["run"], r.get("rounds_run")) for r in rows if r["rounds_to_target"] is None],
                       target, "relative consensus error")
    return "\n".join(lines + ([note] if note else []))


def _cell(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


if __name__ == "__main__":
    guarded(lambda: exit_status(main()), memory_hint="--nodes, --dim or --shape")
