"""The runs of a multi-run script (``--compare``, several ``--compressor``): one value per run,
each run's label, every entry built before the first runs, and the table's verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gossip.cli.hparams import label_value


def split_per_run(values: list[Any] | None, count: int, name: str) -> list[Any]:
    """One value for all runs, or exactly one per run."""
    if not values:
        return [None] * count
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise SystemExit(f"{name}: give one value or one per run ({count}), got {len(values)}")
    return list(values)


def run_label(head: str, wire: str | None, hparams: dict[str, Any], sep: str = "@") -> str:
    """A run's label: what differs between runs, the algorithm, what it sends (its compressor or,
    for an all-reduce method, its codec) and every ``--hparam`` it was given, e.g.
    ``onebit-adam@sign_l1 freeze_step=20``; a plug-in by its short label
    (:func:`short_label`: ``int8``, not ``path/to/my_parts.py:StochasticInt8``)."""
    head, wire = short_label(head), None if wire is None else short_label(wire)
    label = head if wire is None else f"{head}{sep}{wire}"
    return label + "".join(f" {k}={label_value(v)}" for k, v in hparams.items()
                           if not (k == "codec" and v == wire))


def short_label(spec: str) -> str:
    """The label of a part in tables, plots and log records: ``spec`` itself for a registered
    name (``topk:0.1``); for a plug-in spec (``path/to/my_parts.py:StochasticInt8:PARAMS`` or
    ``module:Class``), the name the class is registered under (``int8``, ``local-gossip``),
    else its own name, followed by the spec's parameters. A path says where the code is, not
    what the run was; the config record keeps the spec as given."""
    from gossip.errors import PluginError
    from topologies.registry import import_target, parse_target

    target = parse_target(spec) if isinstance(spec, str) else None
    if target is None:
        return spec
    try:
        obj = import_target(target, error=PluginError)
    except PluginError:
        return spec  # the run refuses it with the reason; a label is no place for that
    name = _registered_name(obj) or target.attr.rsplit(".", 1)[-1]
    return ":".join((name, *target.params))


def _registered_name(obj: object) -> str | None:
    """The name ``obj`` is registered under as a compressor or an algorithm (None if neither)."""
    from gossip.algorithms import REGISTRY
    from gossip.compress import COMPRESSORS

    for registry in (COMPRESSORS.objects, REGISTRY):
        for name, value in registry.items():
            if value is obj:
                return name
    return None


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
    under :func:`gossip.cli.guard.guarded`) unless every run ended "ok".

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


def target_note(missed: list[tuple[str, int | None]], target: float, metric: str) -> str | None:
    """The note printed under a table whose runs did not all reach ``--target``: which ran out
    of rounds (``missed``: each run's label and the last round it logged) before ``metric``
    fell to ``target``, and the flags that give them the chance; None when every run reached
    it."""
    if not missed:
        return None
    ended = "; ".join(f"{label} after {last} rounds" if last is not None else label
                      for label, last in missed)
    return (f"not reached: {len(missed)} run(s) ended before the {metric} fell to --target "
            f"{target:g} ({ended}); raise --rounds or --target to see it reached")
