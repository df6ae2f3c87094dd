"""Variance-reduced gradient tracking: GT-SAGA and GT-SARAH (Xin, Khan, Kar).

Both are DIGing (:class:`gossip.algorithms.tracking.DIGing`: ``x ← W x − η y``,
``y ← W y + v_new − v``) whose tracker follows a local variance-reduced estimate ``v_i`` of
``∇f_i`` built from a few per-sample gradients of a finite-sum problem
(``f_i = (1/m_i) Σ_l f_{i,l}``), instead of the full local gradient: a round costs a node
``B`` (GT-SAGA) or ``2B`` (GT-SARAH) sample gradients instead of ``m_i``. The round, the
messages and the tracker are DIGing's; only :meth:`local_gradients` differs.

The sample indices come from the keyed stream ``gt-vr.samples`` (:mod:`gossip.rng`): a pure
function of (run seed, node, round), so a node draws the same samples alone in an MPI rank or
as a row of a block, and a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from gossip.algorithms.tracking import DIGing
from gossip.errors import ConfigError
from gossip.problems.oracles import SAGA
from gossip.rng import Stream

STREAM = "gt-vr.samples"
"""The keyed stream every sample index is drawn from (one call per round)."""


def draw_samples(rng: Stream, sizes: Sequence[int], batch: int) -> list[torch.Tensor]:
    """Each row's ``batch`` distinct sample indices, uniform over ``{0, …, sizes[r] − 1}``.

    One draw of ``batch`` float64 uniforms per row (one call of ``rng``), turned into a uniform
    subset by Floyd's algorithm (for ``j = m − B, …, m − 1``: ``t`` uniform on ``{0, …, j}``,
    take ``t`` unless taken already, else ``j``). With ``batch = 1`` it is one uniform index.
    Distinct indices keep a SAGA table's mean equal to the mean of its entries.
    """
    u = rng.uniform(batch, dtype=torch.float64)
    picks = []
    for r, m in enumerate(sizes):
        chosen: list[int] = []
        for k, j in enumerate(range(m - batch, m)):
            t = min(int(float(u[r, k]) * (j + 1)), j)
            chosen.append(j if t in chosen else t)
        picks.append(torch.tensor(chosen, dtype=torch.long))
    return picks


def finite_sums(name: str, block: Any) -> list[tuple[Any, int]]:
    """Each node's ``(problem, index)`` behind its oracle, refusing a node without a finite sum
    (a model's training oracle, a problem without per-sample losses)."""
    out = []
    for nd in block.nodes:
        problem = getattr(nd.oracle, "problem", None)
        if problem is None or not getattr(problem, "finite_sum", False):
            raise ConfigError(
                f"{name} samples per-sample gradients of a finite-sum problem, but node {nd.id}'s "
                f"oracle ({type(nd.oracle).__name__}) has none; run it on a problem "
                "(experiments/optimize.py --problem least-squares or logistic), or use diging "
                "to train a model", node=nd.id)
        out.append((problem, int(nd.oracle.node)))
    return out


def report(block: Any, r: int, samples: int) -> None:
    """One gradient estimate of row ``r``'s node that cost ``samples`` per-sample gradients,
    counted on the node's oracle (:meth:`gossip.problems.oracles.Oracle.count`): the methods
    evaluate the problem behind it themselves, and the log's oracle counters read it there."""
    count = getattr(block.nodes[r].oracle, "count", None)
    if count is not None:
        count(grads=1, sample_grads=samples)


def all_sizes(problem: Any) -> list[int]:
    """``m_i`` of every node of the problem (the same list on every process)."""
    return [int(problem.n_samples(i)) for i in range(problem.n_nodes)]


class VarianceReducedTracking(DIGing):
    """DIGing whose tracker follows a sampled variance-reduced estimate (the shared part of
    GT-SAGA and GT-SARAH): a finite-sum problem behind every node's oracle, the samples
    counted in ``gt-vr.sample_grads`` (the log's ``sample_grads``, summed over the nodes),
    and the edge dropped at both ends when a message is lost."""

    requires = replace(
        DIGing.requires,
        compressor_message="{name} sends uncompressed vectors but the compressor is '{spec}'; use "
                           "--compressor none")
    counts = ("gt-vr.sample_grads",)
    on_loss = "edge"  # W_t stays symmetric and doubly stochastic: Σ y = Σ v under loss

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta = 1/L_max`` (the largest per-sample smoothness), whatever ``estimator`` says:
        the method samples by itself. Measured on heterogeneous least squares on a 16-node
        ring: 0.5, 1 and 2 /L_max all converge linearly, 1/L_max fastest
        (docs/algorithms/gt-saga.md)."""
        return {"eta": 1.0 / problem.smoothness().L_max}

    def check_batch(self, block: Any, batch_size: int | None) -> None:
        """Refuse nodes without a finite sum, or with fewer samples than ``batch_size``."""
        for (problem, i), nd in zip(finite_sums(self.name, block), block.nodes, strict=True):
            if batch_size is not None and batch_size > problem.n_samples(i):
                raise ConfigError(f"{self.name}: batch_size = {batch_size} exceeds node "
                                  f"{nd.id}'s {problem.n_samples(i)} samples", node=nd.id)


class GTSAGA(VarianceReducedTracking):
    r"""GT-SAGA: gradient tracking with a local SAGA estimator (Xin, Khan, Kar 2020)::

        x_i ← Σ_j w_ij x_j − η y_i
        pick s uniformly in {1..m_i};  v_new = ∇f_{i,s}(x_i) − ∇f_{i,s}(z_{i,s}) + (1/m_i) Σ_l ∇f_{i,l}(z_{i,l})
        z_{i,s} ← x_i;   y_i ← Σ_j w_ij y_j + v_new − v_i;   v_i ← v_new

    Start: ``z_{i,l} = x_i⁰`` for every sample, ``y_i = v_i = ∇f_i(x_i⁰)``. The table of the
    last gradient of every sample is :class:`gossip.problems.oracles.SAGA`'s (``m_i`` scalars
    for a GLM, ``m_i × d`` otherwise), kept in ``block.state`` so checkpoints resume it. As the
    iterates converge every table entry converges to the sample's gradient at ``x*``, the
    estimate's variance vanishes, and the method converges linearly to the exact optimum with
    a constant step on a smooth strongly convex sum.

    A lost message (``on_loss = "edge"``, docs/network.md): the edge sits the round out at both
    ends, so each round's ``W_t`` stays symmetric and doubly stochastic and ``Σ_i y_i = Σ_i v_i``
    holds, as on a time-varying graph; the fixed point stays the exact optimum.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: ``1/L_max``).
        batch_size: distinct samples per estimate, ``B`` (default 1, the paper's).
    """

    name = "gt-saga"
    state_copies = 17

    def __init__(self, eta: float = 0.05, batch_size: int = 1):
        super().__init__(eta=eta)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size = {batch_size!r} must be an integer >= 1 (1 is the paper's)")
        self.batch_size = batch_size

    def hparams(self) -> dict[str, Any]:
        return {"eta": self.eta, "batch_size": self.batch_size}

    def validate_block(self, block: Any) -> None:
        self.check_batch(block, self.batch_size)

    def setup(self, block: Any) -> None:
        super().setup(block)
        st = block.state
        estimators = [SAGA(problem, i, None, self.batch_size)
                      for problem, i in finite_sums(self.name, block)]
        st["gt-vr.table"] = [torch.zeros(e.table_shape(), dtype=e.problem.dtype,
                                         device=e.problem.device) for e in estimators]
        st["gt-vr.mean"] = torch.zeros_like(block.x)
        st["gt-vr.sample_grads"] = torch.zeros(block.m, dtype=torch.float64)
        for r, e in enumerate(estimators):  # the estimators read and write the state's rows
            e.table, e.mean = st["gt-vr.table"][r], st["gt-vr.mean"][r]
        block.workspace["gt-vr.estimators"] = estimators

    def local_gradients(self, block: Any, out: torch.Tensor) -> torch.Tensor:
        x, estimators = block.x, block.workspace["gt-vr.estimators"]
        counts = block.state["gt-vr.sample_grads"]
        if block.round == 1:  # z_{i,l} = x⁰: the table and v = ∇f_i(x⁰), no draw
            for r, e in enumerate(estimators):
                block.oracle_call(e.start, x[r], out=out[r])
                counts[r] += e.m
                report(block, r, e.m)
            return out
        picks = draw_samples(block.stream_rng(STREAM), [e.m for e in estimators], self.batch_size)
        for r, e in enumerate(estimators):
            idx = picks[r].to(e.problem.device)
            block.oracle_call(lambda xr, o, e=e, idx=idx: e.grad_at(xr, idx, o), x[r], out=out[r])
            counts[r] += idx.numel()
            report(block, r, idx.numel())
        return out


class GTSARAH(VarianceReducedTracking):
    r"""GT-SARAH: gradient tracking with a local SARAH estimator (Xin, Khan, Kar 2022)::

        x_i ← Σ_j w_ij x_j − η y_i
        every q-th round (t = 0, q, 2q, …):  v_new = ∇f_i(x_i)                      (m_i samples)
        otherwise, B samples S:  v_new = (1/B) Σ_{l∈S} (∇f_{i,l}(x_i) − ∇f_{i,l}(x_i^prev)) + v_i
        y_i ← Σ_j w_ij y_j + v_new − v_i;   v_i ← v_new;   x_i^prev ← x_i

    Start ``y_i = v_i = ∇f_i(x_i⁰)``. The recursive estimate is biased but its error is reset
    to zero by the full local gradient every ``q`` rounds and shrinks with the steps in
    between, so (written for smooth non-convex sums) the gradient norm at the average goes to
    zero; on a strongly convex sum it converges linearly to the exact optimum with a constant
    step. A round costs ``2B`` sample gradients, the reset round ``m_i``.

    A lost message: the edge sits the round out at both ends (``on_loss = "edge"``), as in
    :class:`GTSAGA`.

    Args:
        eta: step size (default 0.05; ``suggest_hparams``: ``1/L_max``).
        batch_size: distinct samples per estimate, ``B`` (default ``⌈√m⌉``, ``m`` the largest
            ``m_i``, capped at the smallest ``m_i``).
        period: rounds per outer loop, ``q``: one full local gradient, then ``q − 1`` recursive
            estimates (default ``⌈√m⌉``, the paper's choice ``q = B = √m`` in order).
    """

    name = "gt-sarah"
    state_copies = 18

    def __init__(self, eta: float = 0.05, batch_size: int | None = None, period: int | None = None):
        super().__init__(eta=eta)
        for key, value in (("batch_size", batch_size), ("period", period)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"{key} = {value!r} must be an integer >= 1 (default ⌈√m⌉)")
        self.batch_size = batch_size
        self.period = period

    def hparams(self) -> dict[str, Any]:
        return {"eta": self.eta, "batch_size": self.batch_size, "period": self.period}

    def validate_block(self, block: Any) -> None:
        self.check_batch(block, self.batch_size)

    def setup(self, block: Any) -> None:
        super().setup(block)
        sums = finite_sums(self.name, block)
        sizes = all_sizes(sums[0][0])
        root = math.ceil(math.sqrt(max(sizes)))
        hp = block.hparams
        hp["batch_size"] = min(root, min(sizes)) if self.batch_size is None else self.batch_size
        hp["period"] = root if self.period is None else self.period
        st = block.state
        st["gt-vr.x_prev"] = torch.zeros_like(block.x)
        st["gt-vr.sample_grads"] = torch.zeros(block.m, dtype=torch.float64)
        block.workspace["gt-vr.sums"] = sums
        block.workspace["gt-vr.tmp"] = torch.empty_like(block.x[0])

    def local_gradients(self, block: Any, out: torch.Tensor) -> torch.Tensor:
        x, st, ws = block.x, block.state, block.workspace
        x_prev, counts, v = st["gt-vr.x_prev"], st["gt-vr.sample_grads"], st["g"]
        batch, period = block.hparams["batch_size"], block.hparams["period"]
        sums = ws["gt-vr.sums"]
        if (block.round - 1) % period == 0:  # the outer loop's full local gradient
            for r, (problem, i) in enumerate(sums):
                block.oracle_call(lambda xr, o, p=problem, i=i: p.grad_full(i, xr, o), x[r],
                                  out=out[r])
                counts[r] += problem.n_samples(i)
                report(block, r, problem.n_samples(i))
        else:
            picks = draw_samples(block.stream_rng(STREAM), [p.n_samples(i) for p, i in sums],
                                 batch)
            tmp = ws["gt-vr.tmp"]
            for r, (problem, i) in enumerate(sums):
                idx = picks[r].to(problem.device)

                def sarah(xr: torch.Tensor, xp: torch.Tensor, o: torch.Tensor, p: Any = problem,
                          i: int = i, idx: torch.Tensor = idx, vr: torch.Tensor = v[r]) -> torch.Tensor:
                    p.batch_grad(i, idx, xr, o)
                    return o.sub_(p.batch_grad(i, idx, xp, tmp)).add_(vr)

                block.oracle_call(sarah, x[r], x_prev[r], out=out[r])
                counts[r] += 2 * idx.numel()
                report(block, r, 2 * idx.numel())
        x_prev.copy_(x)  # x moves next: the point the next recursive estimate differences
        return out
