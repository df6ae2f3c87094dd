"""Choosing the consensus step γ of CHOCO / DeepSqueeze by a short search (``--gamma auto``).

γ is the main failure mode of CHOCO-SGD and DeepSqueeze (docs/algorithms/choco.md): too small and the
nodes drift apart, too large and the run blows up, sometimes late. The search:

1. candidates = a log grid, by default :data:`GAMMA_GRID`, the 1-2-5 sequence from 1 down to
   0.01 (1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01);
2. each candidate runs the *same* problem — a fresh engine, the same seed — for a fraction of
   the run's rounds (the caller decides how many);
3. a candidate that diverges (:class:`~gossip.errors.DivergenceError`, or a non-finite score)
   is discarded; among the others the one with the lowest final score wins (ties: the smaller
   γ, the safer one). The score is the caller's "error": consensus error for consensus runs,
   distance to the optimum for convex problems, the averaged model's training loss f(x̄) for
   training runs.

Without ``--gamma``, CHOCO takes the rule of :mod:`gossip.algorithms.consensus_step` (from the
compressor's contraction and the mixing weights), which converges but is sized for the
compressor's worst case; the search looks for a faster γ on the run's own data.

Caveat: instability can appear only after many rounds (CHOCO top-1 % with γ = 0.06 on the
25-ring looks fine for 3000 rounds, docs/experiments.md#consensus), so a short search can pick a γ that
diverges later; the full run still stops cleanly if it does.

    search = search_gamma(lambda g: run_briefly(g))
    gamma = search.pick
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gossip.errors import ConfigError, DivergenceError, TuningError


def tunable_algorithms(hparam: str = "gamma") -> list[str]:
    """Registered algorithms whose class lists ``hparam`` in ``tunable``, sorted."""
    from gossip.algorithms import REGISTRY

    return sorted(name for name, cls in REGISTRY.items() if hparam in cls.tunable)


GAMMA_GRID = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01)
"""The default candidates: the 1-2-5 sequence from 1 down to 0.01."""


@dataclass
class Trial:
    """One candidate's outcome: its score, or why it was discarded."""

    gamma: float
    score: float | None
    status: str = "ok"


@dataclass
class GammaSearch:
    """The outcome of :func:`search_gamma`: the pick and every trial."""

    pick: float
    trials: list[Trial] = field(default_factory=list)
    rounds: int | None = None
    score_name: str = "score"

    def record(self) -> dict[str, Any]:
        """For the log's config record."""
        return {
            "pick": self.pick,
            "rounds_per_candidate": self.rounds,
            "score": self.score_name,
            "grid": [t.gamma for t in self.trials],
            "scores": [t.score for t in self.trials],
            "status": [t.status for t in self.trials],
        }

    def describe(self) -> str:
        """One line for stdout."""
        parts = [f"{t.gamma:g}: " + (f"{t.score:.4g}" if t.status == "ok" else t.status)
                 for t in self.trials]
        rounds = f" over {self.rounds} rounds each" if self.rounds else ""
        return (f"gamma search ({self.score_name}{rounds}): picked gamma = {self.pick:g} "
                f"[{'; '.join(parts)}]")


def search_gamma(
    trial: Callable[[float], float],
    grid: Sequence[float] | None = None,
    *,
    rounds: int | None = None,
    score_name: str = "score",
) -> GammaSearch:
    """Run ``trial(gamma) -> final score`` for every candidate; pick the lowest finite score.

    ``trial`` must build a fresh run (same seed) for each call. It may raise
    :class:`DivergenceError`; that candidate is then discarded.

    Raises:
        TuningError: every candidate diverged.
    """
    grid = list(grid if grid is not None else GAMMA_GRID)
    if not grid:
        raise ConfigError("the gamma grid is empty; give at least one candidate, or grid=None for "
                          "the default GAMMA_GRID")
    trials: list[Trial] = []
    for gamma in grid:
        try:
            score = float(trial(gamma))
        except DivergenceError as exc:
            trials.append(Trial(gamma, None, f"diverged at round {exc.round}"))
            continue
        if not math.isfinite(score):
            trials.append(Trial(gamma, None, "non-finite"))
            continue
        trials.append(Trial(gamma, score))
    ok = [t for t in trials if t.score is not None]
    if not ok:
        raise TuningError(
            f"every gamma in {grid} diverged; try smaller values (e.g. --gamma-grid 0.01 0.005 "
            "0.002) or a smaller learning rate"
        )
    best = min(ok, key=lambda t: (t.score, t.gamma))
    return GammaSearch(best.gamma, trials, rounds, score_name)


def final_score(engine: Any, rounds: int, key: str = "consensus_error",
                metrics: Sequence[Callable] = ()) -> float:
    """Run ``engine`` for ``rounds`` rounds, logging only the ends; the last record's ``key``.

    A ready-made ``trial`` body for consensus and convex runs (divergence propagates as
    :class:`DivergenceError`, which :func:`search_gamma` counts as a discarded candidate).
    """
    records = engine.run(rounds, log_every=max(rounds, 1), metrics=list(metrics))
    value = records[-1].get(key)
    return float("nan") if value is None else float(value)


def tune_gamma(build: Callable[[float], Any], rounds: int, key: str = "consensus_error",
               metrics: Sequence[Callable] = (), grid: Sequence[float] | None = None) -> GammaSearch:
    """``--gamma auto``: run ``build(gamma)`` (a fresh engine) for ``rounds`` rounds per candidate
    and pick the γ with the lowest final ``key`` among those that did not diverge."""
    return search_gamma(lambda g: final_score(build(g), rounds, key, metrics), grid,
                        rounds=rounds, score_name=key)
