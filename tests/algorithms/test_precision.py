"""Errors stay where they converged: the running sums of a method (CHOCO's mixed copies, LEAD's
and EXTRA's duals, trackers, DCD's replicas) never carry their roundings forward into an error
that creeps back up, and the average that consensus keeps does not wander off.

Each run is float32, converges within a few hundred rounds, then keeps running: its error at the
end may not exceed ten times its error just after converging (or a floor: the average of a
consensus may move by a few ulps of float32). Before the channels kept their gap in float64, each
of these failed: the errors grew as t² once converged.
"""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.problems import make_problem


def _engine(name: str, spec: str, hparams: dict, *, n: int = 8, d: int = 16,
            problem: bool = True, dtype: torch.dtype = torch.float32) -> Engine:
    topo = topologies.build("ring", n)
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    oracles = None
    if problem:
        prob = make_problem("least-squares", n_nodes=n, dim=d, samples_per_node=20, seed=3,
                            dtype=dtype)
        oracles = lambda i, gen: prob.oracle(i, gen, estimator="full")  # noqa: E731
        _engine.solution = prob.solution().to(torch.float64)
    return Engine(make_algorithm(name, **hparams), topo, lambda i: x0[i], compressor=spec,
                  seed=0, dtype=dtype, oracles=oracles)


def _errors(engine: Engine, solution: torch.Tensor | None) -> tuple[float, float]:
    """(relative consensus error, distance: to x* with a problem, else of the average to the
    initial average)."""
    X = engine.block.x.to(torch.float64)
    mean = X.mean(0)
    consensus = float(((X - mean) ** 2).sum())
    if solution is not None:
        dist = float(((X - solution) ** 2).sum(1).max() / (solution**2).sum())
    else:
        dist = float(((mean - engine.initial_mean) ** 2).sum() / (engine.initial_mean**2).sum())
    return consensus, dist


def _run(name: str, spec: str, hparams: dict, converged: int, rounds: int,
         problem: bool = True, **kw) -> list[tuple[float, float]]:
    engine = _engine(name, spec, hparams, problem=problem, **kw)
    solution = _engine.solution if problem else None
    engine.initial_mean = engine.block.x.to(torch.float64).mean(0)
    scale = float(((engine.block.x.to(torch.float64) - engine.initial_mean) ** 2).sum())
    out = []
    for t in range(1, rounds + 1):
        engine.step()
        if t in (converged, rounds):
            c, dist = _errors(engine, solution)
            out.append((c / scale, dist))
    return out


ULPS = 1e-12
"""A relative squared distance of a few float32 ulps (1e-6 relative): what an average may move
by when its nodes' updates round."""


def _assert_flat(errors: list[tuple[float, float]], floor: float = 1e-30) -> None:
    (c0, d0), (c1, d1) = errors
    assert c1 <= 10 * max(c0, floor), f"consensus error {c0:.3g} -> {c1:.3g}"
    assert d1 <= 10 * max(d0, floor, ULPS), f"distance {d0:.3g} -> {d1:.3g}"


@pytest.mark.slow
def test_choco_consensus_keeps_its_error_and_its_average_for_1e5_rounds():
    # exact messages, γ = 1 on a 16-ring, d = 64: once at 6e-5 (consensus) and 6e-4 (average)
    # after 2·10⁴ rounds, growing as t²
    errors = _run("choco", "none", {"gamma": 1.0}, 1_000, 100_000, problem=False, n=16, d=64)
    _assert_flat(errors)
    assert errors[1][0] < 1e-12 and errors[1][1] < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("name, spec, hparams", [
    ("choco", "topk:0.25", {"gamma": 0.2}),
    ("choco", "qsgd:4bit", {"gamma": 0.05}),
    ("choco", "sign", {"gamma": 0.3}),
    ("dcd", "none", {}),
])
def test_consensus_methods_stay_converged_in_float32(name, spec, hparams):
    _assert_flat(_run(name, spec, hparams, 2_000, 8_000, problem=False))


@pytest.mark.slow
@pytest.mark.parametrize("name, spec, hparams", [
    ("lead", "lead:2", {}),
    ("extra", "none", {}),
    ("c-gt", "lead:2", {}),
    ("beer", "topk:0.5", {}),
    ("diging", "none", {}),
    ("exact-diffusion", "none", {}),
    ("led", "none", {"local_steps": 3}),
])
def test_exact_methods_stay_at_the_optimum_in_float32(name, spec, hparams):
    errors = _run(name, spec, hparams, 1_000, 6_000)
    _assert_flat(errors, floor=1e-16)
    assert errors[1][1] < 1e-10  # at x* to float32's precision


@pytest.mark.slow
def test_dcd_stays_where_its_constant_step_leads():
    # DCD-PSGD with a constant step converges near x*, not to it: where it settles, it stays
    _assert_flat(_run("dcd", "none", {"eta": 0.02}, 1_000, 6_000))


def test_the_gap_of_the_copies_sums_to_zero_over_the_nodes():
    """``Σ_i (hm_i − h_i) = 0`` in exact arithmetic (W is doubly stochastic); the channel sums
    it in float64 for a float32 model, so it stays at float64's rounding, where a float32
    mixed copy left it at float32's and the average moved by it every round."""
    engine = _engine("choco", "topk:0.25", {"gamma": 0.2}, problem=False)
    for _ in range(300):
        engine.step()
    gap = engine.block.state["gap"]
    assert gap.dtype == torch.float64
    x = engine.block.x.to(torch.float64)
    assert float(gap.sum(0).abs().max()) < 1e-14 * float(x.abs().max())


def test_float64_consensus_does_not_creep_back_up():
    # make run's setting (float64): the exact run climbed from 1e-28 to 1e-25 before. (Its
    # average still moves by about an ulp of x per round: float64 has no wider dtype to sum in.)
    (c0, _), (c1, _) = _run("choco", "none", {"gamma": 1.0}, 500, 4_000, problem=False,
                            dtype=torch.float64)
    assert c1 <= 10 * max(c0, 1e-32), f"consensus error {c0:.3g} -> {c1:.3g}"
