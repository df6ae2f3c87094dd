"""Matplotlib figures of runs: a metric against rounds, against bits sent (log scale) and, for
runs in virtual time, against it; for free runs under mpiexec, against wall time; against a
weighted ``cost`` when the records carry one (``--cost-weights``). A run given as repeated
trials (``{seed: records}``, ``--seeds``) is drawn as the mean over the seeds with a shaded
min–max band."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def plot_runs(
    runs: Mapping[str, Sequence[Mapping[str, Any]] | Mapping[int, Sequence[Mapping[str, Any]]]],
    path: str | Path,
    metric: str = "consensus_error",
    x_keys: Sequence[str] = ("round", "bits_per_node"),
    title: str | None = None,
    logy: bool = True,
    flag: str | None = None,
) -> Path:
    """One panel per x key, one curve per run label (a run of several trials, ``{seed:
    records}``: their mean at each round, x and y, with the min–max band of y shaded); writes
    the image to exactly ``path`` (in
    the format of its suffix, PNG without one) and returns the path. A bits axis (an x key
    starting with ``bits``) spanning decades is symlog, so round 0's zero bits stay drawn.

    A file that cannot be written (a directory that cannot be made or written, a full disk, a
    format whose writer is missing) is a :class:`gossip.errors.OutputError` naming the path, and
    ``flag`` (e.g. ``"--plot"``) when given: the run it shows has happened, so a script exits
    with status 1.
    """
    from gossip.errors import OutputError

    try:
        import matplotlib
    except ImportError as exc:
        raise OutputError(f"cannot write the plot {path}{_given(flag)}: matplotlib cannot be "
                          f"imported ({exc}); install it (pip install matplotlib)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [r for recs in runs.values() for r in _records(recs)]
    if "time_virtual_s" not in x_keys and any(  # runs in virtual time get a time panel too
            "time_virtual_s" in r for r in every):
        x_keys = (*x_keys, "time_virtual_s")
    if "wall_s" not in x_keys and any(  # free runs' round records: the snapshots' wall instants
            r.get("type") == "round" and "wall_s" in r for r in every):
        x_keys = (*x_keys, "wall_s")
    if "cost" not in x_keys and any(r.get("cost") is not None for r in every):
        x_keys = (*x_keys, "cost")  # --cost-weights: the weighted cost of what a node did

    labels = {"round": "round", "bits_per_node": "bits sent per node", "epoch": "epoch",
              "bits_exchanged": "bits sent and received per participant",
              "time_virtual_s": "virtual time (s)", "wall_s": "wall time since the start (s)",
              "cost": "weighted cost per node (--cost-weights)"}
    fig, axes = plt.subplots(1, len(x_keys), figsize=(6 * len(x_keys), 4.2), squeeze=False)
    palette = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20").colors
    styles = ["-", "--", ":", "-."]
    for ax, xk in zip(axes[0], x_keys):
        xs_all: list[float] = []
        for idx, (label, recs) in enumerate(runs.items()):
            color = palette[idx % len(palette)]
            if isinstance(recs, Mapping):  # trials: the mean and the min-max band
                band = _band(recs, xk, metric)
                if band is None:
                    continue
                xs, ys, low, high = band
                if logy:
                    low = [max(y, 1e-300) for y in low]
                ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)
            else:
                pts = [(r[xk], r[metric]) for r in recs if r.get("type") == "round"
                       and r.get(metric) is not None and r.get(xk) is not None]
                if not pts:
                    continue
                xs, ys = (list(v) for v in zip(*pts))
            xs_all.extend(xs)
            if logy:
                ys = [max(y, 1e-300) for y in ys]
            ax.plot(xs, ys, label=label, color=color,
                    linestyle=styles[(idx // len(palette)) % len(styles)])
        if logy:
            ax.set_yscale("log")
        positive = [x for x in xs_all if x > 0]
        if xk.startswith("bits") and positive and max(positive) >= 10 * min(positive):
            # logarithmic from the first round's bits on and linear below them, so round 0
            # (no bits sent yet) is drawn at x = 0, as on the rounds panel; within one decade
            # a log axis only labels crowded minor ticks
            low, high = min(positive), max(positive)
            ax.set_xscale("symlog", linthresh=low, linscale=1.0)
            ax.set_xlim(left=0)
            decades = range(math.ceil(math.log10(low)), math.floor(math.log10(high)) + 1)
            ax.set_xticks([0, *(10.0**k for k in decades)])  # none crowding 0 below the first
        ax.set_xlabel(labels.get(xk, xk))
        ax.set_ylabel(metric.replace("_", " "))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # an explicit format: without one matplotlib appends ".png" to a path with no suffix
        # and writes a file the user did not name (/dev/full -> /dev/full.png)
        fig.savefig(path, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    except (OSError, ImportError, RuntimeError, ValueError) as exc:  # ValueError: a format it lacks
        from gossip.outputs import os_reason

        why = os_reason(exc) if isinstance(exc, OSError) else str(exc).strip().splitlines()[0]
        raise OutputError(f"cannot write the plot {path}{_given(flag)}: {why}; give "
                          f"{flag or 'it'} a .png path in a directory you can write to") from None
    finally:
        plt.close(fig)
    return path


def _records(recs: Any) -> list[Mapping[str, Any]]:
    """A run's records, a trials' run's all seeds' records together."""
    if isinstance(recs, Mapping):
        return [r for trial in recs.values() for r in trial]
    return list(recs)


def _band(trials: Mapping[int, Sequence[Mapping[str, Any]]], xk: str, metric: str
          ) -> tuple[list[float], list[float], list[float], list[float]] | None:
    """At each round every trial recorded: the mean x, the mean y and y's min and max."""
    per: list[dict[int, tuple[float, float]]] = []
    for recs in trials.values():
        per.append({r["round"]: (r[xk], r[metric]) for r in recs if r.get("type") == "round"
                    and r.get(metric) is not None and r.get(xk) is not None})
    rounds = sorted(set.intersection(*(set(p) for p in per))) if per else []
    if not rounds:
        return None
    xs, ys, low, high = [], [], [], []
    for t in rounds:
        pts = [p[t] for p in per]
        xs.append(math.fsum(x for x, _ in pts) / len(pts))
        vals = [y for _, y in pts]
        ys.append(math.fsum(vals) / len(vals))
        low.append(min(vals))
        high.append(max(vals))
    return xs, ys, low, high


def _given(flag: str | None) -> str:
    return f" ({flag})" if flag else ""
