"""The default consensus step γ of CHOCO-type methods, from the compressor's quality and the graph.

CHOCO's public copies follow the models through compressed differences,
``x̂_i ← x̂_i + α C(x_i − x̂_i)``, while the consensus step ``x_i ← x_i + γ (Σ_j w_ij x̂_j − x̂_i)``
moves the models on what the copies say. The copies catch up by a fraction δ of their lag per
round (the compressor's contraction, ``E‖αC(v) − v‖² ≤ (1 − δ)‖v‖²``), while node i's own
lagging copy feeds back into its model with gain ``γ (1 − w_ii)``. The run is stable when that
gain stays below what the copies recover each round, ``γ (1 − w_ii) ≲ δ``: measured on
consensus (d = 400, 400 rounds; docs/algorithms/choco.md, "The default γ"), the largest stable
γ on a grid was 0.7-1.8 × ``δ / (1 − w_ii)`` for rand-k (whose δ = k/d is exact) and scaled
QSGD, whatever the graph (ring, torus, complete; 8-32 nodes), while the spectral gap set only
the speed (CHOCO's Theorem 2 value ``γ* = gap² δ / (16 gap + gap² + 4β² + 2 gap β² − 8 gap δ)``
also converges, 80-800× more slowly). Near those limits the error jitters (rand-k with 6 of 64
entries on the complete graph of 8: bumps of 7× at 0.5 × the ratio, a smooth descent at 0.33),
hence the rule, with a factor 2-3 of margin::

    γ = min(1, SAFETY · δ / max_i (1 − w_ii)),    SAFETY = 1/3

δ is read from the compressor's properties (never its spec), so a user's compressor gets the
rule its properties say:

* the identity: δ = 1 and γ = 1 (plain gossip);
* an unbiased compressor with variance ω (``qsgd:B``, ``lead:B``, ``natural``,
  ``randk:R:unbiased``): CHOCO uses it rescaled, ``C/(1 + ω)`` (its paper's form; ``C`` itself
  is not a contraction when ω ≥ 1 and no γ converges, measured on ``qsgd:4bit``), so the copies
  move by ``α = 1/(1 + ω)`` of each message and δ = 1/(1 + ω);
* a contractive compressor: its ``delta_for(d)`` (top-k and biased rand-k ``k/d``, scaled sign
  ``1/d``, ``qsgd:…:biased`` ``1/(1 + ω)``, the 16-bit casts ≈ 1);
* none known (one warm-started low-rank power step, ``sign_l2``, ``vote``, a compressor that
  says nothing): δ = :data:`UNKNOWN_DELTA`, the quality of ``lowrank:1`` on a 40×50 matrix
  (stable up to γ ≈ 0.04 on the ring of 8, where this gives 0.015), with a warning that γ
  should be tuned (``--gamma auto``).

Worst-case δ makes the rule slow where the data are kinder than the worst case (top-k and
sign on dense vectors): it is a default that converges, not the fastest γ; ``--gamma auto``
searches faster ones, and an explicit γ is used as given.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

SAFETY = 1.0 / 3.0
"""The rule's margin below the largest stable γ measured (0.7 × ``δ / (1 − w_ii)`` at the least)."""

UNKNOWN_DELTA = 0.03
"""δ assumed for a compressor that reports none (``lowrank:1``: stable up to γ ≈ 0.04 on a
ring of 8 with a 40×50 matrix, where this gives γ = 0.015)."""


def copy_damping(compressor: Any, numel: int) -> float:
    """α, the fraction of each message the public copies move by: ``1/(1 + ω)`` for an unbiased
    compressor with variance ω > 0 (CHOCO's rescaled ``C/(1 + ω)``), else 1."""
    if compressor.is_identity or not compressor.unbiased:
        return 1.0
    omega = compressor.omega_for(numel)
    return 1.0 if not omega else 1.0 / (1.0 + omega)


def copy_contraction(compressor: Any, numel: int) -> float | None:
    """δ of the copies' update ``x̂ += α C(x − x̂)`` on ``numel``-entry rows (module doc), or
    None when the compressor reports neither ω nor δ."""
    if compressor.is_identity:
        return 1.0
    if compressor.unbiased:
        omega = compressor.omega_for(numel)
        return None if omega is None else 1.0 / (1.0 + omega)
    delta = compressor.delta_for(numel)
    return None if delta is None or not delta > 0 else min(1.0, float(delta))


def feedback_gain(topology: Any) -> float:
    """``max_i (1 − w_ii)``: the largest weight a node gives its neighbors' copies (2/3 on a
    ring with Metropolis weights, (n − 1)/n on the complete graph)."""
    W = topology.W
    diag = W.diagonal()
    return float(max(1e-12, 1.0 - float(diag.min())))


def default_gamma(compressor: Any, numel: int, topology: Any, *, name: str = "choco",
                  warn: bool = True) -> float:
    """γ = min(1, SAFETY · δ / max_i (1 − w_ii)) (module doc); 1 for the identity. ``warn``:
    log the warning of an unknown δ (one process of a run says it, not every rank)."""
    if compressor.is_identity:
        return 1.0
    delta = copy_contraction(compressor, numel)
    if delta is None:
        delta = UNKNOWN_DELTA
        if warn:
            log.warning("%s: '%s' reports no contraction δ, so the default consensus step "
                        "assumes δ = %g (gamma = %.3g); tune it with --gamma auto or give --gamma",
                        name, getattr(compressor, "spec", type(compressor).__name__), delta,
                        min(1.0, SAFETY * delta / feedback_gain(topology)))
    return min(1.0, SAFETY * delta / feedback_gain(topology))


def theory_gamma(delta: float, topology: Any) -> float:
    """CHOCO-Gossip's step of Theorem 2 (Koloskova et al. 2019), for comparison:
    ``gap² δ / (16 gap + gap² + 4β² + 2 gap β² − 8 gap δ)``."""
    gap, beta = float(topology.gap), float(topology.beta)
    return gap * gap * delta / (16 * gap + gap * gap + 4 * beta * beta + 2 * gap * beta * beta
                                - 8 * gap * delta)
