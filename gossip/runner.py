"""One labeled run of an engine: its log records, divergence handling and checkpoints.

Every experiment script runs its engines through :func:`execute`, so they all write the same
JSON-lines records, stop a diverging run the same way, and checkpoint/resume the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gossip.checkpoint import Checkpointer
from gossip.engine import Engine, Metric
from gossip.errors import CheckpointError, ConfigError, DivergenceError, OutputError
from gossip.metrics import JsonlLogger, weighted_cost
from gossip.network import NodeMetric

log = logging.getLogger(__name__)

VOLATILE_ARGS = {"out", "plot", "progress", "verbose", "checkpoint_every", "checkpoint_dir",
                 "resume", "timeout", "max_memory", "rounds", "iterations", "epochs", "config", "threads"}
"""Flags that may change between a run and its resume (they do not change its numbers)."""


@dataclass
class RunResult:
    label: str
    records: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"


def run_identity(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """What a checkpoint must match: the config record minus flags that may change."""
    ident = {k: v for k, v in config.items() if k not in ("type", "args", "versions")}
    ident["args"] = {k: v for k, v in config.get("args", {}).items() if k not in VOLATILE_ARGS}
    ident["gossip"] = config.get("versions", {}).get("gossip")
    ident["world_size"] = world_size
    return ident


def execute(
    engine: Engine,
    *,
    label: str,
    config: dict[str, Any],
    logger: JsonlLogger,
    rounds: int,
    log_every: int,
    metrics: list[Metric] = (),
    progress: bool = False,
    checkpoint_dir: str | None = None,
    node_metrics: list[NodeMetric] = (),
    checkpoint_every: int = 0,
    resume: bool = False,
    not_extendable: str | None = None,
    flags: Mapping[str, tuple[str, Any]] | None = None,
    cost_weights: Mapping[str, float] | None = None,
) -> RunResult:
    """Run ``engine`` for ``rounds`` rounds (from a checkpoint when ``resume``), logging as it goes
(``node_metrics``: a free run's per-node values, :meth:`Engine.run`).

    The config record is written first; each round record gets the run's ``label``; a
    :class:`DivergenceError` ends the run with ``status = "diverged at round R"`` (the rest of a
    comparison goes on); the summary record closes it. A finished run resumed with more rounds
    continues from its last round, unless ``not_extendable`` says why it cannot (e.g. a
    learning-rate schedule that spans the run's length). ``flags`` (the scripts' option strings
    and defaults, :func:`gossip.config.flag_defaults`) lets a refused resume name flags.
    ``cost_weights`` (``--cost-weights``): each round record gains ``cost``
    (:func:`gossip.metrics.weighted_cost`).
    """
    result = RunResult(label)
    config = {"type": "config", "label": label} | config
    ckpt = None
    if checkpoint_dir is not None and engine.network.free_run is not None:
        raise ConfigError(f"{engine.algorithm.name} --free-run: a free run's events happen in "
                          "wall-clock time and differ from run to run, so it cannot be "
                          "checkpointed; run it in virtual time (without --free-run)")
    if checkpoint_dir is not None:
        ckpt = Checkpointer(checkpoint_dir, run_identity(config, engine.world.size),
                            every=checkpoint_every, world=engine.world, flags=flags)
    try:
        return _execute(engine, ckpt, result, config, logger, rounds, log_every, metrics,
                        progress, resume, not_extendable, node_metrics, cost_weights)
    finally:
        if ckpt is not None:
            ckpt.close()


def _execute(engine: Engine, ckpt: Checkpointer | None, result: RunResult, config: dict,
             logger: JsonlLogger, rounds: int, log_every: int, metrics: list[Metric],
             progress: bool, resume: bool, not_extendable: str | None,
             node_metrics: list[NodeMetric] = (),
             cost_weights: Mapping[str, float] | None = None) -> RunResult:
    label = result.label
    start_round = 0
    if ckpt is not None and resume:
        manifest = ckpt.manifest()
        if manifest is not None:
            ckpt.check_identity(manifest)  # refused before anything is written
            if manifest.get("complete"):
                finished = _finished_round(ckpt)
                cut = finished is None  # its summary was cut off: run on from its last round
                if cut:
                    finished = max(manifest["rounds"], default=0)
                if cut and rounds < finished:
                    raise CheckpointError(
                        f"{ckpt.dir}: the run finished at round {finished} but its summary record "
                        f"was cut off; resume it with --rounds {finished} (or more) to write it")
                if cut and rounds == finished:
                    pass
                elif rounds <= finished:
                    return _replay_complete(ckpt, logger, result)
                elif not_extendable:
                    raise CheckpointError(f"{ckpt.dir}: the run finished at round {finished} and "
                                          f"cannot be continued to round {rounds}: {not_extendable}")
                elif finished not in manifest["rounds"]:
                    raise CheckpointError(
                        f"{ckpt.dir}: the run finished at round {finished} but its newest "
                        f"checkpoint is of round {max(manifest['rounds'], default=0)}, so it cannot "
                        f"be continued to round {rounds}; start it again with a new "
                        "--checkpoint-dir"
                    )
                else:
                    log.info("%s: continuing the finished run from round %d to %d", label,
                             finished, rounds)
                ckpt.mark_complete(False)  # killed while continuing: resumed, not replayed
            start_round = ckpt.restore(engine)  # 0: none left before a cut in the records
            if start_round:
                replay = [r for r in ckpt.records_until(start_round) if r.get("type") != "summary"]
                ckpt.reset_records(replay)
                for rec in replay:
                    logger.write(rec)
                    if rec.get("type") == "round":
                        result.records.append(rec)
                log.info("%s: resumed from the checkpoint of round %d", label, start_round)
    if start_round == 0:
        if ckpt is not None:
            ckpt.reset_records([])
            ckpt.append_record(config)
        logger.write(config)

    def on_record(rec: dict[str, Any]) -> None:
        if "consensus_error" in rec:  # Ξ(X^t)/Ξ(X^0), what tables and plots show
            initial = (result.records[0] if result.records else rec)["consensus_error"]
            rec["consensus_error_rel"] = rec["consensus_error"] / initial if initial else None
        if "grad_norm" in rec:  # ‖∇f(x̄)‖'s minimum over the records so far (resumes: replayed)
            before = [r["grad_norm_min"] for r in result.records[-1:] if "grad_norm_min" in r]
            rec["grad_norm_min"] = min(before[0], rec["grad_norm"]) if before else rec["grad_norm"]
        if cost_weights and rec.get("type") == "round":
            rec["cost"] = weighted_cost(rec, cost_weights)
        rec["label"] = label
        result.records.append(rec)
        try:
            logger.write(rec)
        except OutputError as exc:  # the log cannot be written (disk full): say what is kept
            note = ckpt.resume_note() if ckpt is not None else ""
            if not note:
                raise
            raise OutputError(f"{exc}. {note}", round=rec.get("round")) from None
        if ckpt is not None:
            ckpt.append_record(rec)

    if ckpt is not None:
        ckpt.install_signal_handlers()
    try:
        engine.run(rounds - engine.round, log_every=log_every, metrics=metrics,
                   node_metrics=node_metrics,
                   on_record=on_record, progress=progress, checkpointer=ckpt)
    except DivergenceError as exc:
        result.status = f"diverged at round {exc.round}"
        log.warning("%s: %s", label, exc)
    finally:
        if ckpt is not None:
            ckpt.remove_signal_handlers()
    result.summary = engine.summary() | {"label": label, "status": result.status}
    logger.write(result.summary)
    if ckpt is not None:
        finished = result.status == "ok" and engine.round >= rounds
        if finished and engine.round not in ckpt.saved_rounds():
            ckpt.save(engine)  # so that a resume with more rounds can continue the run
        ckpt.append_record(result.summary)
        if finished:
            ckpt.mark_complete()
    return result


def _finished_round(ckpt: Checkpointer) -> int | None:
    """The last round of a finished run, from its summary record."""
    summaries = [r for r in ckpt.records_until(10**12) if r.get("type") == "summary"]
    return int(summaries[-1].get("rounds", 0)) if summaries else None


def _replay_complete(ckpt: Checkpointer, logger: JsonlLogger, result: RunResult) -> RunResult:
    """A run that had finished before the interruption: write its records again, run nothing."""
    for rec in ckpt.records_until(10**12):
        logger.write(rec)
        if rec.get("type") == "round":
            result.records.append(rec)
        elif rec.get("type") == "summary":
            result.summary = rec
            result.status = rec.get("status", "ok")
    return result
