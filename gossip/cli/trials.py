"""Repeated trials and weighted costs: ``--seeds 0..9 --jobs 4`` and ``--cost-weights``.

A script that takes ``--seeds`` runs the same flags once per seed, in ``--jobs`` processes
(:func:`run_trials`, a ``ProcessPoolExecutor`` started with ``spawn``: each trial is a fresh
interpreter, so no state of one leaks into another and a trial's records equal those of the
same seed run alone). Its records are the trials' records in seed order, each with a ``seed``
field; its table gives mean ± standard deviation over the seeds (:func:`spread`), its plot
the mean with a min–max band (:func:`gossip.plot.plot_runs`).

``--cost-weights comm=1e-6,grad=1,prox=1`` prices what a node has done so far
(:func:`gossip.metrics.weighted_cost`): the round records gain ``cost``, the table the cost to
the target, the plot a panel against it. Nothing here imports torch (``--help`` answers at once).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

COST_WEIGHTS = ("comm", "grad", "sample", "value", "prox")
"""The keys of ``--cost-weights`` (:data:`gossip.metrics.COST_KEYS` says what each prices)."""


def seed_list(text: str) -> list[int]:
    """seeds: N, A..B (both included) or a comma list of them, e.g. 0..9 or 0,1,5..7"""
    seeds: list[int] = []
    for part in text.split(","):
        head, dots, tail = part.strip().partition("..")
        try:
            low = int(head)
            high = int(tail) if dots else low
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--seeds: '{part}' is not a seed N or a range A..B (e.g. 0..9, or 0,1,2)") from None
        if low < 0 or high < low:
            raise argparse.ArgumentTypeError(
                f"--seeds: '{part}' must be seeds >= 0 with A <= B in A..B")
        seeds.extend(range(low, high + 1))
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds {text}: a seed is given twice; give each once")
    return seeds


def cost_weights(text: str) -> dict[str, float]:
    """cost weights KEY=W,... with KEY in comm (a bit sent), grad (a gradient estimate), sample (a
    per-sample gradient), value (a loss value), prox (a proximal step)"""
    out: dict[str, float] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if key not in COST_WEIGHTS or not eq:
            raise argparse.ArgumentTypeError(
                f"--cost-weights: '{part}' is not KEY=WEIGHT with KEY one of "
                f"{', '.join(COST_WEIGHTS)} (e.g. comm=1e-6,grad=1,prox=1)")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight >= 0):
            raise argparse.ArgumentTypeError(
                f"--cost-weights: {key}={value} must be a finite number >= 0")
        if key in out:
            raise argparse.ArgumentTypeError(f"--cost-weights: {key} is given twice")
        out[key] = weight
    return out


def add_trials_arguments(parser: argparse.ArgumentParser, costs: bool = True) -> None:
    """``--seeds``, ``--jobs`` and, with ``costs`` (runs with gradients), ``--cost-weights``
    (module doc)."""
    g = parser.add_argument_group("repeated trials and costs" if costs else "repeated trials")
    g.add_argument("--seeds", type=seed_list, default=None, metavar="SEEDS",
                   help="run every run once per seed: 0..9 (both ends included), 0,1,2 or "
                        "0..3,7; the records carry a seed field, the table gives mean ± std "
                        "over the seeds and the plot the mean with a min-max band (in process "
                        "only; replaces --seed; the seed draws the data too)")
    g.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                   help="with --seeds: trials run at once, each in its own process (default 1; "
                        "the records are the same for any N)")
    if not costs:
        return
    g.add_argument("--cost-weights", type=cost_weights, default=None, metavar="KEY=W,...",
                   help="price a node's work: comm (per bit sent), grad (per gradient "
                        "estimate), sample (per per-sample gradient), value (per loss value), "
                        "prox (per proximal step), e.g. comm=1e-6,grad=1,prox=1; round records "
                        "gain cost, the table the cost to the target, the plot a panel "
                        "against it")


def _jobs(text: str) -> int:
    """a positive number of processes"""
    from gossip.cli.values import positive_int

    return positive_int(text)


_jobs.toml_type = int  # type: ignore[attr-defined]


def check_trials(args: argparse.Namespace) -> None:
    """Refuse what ``--seeds`` cannot combine with, in one line: checkpoints (one directory
    per run, not per trial yet), free runs, and mpiexec (one trial per process here)."""
    if args.seeds is None:
        if args.jobs != 1:
            raise SystemExit("error: --jobs runs the trials of --seeds in parallel; give "
                             "--seeds too (e.g. --seeds 0..9 --jobs 4)")
        return
    for flag, value in (("--checkpoint-dir", args.checkpoint_dir), ("--resume", args.resume),
                        ("--free-run", args.free_run)):
        if value is not None:
            raise SystemExit(f"error: --seeds with {flag}: not combined yet; run each seed "
                             f"with --seed S and its own {flag}")
    from gossip.comm.launch import launcher_size

    if launcher_size() > 1:
        raise SystemExit("error: --seeds runs its trials as processes of its own; run it "
                         "without mpiexec (or run each seed under mpiexec with --seed S)")


class ScriptFunction:
    """A function of a script file (``experiments/optimize.py``'s ``trial``) that a spawned
    process can call: it is pickled as the file's path and the function's name, and the file
    is imported in the process that calls it (a script run as ``__main__``, or loaded from
    its path by a test, has no module name another process could import)."""

    def __init__(self, path: str, name: str):
        self.path, self.name = str(path), name

    def __call__(self, arg: Any) -> Any:
        import importlib.util
        import sys

        key = f"_gossip_trial_{abs(hash(self.path))}"
        module = sys.modules.get(key)
        if module is None:
            spec = importlib.util.spec_from_file_location(key, self.path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            spec.loader.exec_module(module)
        return getattr(module, self.name)(arg)


def run_trials(fn: Callable[[Any], Any], trials: Sequence[Any], jobs: int) -> list[Any]:
    """``[fn(t) for t in trials]``, in ``jobs`` processes when ``jobs`` > 1 (``spawn``: fresh
    interpreters; ``fn`` must be picklable: a module-level function or a
    :class:`ScriptFunction`). Results come back in the order of ``trials``; the first trial
    that raises raises here."""
    if jobs <= 1 or len(trials) <= 1:
        return [fn(t) for t in trials]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(trials)), mp_context=context) as pool:
        return list(pool.map(fn, trials))


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """Mean, population standard deviation, min and max of the trials' values (None: some
    trial has none, e.g. did not reach the target)."""
    if not values or any(v is None for v in values):
        return None
    xs = [float(v) for v in values]
    mean = xs[0] if min(xs) == max(xs) else math.fsum(xs) / len(xs)  # equal: exactly it
    std = 0.0 if min(xs) == max(xs) else math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / len(xs))
    return {"mean": mean, "std": std, "min": min(xs), "max": max(xs)}


def format_spread(stats: dict[str, float] | None, fmt: str = ".3g") -> str:
    """``mean ± std`` of :func:`spread` (``not reached`` for None)."""
    if stats is None:
        return "not reached"
    return f"{format(stats['mean'], fmt)} ± {format(stats['std'], '.2g')}"


def run_seeds(args: argparse.Namespace, script: str, *, metric: str, final: tuple[str, str],
              columns: Sequence[tuple[str, str]], reached: str, ms: str, title: str,
              target: float) -> list[dict]:
    """Every run of a script once per seed of ``args.seeds``, ``args.jobs`` at a time: the
    script's ``trial(args)`` (its runs for one seed, records to ``args.out``, no table) in
    ``spawn``-ed processes (:class:`ScriptFunction` of the file ``script``). Then the records
    of all trials in seed order, each with ``seed``, into ``--out``; a markdown table of mean ±
    std over the seeds (:func:`trials_table`); a plot of ``metric``, the means with min-max
    bands. Returns every trial's table rows, each with its ``seed``."""
    import tempfile
    from pathlib import Path

    from gossip.metrics import JsonlLogger, read_jsonl

    with tempfile.TemporaryDirectory(prefix="gossip-seeds-") as tmp:
        trials = [argparse.Namespace(**(vars(args) | {
            "seed": seed, "seeds": None, "jobs": 1, "out": str(Path(tmp) / f"seed{seed}.jsonl"),
            "plot": None, "progress": False})) for seed in args.seeds]
        results = run_trials(ScriptFunction(script, "trial"), trials, args.jobs)
        logs = {seed: read_jsonl(t.out) if Path(t.out).exists() else []
                for seed, t in zip(args.seeds, trials)}
    with JsonlLogger(args.out) as logger:
        for seed, records in logs.items():
            for rec in records:
                logger.write(rec | {"seed": seed})
    rows = [r | {"seed": seed} for seed, trial_rows in zip(args.seeds, results) for r in trial_rows]
    print(trials_table(rows, final=final, columns=columns, reached=reached, ms=ms,
                       target=target))
    if args.plot:
        from gossip.plot import plot_runs

        labels = list(dict.fromkeys(r["run"] for r in rows))
        curves = {label: {seed: [r for r in logs[seed] if r.get("label") == label]
                          for seed in args.seeds} for label in labels}
        plot_runs(curves, args.plot, metric=metric,
                  title=f"{title}, seeds {args.seeds[0]}..{args.seeds[-1]} "
                        f"({len(args.seeds)} trials): mean, min-max band", flag="--plot")
    return rows


def trials_table(rows: list[dict], *, final: tuple[str, str], columns: Sequence[tuple[str, str]],
                 reached: str, ms: str, target: float) -> str:
    """The markdown table of repeated trials (``rows``: every trial's table row, with ``run``
    and ``status``): per run, mean ± std over the seeds of ``final`` (row key, header), of
    each of ``columns`` (reached by every seed, as the row key ``reached`` says, else ``not
    reached (k/N did)``) and of ``ms`` per round, and the statuses."""
    heads = [f"{h} to {target:g}" for _, h in columns]
    lines = [f"| run | seeds | {final[1]} | {' | '.join(heads)} | ms/round | status |",
             "|---|---|---|" + "---|" * len(heads) + "---|---|"]
    for label in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == label]
        hit = sum(r[reached] is not None for r in mine)
        cells = [format_spread(spread([r.get(k) for r in mine])) if hit == len(mine)
                 else f"not reached ({hit}/{len(mine)} did)" for k, _ in columns]
        statuses = sorted({r["status"] for r in mine})
        lines.append(f"| {label} | {len(mine)} | {format_spread(spread([r[final[0]] for r in mine]))}"
                     f" | {' | '.join(cells)} | {format_spread(spread([r[ms] for r in mine]))} "
                     f"| {', '.join(statuses)} |")
    return "\n".join(lines)
