"""Run a sweep of experiments from one TOML file, then compare them in a table and plots.

    python experiments/compare.py experiments/configs/sweep_consensus.toml
    python experiments/compare.py experiments/configs/sweep_digits.toml --mpi 8
    python experiments/compare.py sweep.toml --set rounds=100 --dry-run

A sweep file names a script and lists runs, each a set of that script's flags (the same keys
as its ``--config`` file; every run is checked before any starts)::

    title = "CHOCO-Gossip on a 25-ring"
    script = "consensus"          # consensus | optimize | train | path/to/script.py
    mpi = 0                       # 0: every run in this process; K: each under mpiexec -n K
    metric = "consensus_error"    # table column and first plot (default: the script's own)
    plots = ["consensus_error"]   # one PNG per metric, against rounds and against bits
    relative = true               # divide error metrics by their round-0 value (table, plots)
    target = 1e-6                 # optional: rounds, bits/node and, for timed runs, virtual
                                  # and wall seconds to reach this value of the metric
    columns = []                  # more record keys to show (final values) in the table
    out = "results/consensus"     # logs, table.md, PNGs (default results/<file name>)

    [defaults]                    # flags of every run
    nodes = 25

    [[run]]                       # one table row (or several, if the run logs several)
    label = "exact"
    compressor = "none"
    gamma = 1.0

    [grid]                        # optional: every combination, crossed with every [[run]]
    seed = [0, 1]

A run may also set ``script`` and ``mpi``. Logs are JSON lines (one per run, under ``out``);
the table is written to ``out/table.md`` and printed; plots are ``out/<metric>.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import itertools
import math
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# nothing here imports torch (--help answers at once); the scripts a sweep runs import it
from gossip.cli import HelpFormatter, add_list_argument, non_negative_int  # noqa: E402
from gossip.config import load_toml  # noqa: E402
from gossip.errors import ConfigFileError  # noqa: E402

SCRIPTS = {"consensus": "consensus.py", "optimize": "optimize.py", "train": "train.py"}
DEFAULT_METRIC = {"consensus": "consensus_error", "optimize": "distance_to_optimum",
                  "train": "test_accuracy"}
TOP_KEYS = {"title", "script", "mpi", "metric", "plots", "columns", "out", "x_keys", "defaults",
            "grid", "run", "relative", "target"}
RUN_KEYS = {"label", "script", "mpi"}


class SweepError(ValueError):
    """A sweep file that cannot run (the message names the file and the key or run)."""


@dataclass
class Run:
    """One command of the sweep."""

    label: str
    script: str
    flags: dict[str, Any]
    mpi: int
    log: Path
    argv: list[str] = field(default_factory=list)
    status: str = "not run"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("sweep", help="the sweep TOML file")
    p.add_argument("--out", default=None, help="output directory (overrides the file's 'out')")
    p.add_argument("--mpi", type=non_negative_int, default=None,
                   help="run each run under mpiexec -n K (0: in this process); overrides the file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a flag of every run (TOML value, e.g. --set rounds=100); repeatable")
    p.add_argument("--only", nargs="+", default=None, metavar="LABEL",
                   help="run only the runs with these labels")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--no-run", action="store_true",
                   help="only rebuild the table and plots from the logs already in the output")
    add_list_argument(p)
    from gossip.config import suggest_flags

    suggest_flags(p)
    return p.parse_args(argv)


# -- reading the sweep -----------------------------------------------------------------------------


def _toml_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):  # not TOML, nested too deep, or a number too long
        return text


def overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"--set {item!r}: write KEY=VALUE, e.g. --set rounds=100")
        out[key.strip()] = _toml_value(value.strip())
    return out


def _type(source: str, key: str, value: Any, kind: type | tuple, what: str) -> Any:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise SweepError(f"{source}: key '{key}' expects {what}, got {value!r}")
    return value


def script_path(name: str, source: str) -> Path:
    if name in SCRIPTS:
        return ROOT / "experiments" / SCRIPTS[name]
    path = Path(name)
    if not path.is_absolute():
        path = (ROOT / path) if (ROOT / path).exists() else Path(source).parent / path
    if not path.is_file():
        raise SweepError(
            f"{source}: script '{name}' is neither one of {sorted(SCRIPTS)} nor a file"
        )
    return path


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def expand(sweep: dict[str, Any], source: str, out: Path, mpi_override: int | None,
           sets: dict[str, Any]) -> list[Run]:
    """The runs of a sweep table, in order (defaults < run < grid point < --set)."""
    unknown = set(sweep) - TOP_KEYS
    if unknown:
        raise SweepError(f"{source}: unknown key '{sorted(unknown)[0]}'; valid top-level keys: "
                         f"{', '.join(sorted(TOP_KEYS))}")
    defaults = _type(source, "defaults", sweep.get("defaults", {}), dict, "a table of flags")
    grid = _type(source, "grid", sweep.get("grid", {}), dict, "a table of flag = [values]")
    runs = _type(source, "run", sweep.get("run", [{}]), list, "an array of [[run]] tables")
    mpi = _type(source, "mpi", sweep.get("mpi", 0), int, "an integer (0 = in process)")
    if mpi_override is not None:
        mpi = mpi_override
    top_script = sweep.get("script")
    for key, values in grid.items():
        _type(source, f"grid.{key}", values, list, "an array of values")
        if not values:
            raise SweepError(f"{source}: key 'grid.{key}' is an empty array")
    combos = itertools.product(*grid.values())
    points = [dict(zip(grid, combo, strict=True)) for combo in combos] or [{}]
    out_runs: list[Run] = []
    seen: dict[str, int] = {}
    for k, base in enumerate(runs):
        _type(source, f"run[{k}]", base, dict, "a table")
        script = base.get("script", top_script)
        if script is None:
            raise SweepError(f"{source}: run {k} has no script; set 'script' at the top or in it")
        _type(source, f"run[{k}].script", script, str, "a string")
        run_mpi = _type(source, f"run[{k}].mpi", base.get("mpi", mpi), int, "an integer")
        if mpi_override is not None:
            run_mpi = mpi_override
        for point in points:
            flags = {**defaults, **{a: b for a, b in base.items() if a not in RUN_KEYS},
                     **point, **sets}
            if "out" in flags or "config" in flags:
                raise SweepError(f"{source}: run {k} sets 'out'/'config'; compare.py chooses the "
                                 "log file itself (use the top-level 'out' for the directory)")
            label = str(base.get("label") or f"run {k}")
            if point:
                label += " " + ", ".join(f"{a}={b}" for a, b in point.items())
            name = slug(label)
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                name = f"{name}-{seen[name]}"
            run = Run(label, script, flags, run_mpi, out / f"{name}.jsonl")
            run.argv = to_argv(flags) + ["--out", str(run.log)]
            out_runs.append(run)
    return out_runs


def to_argv(flags: dict[str, Any]) -> list[str]:
    """Flags as command-line arguments (``true`` switches are given, ``false`` ones left out)."""
    argv: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *(_text(v) for v in value)]
        else:
            argv.append(f"{flag}={_text(value)}")
    return argv


def _text(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


# -- running ---------------------------------------------------------------------------------------


def load_script(path: Path) -> ModuleType:
    name = f"_gossip_experiment_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SweepError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def validate(run: Run, source: str) -> None:
    """Check the run before anything runs: its flags with its script's own parser, then, when
    the script has a ``check(argv)`` (the built-in ones do), the whole construction of its
    runs (algorithm, compressor, network model, hyper-parameters, the algorithm's own checks
    against the graph) in this process. A run for mpiexec is checked as its in-process twin,
    without ``--free-run`` (which needs one node per rank): what depends on the ranks is
    checked when it starts."""
    module = load_script(script_path(run.script, source))
    parse = getattr(module, "parse_args", None)
    if parse is None:
        return
    _refused(run, source, lambda: parse(run.argv))
    check = getattr(module, "check", None)
    if check is not None:
        flags = {k: v for k, v in run.flags.items()
                 if not (run.mpi and k.replace("-", "_") == "free_run")}
        _refused(run, source, lambda: check([*to_argv(flags), "--out", str(run.log)]))


def _refused(run: Run, source: str, call: Callable[[], Any]) -> None:
    """Run ``call`` (a parse or a check of ``run``); a refusal becomes a :class:`SweepError`
    naming the file and the run."""
    from gossip.errors import GossipError

    err = io.StringIO()
    argv0 = sys.argv[0]
    sys.argv[0] = str(script_path(run.script, source))  # argparse names the run's script
    try:
        with contextlib.redirect_stderr(err):
            call()
    except SystemExit as exc:
        if exc.code not in (0, None):
            msg = err.getvalue().strip().splitlines()
            text = exc.code if isinstance(exc.code, str) else (msg[-1] if msg else exc)
            raise SweepError(f"{source}: run '{run.label}': "
                             f"{str(text).removeprefix('error: ')}") from None
    except (GossipError, ValueError) as exc:
        raise SweepError(f"{source}: run '{run.label}': {exc}") from None
    finally:
        sys.argv[0] = argv0


def execute(run: Run, source: str) -> None:
    path = script_path(run.script, source)
    run.log.parent.mkdir(parents=True, exist_ok=True)
    if run.mpi and run.mpi > 0:
        exe = Path(sys.executable).parent / "mpiexec"
        cmd = [str(exe) if exe.exists() else "mpiexec", "-n", str(run.mpi), sys.executable,
               str(path), *run.argv]
        path_var = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path_var)
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        sys.stdout.write(res.stdout)
        if res.returncode != 0:
            tail = (res.stderr.strip().splitlines() or ["?"])[-1]
            run.status = f"failed (exit {res.returncode}): {tail}"
            return
        run.status = "ok"
        return
    module = load_script(path)
    try:
        module.main(run.argv)
        run.status = "ok"
    except SystemExit as exc:
        run.status = "ok" if exc.code in (0, None) else f"failed: {exc.code}"
    except Exception as exc:  # one bad run must not lose the others
        run.status = f"failed: {type(exc).__name__}: {exc}"


def command_line(run: Run, source: str) -> str:
    path = script_path(run.script, source)
    try:
        shown = path.relative_to(ROOT)
    except ValueError:
        shown = path
    prefix = f"mpiexec -n {run.mpi} " if run.mpi else ""
    return f"{prefix}python {shown} " + " ".join(run.argv)


# -- table and plots -------------------------------------------------------------------------------


def curves_of(run: Run) -> list[tuple[str, list[dict], dict]]:
    """(label, round records, summary) for each run inside the run's log."""
    from gossip.metrics import read_jsonl

    if not run.log.exists():
        return []
    out: list[tuple[str, list[dict], dict]] = []
    config: dict | None = None
    rounds: list[dict] = []
    summary: dict = {}

    def flush() -> None:
        if config is not None:
            out.append((config.get("label", ""), rounds, summary))

    for rec in read_jsonl(run.log):
        kind = rec.get("type")
        if kind == "config":
            flush()
            config, rounds, summary = rec, [], {}
        elif kind == "round":
            rounds.append(rec)
        elif kind == "summary":
            summary = rec
    flush()
    if len(out) == 1:
        return [(run.label, out[0][1], out[0][2])]
    return [(f"{run.label} / {inner}", recs, s) for inner, recs, s in out]


def _higher_is_better(metric: str) -> bool:
    return "accuracy" in metric


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)


def relative_to_start(recs: list[dict], metrics: list[str]) -> list[dict]:
    """Copies of ``recs`` with each error metric divided by its first logged value."""
    out = [dict(r) for r in recs]
    for m in metrics:
        if _higher_is_better(m):
            continue
        first = next((r[m] for r in out if r.get(m) is not None), None)
        if first:
            for r in out:
                if r.get(m) is not None:
                    r[m] = r[m] / first
    return out


def table(rows: list[tuple[str, list[dict], dict, str]], metric: str, columns: list[str],
          relative: bool = False, target: float | None = None) -> str:
    """The sweep's markdown table, one row per run. With a ``target`` of the metric, what each
    run took to reach it: rounds, bits per node and, for runs on a clock, virtual seconds (the
    network's timing models: stragglers, asynchronous runs) and wall seconds (``--free-run``)."""
    from gossip.outputs import clocks_of, first_reached, to_target_cell

    name = f"{metric} (rel.)" if relative and not _higher_is_better(metric) else metric
    clocks = clocks_of(recs for _, recs, _, _ in rows) if target is not None else []
    reach = ([] if target is None else
             [f"{what} to {target:g}" for what in ("rounds", "bits/node", *(h for _, h in clocks))])
    head = ["run", f"final {name}", f"best {name}", "rounds", "bits/node", *reach, *columns,
            "wall s", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, recs, summary, status in rows:
        values = [r.get(metric) for r in recs if r.get(metric) is not None]
        best = (max if _higher_is_better(metric) else min)(values) if values else None
        last = recs[-1] if recs else {}
        status = summary.get("status", status) if status == "ok" else status
        cells = [label, _fmt(values[-1] if values else None), _fmt(best), _fmt(last.get("round")),
                 _fmt(last.get("bits_per_node"))]
        if target is not None:
            hit = first_reached(recs, metric, target, higher=_higher_is_better(metric))
            cells += [to_target_cell(hit, "round", "d"), to_target_cell(hit, "bits_per_node", ".4g"),
                      *(to_target_cell(hit, key) for key, _ in clocks)]
        cells += [*(_fmt(last.get(c)) for c in columns), _fmt(summary.get("wall_time_s")), status]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_out(out: Path, where: str, no_run: bool) -> None:
    """Before any run: the sweep's output folder can be made and written (``where`` names the
    flag or key that gave it); with ``--no-run`` it must exist, since the logs are read from it."""
    from gossip.outputs import check_writable

    if no_run and not out.is_dir():
        what = "is not a directory" if out.exists() else "does not exist"
        raise SystemExit(f"error: --no-run reads the logs in {out}, which {what}; "
                         f"run the sweep first (without --no-run) or give --out the folder of its logs")
    problem = check_writable(out, where, directory=True)
    if problem:
        raise SystemExit(problem)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    source = args.sweep
    try:
        sweep = load_toml(source)
        out = Path(args.out or sweep.get("out") or ROOT / "results" / Path(source).stem)
        runs = expand(sweep, source, out, args.mpi, overrides(args.set))
        if args.only:
            missing = set(args.only) - {r.label for r in runs}
            if missing:
                raise SweepError(f"--only: no run labelled {sorted(missing)}; labels: "
                                 f"{[r.label for r in runs]}")
            runs = [r for r in runs if r.label in args.only]
        scripts = {r.script for r in runs}
        metric = sweep.get("metric") or DEFAULT_METRIC.get(next(iter(scripts)), "consensus_error")
        plots = _type(source, "plots", sweep.get("plots", [metric]), list, "an array of metrics")
        columns = _type(source, "columns", sweep.get("columns", []), list, "an array of keys")
        x_keys = tuple(_type(source, "x_keys", sweep.get("x_keys", ["round", "bits_per_node"]),
                             list, "an array of record keys"))
        relative = _type(source, "relative", sweep.get("relative", False), bool, "a boolean")
        target = sweep.get("target")
        if target is not None:
            _type(source, "target", target, (int, float), "a number (of the metric)")
        if not args.dry_run:
            check_out(out, "--out" if args.out else f"{source}'s 'out'", args.no_run)
        if not args.no_run:  # every run, before the first one starts
            for run in runs:
                if not args.dry_run or run.script in SCRIPTS:  # a user's script is not imported
                    validate(run, source)
    except (SweepError, ConfigFileError) as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.dry_run and any(r.script not in SCRIPTS for r in runs):
        print("note: --dry-run does not import the sweep's own script, so its flags are not "
              "checked", file=sys.stderr)

    if args.dry_run:
        text = "\n".join(command_line(r, source) for r in runs)
        print(text)
        return text
    for k, run in enumerate(runs, 1):
        if args.no_run:
            run.status = "ok" if run.log.exists() else "no log"
            continue
        print(f"[{k}/{len(runs)}] {run.label}: {command_line(run, source)}", flush=True)
        execute(run, source)
        if run.status != "ok":
            print(f"  {run.status}", file=sys.stderr, flush=True)

    rows = [(label, recs, summary, run.status) for run in runs
            for label, recs, summary in (curves_of(run) or [(run.label, [], {})])]
    if relative:
        rows = [(label, relative_to_start(recs, [metric, *plots]), summary, status)
                for label, recs, summary, status in rows]
    title = sweep.get("title") or Path(source).stem
    text = table(rows, metric, list(columns), relative, target)
    out.mkdir(parents=True, exist_ok=True)
    commands = "\n".join(f"    {command_line(r, source)}" for r in runs)
    try:
        (out / "table.md").write_text(f"# {title}\n\n{text}\n\nCommands:\n\n{commands}\n",
                                      encoding="utf-8")
    except OSError as exc:
        from gossip.errors import OutputError
        from gossip.outputs import os_reason, write_fix

        raise OutputError(f"cannot write the table {out / 'table.md'}: {os_reason(exc)}; "
                          f"{write_fix(exc.errno)}") from None
    print(text)
    from gossip.plot import plot_runs

    curves = {label: recs for label, recs, _, _ in rows if recs}
    for m in plots:
        if curves and any(r.get(m) is not None for recs in curves.values() for r in recs):
            path = plot_runs(curves, out / f"{slug(m)}.png", metric=m, x_keys=x_keys,
                             title=title + (" (relative to round 0)" if relative else ""),
                             logy=not _higher_is_better(m))
            print(f"plot: {path}")
    print(f"table: {out / 'table.md'}")
    failed = [f"{label}: {summary.get('status', status) if status == 'ok' else status}"
              for label, _, summary, status in rows
              if (summary.get("status", status) if status == "ok" else status) != "ok"]
    if failed and not args.no_run:
        from gossip.errors import RunFailed

        raise RunFailed(f"{len(failed)} of {len(rows)} run(s) did not finish ({'; '.join(failed)})")
    return text


if __name__ == "__main__":
    from types import SimpleNamespace

    from gossip.cli import guarded

    guarded(main, world_of=lambda: SimpleNamespace(size=1, rank=0, is_root=True))  # no MPI here
