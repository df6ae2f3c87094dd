"""Metrics over all nodes and the JSON-lines log that carries them.

Consensus error is ``(1/n) Σ_i ‖x_i − x̄‖²``, computed by reducing x̄ first and then the squared
distances (never ‖x‖² − ‖x̄‖², which cancels catastrophically). Per-node terms are gathered and
summed in node order, so the value does not depend on how nodes are spread over processes.

Record schema (stable; other tools read it): every record has ``type``: ``config`` (first),
``round`` (``round`` 0 = before any exchange, ``consensus_error``, ``bits_per_node`` mean
cumulative, ``bits_per_node_max``, ``time_s``, ``compute_s``, ``comm_s``; where the nodes' oracles count
their calls, :data:`ORACLE_FIELDS`: ``grads_per_node``, ``sample_grads_per_node``,
``values_per_node``, ``prox_per_node``, each the mean cumulative count over the nodes that hold
an oracle (the clients of a federated run); plus the scripts' metrics, e.g. ``grad_norm``
``‖∇f(x̄)‖`` (:func:`gradient_metric`) and, added by :func:`gossip.runner.execute`,
``grad_norm_min``, its minimum so far),
``node`` (free runs only: one node's snapshot, ``node``, ``round``, ``wall_s``, ``local_steps``,
``bits_sent`` plus node metrics; :mod:`gossip.network.freerun`) and ``summary`` (last:
``wall_time_s``; ``seconds_per_round``, the rounds' own time per round; apart from it
``setup_s``, ``first_round_s`` (warm-up), ``steady_s_per_round`` (the rounds after the first)
and ``record_s``, the metrics' time: :meth:`gossip.engine.Engine.summary`).
"""

from __future__ import annotations

import json
import math
import platform
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import torch

from gossip.errors import OutputError
from gossip.outputs import os_reason, write_all, write_fix
from gossip.problems.oracles import ORACLE_FIELDS

#: Entries of the block's rows that :func:`squared_distances` takes at a time: its one scratch
#: tensor (at most float64) is 8 MiB, whatever the number of nodes or the model's size.
CHUNK_ENTRIES = 1 << 20


def consensus_error(engine: Any, xbar: torch.Tensor) -> float:
    """(1/n) Σ_i ‖x_i − x̄‖² over every node of the run (collective)."""
    terms = engine.node_values(squared_distances(engine, xbar))
    return math.fsum(terms.tolist()) / engine.n


def squared_distances(engine: Any, target: torch.Tensor) -> dict[int, float]:
    """``{i: ‖x_i − target‖²}`` for the local nodes, each the sum of its own row (a row's sum
    over its entries rounds as the per-node ``torch.sum`` did, wherever the row sits), the
    block's rows taken :data:`CHUNK_ENTRIES` at a time rather than node by node (10⁶ nodes:
    seconds), squared in place so that one chunk-sized scratch tensor is alive."""
    block = getattr(engine, "block", None)
    X = getattr(block, "x", None)
    if X is None or X.dim() != 2 or X.shape[1] != target.numel() or len(engine.nodes) != X.shape[0]:
        return {i: float(torch.sum((nd.x - target) ** 2)) for i, nd in engine.nodes.items()}
    step = max(1, CHUNK_ENTRIES // max(1, X.shape[1]))
    sums = torch.cat([(X[r : r + step] - target).square_().sum(dim=1)
                      for r in range(0, X.shape[0], step)])
    return dict(zip(block.ids, sums.tolist()))


def squared_distance(engine: Any, target: torch.Tensor) -> float:
    """(1/n) Σ_i ‖x_i − target‖² / ‖target‖² (collective; not divided when ``target`` is 0); for
    a federated algorithm ‖x_0 − target‖² / ‖target‖², the server's model being the run's."""
    terms = engine.node_values(squared_distances(engine, target))
    if getattr(engine.algorithm, "federated", False):
        terms = terms[:1]
    value = math.fsum(terms.tolist()) / len(terms)
    norm = float(torch.sum(target**2))
    return value / norm if norm > 0 else value




def oracle_fields(engine: Any) -> dict[str, float]:
    """The record's oracle counters of :data:`ORACLE_FIELDS` (collective: one exchange), each
    the mean over the nodes that hold an oracle. No fields where no node's oracle counts
    (models' oracles, runs without gradients); whether a run counts is settled at its first record,
    with one vote of the processes, so every process writes the same fields."""
    if engine.oracle_counts is None:
        engine.oracle_counts = engine.world.any(any(
            callable(getattr(nd.oracle, "counters", None)) for nd in engine.nodes.values()))
    if not engine.oracle_counts:
        return {}
    width = 1 + len(ORACLE_FIELDS)
    local = {}
    for i, nd in engine.nodes.items():
        counters = getattr(nd.oracle, "counters", None)
        calls = counters() if callable(counters) else None
        local[i] = ([1.0, *(float(calls.get(k, 0)) for k in ORACLE_FIELDS)] if calls
                    is not None else [0.0] * width)
    rows = engine.node_values(local, width=width)
    held = rows[:, 0] > 0
    nodes = int(held.sum())
    return {field: math.fsum(rows[held, k].tolist()) / nodes
            for k, field in enumerate(ORACLE_FIELDS.values(), start=1)}


def gradient_metric(engine: Any, xbar: torch.Tensor) -> dict[str, float]:
    """The metric ``grad_norm`` = ‖∇f(x̄)‖ (:func:`gradient_norm`), for ``Engine.run(metrics=
    [...])``: it costs one full local gradient per node at every record, so a script asks for
    it (experiments/optimize.py does) rather than every run paying for it."""
    return {"grad_norm": gradient_norm(engine, xbar)}


COST_KEYS = {"comm": "bits_per_node", "grad": "grads_per_node",
             "sample": "sample_grads_per_node", "value": "values_per_node", "prox": "prox_per_node"}
"""The weights a cost takes (``--cost-weights comm=1e-6,grad=1``) and the record field each
multiplies: a bit sent, a gradient estimate, a per-sample gradient, a loss value, a proximal
step (all per node, cumulative)."""


def weighted_cost(record: Mapping[str, Any], weights: Mapping[str, float]) -> float | None:
    """``Σ_k weights[k] · record[COST_KEYS[k]]``: what a round record's run has cost a node so
    far, in the user's units (None when a weighted field is missing from the record: a run
    whose oracles do not count)."""
    total = []
    for key, weight in weights.items():
        value = record.get(COST_KEYS[key])
        if value is None:
            return None
        total.append(weight * value)
    return math.fsum(total)


def gradient_norm(engine: Any, xbar: torch.Tensor) -> float:
    """‖∇f(x̄)‖ with ``f = (1/n_f) Σ_i f_i`` over the ``n_f`` nodes whose oracle has a problem
    (collective): each process evaluates its nodes' ``∇f_i(x̄)`` on the problem behind the
    oracle (not through the oracle, so the counters see only the algorithm's calls), and the
    sum is a running sum in node order over the processes
    (:meth:`gossip.comm.world.World.ordered_sum`), so the value is the same in one process
    and under mpiexec. The smooth part only: with a regularizer ``r`` (lasso) it is not 0 at
    the optimum."""
    d = xbar.numel()
    local = {}
    for i, nd in engine.nodes.items():
        term = torch.zeros(d + 1, dtype=xbar.dtype, device=xbar.device)
        found = _problem_of(nd.oracle)
        if found is not None:
            problem, j = found
            problem.grad_full(j, xbar, term[:d])
            term[d] = 1.0
        local[i] = term
    total = engine.world.ordered_sum(local)
    count = float(total[d])
    if count == 0:
        return float("nan")
    return float(torch.linalg.vector_norm(total[:d].to(torch.float64) / count))


def _problem_of(oracle: Any) -> tuple[Any, int] | None:
    """``(problem, index)`` behind a problem's oracle (None for any other oracle)."""
    problem = getattr(oracle, "problem", None)
    if problem is None or not callable(getattr(problem, "grad_full", None)):
        return None
    return problem, int(oracle.node)


def first_reach(records: Iterable[Mapping[str, Any]], key: str, target: float) -> Mapping | None:
    """The first round record whose ``key`` is at or below ``target`` (None if never)."""
    for rec in records:
        if rec.get("type") == "round" and rec.get(key) is not None and rec[key] <= target:
            return rec
    return None


def versions() -> dict[str, str]:
    """Versions that determine the numbers, for the config record."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("numpy", "scipy", "networkx", "mpi4py"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    from gossip import __version__

    out["gossip"] = __version__
    return out


class JsonlLogger:
    """Appends one JSON object per line; only the root process writes (others are no-ops).

    The file is opened (and, with ``mode="w"``, truncated) at the first record, not before:
    a run refused before it starts (a resume of another run's checkpoint, a bad flag) leaves
    an existing log as it was. Each line is written whole or not at all: a file that cannot be
    opened or written (no permission, disk full, a file-size limit) is a
    :class:`gossip.errors.OutputError` naming it (the scripts checked the path before the run,
    so this is a run that failed: exit status 1), and the lines before stay as they were.
    """

    def __init__(self, path: str | Path | None, enabled: bool = True, mode: str = "w"):
        self._fh: IO[bytes] | None = None
        self._path = Path(path) if path is not None and enabled else None
        self._mode = mode
        self._lines = 0

    def write(self, record: Mapping[str, Any]) -> None:
        if self._fh is None and self._path is not None:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self._path, self._mode + "b", buffering=0)  # noqa: SIM115 (closed in close())
            except OSError as exc:
                raise OutputError(f"cannot write the log {self._path} (--out): {os_reason(exc)}; "
                                  f"{write_fix(exc.errno)}, or give --out another file") from None
        if self._fh is not None:
            try:
                write_all(self._fh, (json.dumps(record, default=_jsonable) + "\n").encode())
            except OSError as exc:
                kept = (f"; the run stops here, with the {self._lines} record(s) written before "
                        "kept whole in it" if self._lines else "")
                raise OutputError(f"cannot write the log {self._path} (--out): {os_reason(exc)}"
                                  f"{kept}; {write_fix(exc.errno)}, or give --out another file"
                                  ) from None
            self._lines += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._path = None

    def __enter__(self) -> JsonlLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines log."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (Path, torch.dtype, torch.device)):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    return repr(value)
