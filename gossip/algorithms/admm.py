"""Decentralized ADMM (Shi, Ling, Yuan, Wu, Yin 2014) and its linearized form DLM (Ling, Shi,
Wu, Ribeiro 2015); docs/algorithms/admm.md, docs/algorithms/dlm.md.

The edge-based consensus ADMM: every edge (i, j) carries the constraint ``x_i = x_j`` with
penalty ``c``; eliminating the edge variables leaves, per node with ``d_i = |N_i|`` neighbors
and dual ``α_i`` (``α⁰ = 0``)::

    ∇f_i(x_i^{k+1}) + α_i^k + 2c d_i x_i^{k+1} = c d_i x_i^k + c Σ_{j∈N_i} x_j^k
    α_i^{k+1} = α_i^k + c Σ_{j∈N_i} (x_i^{k+1} − x_j^{k+1})

The first line is the exact proximal step ``x_i^{k+1} = prox_{f_i/(2c d_i)}(v_i)`` with
``v_i = x_i^k + (Σ_j (x_j^k − x_i^k))/(2 d_i) − α_i^k/(2c d_i)`` (a problem that solves it:
:meth:`gossip.problems.base.Problem.local_prox`, quadratic ``f_i``). DLM replaces it by one
linearized step with proximal weight ρ::

    x_i^{k+1} = x_i^k − (∇f_i(x_i^k) + α_i^k + c Σ_j (x_i^k − x_j^k)) / (2c d_i + ρ)

One message per round, ``x`` to every neighbor; ``Σ_j (x_j − x_i)`` is the gap of a channel
with the graph's unit weights (``m_ij = 1``, ``m_ii = 1 − (neighbors heard)``). A round sends
``x^k``, first ends the last round's dual step with it (``α^k``; round 1 keeps ``α⁰ = 0``),
then takes the primal step: the iterates above, one exchange each.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.block import Block
from gossip.core.cache import IdentityCache
from gossip.core.channel import Channel, Weights
from gossip.core.compensated import CompensatedSum
from gossip.core.nodes import Node
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError


def heard(plan: Any) -> list[int]:
    """How many neighbors' messages each row of a round plan mixes (the delivered ones under
    loss: the plan's slots are the arcs that arrived)."""
    count = [0] * plan.m
    for _, dst, _ in plan.slots:
        for r in range(plan.m) if dst is None else dst.tolist():
            count[r] += 1
    return count


def suggested_penalty(problem: Any) -> float:
    """The penalty ``c`` we start from: ``√(μ L)`` of the problem's constants (``L/20`` when
    ``μ = 0``). Our choice, measured on least squares (docs/algorithms/admm.md: the fastest of
    a grid on a ring); the paper's best ``c`` needs graph eigenvalues a node does not know."""
    s = problem.smoothness()
    return math.sqrt(s.mu * s.L) if s.mu > 0 else s.L / 20.0


class ADMM(Algorithm):
    """Decentralized (edge-based consensus) ADMM: an exact local solve per round, a dual step
    by ``c Σ_j (x_i − x_j)`` (module docstring; docs/algorithms/admm.md).

    Needs a problem whose nodes solve their proximal subproblem exactly (quadratic ``f_i``:
    least squares, consensus); use :class:`DLM` for any smooth problem. ``Σ_i α_i = 0`` at
    every round (each edge adds opposite terms at its two ends), so a consensual fixed point
    has ``Σ_i ∇f_i = 0``: the exact optimum, linear for strongly convex ``f_i``.

    Under message loss (``on_loss = "edge"``) an edge either of whose messages is lost sits
    the round out at both ends: the gap and the dual step skip it at both ends, so ``Σ_i α_i =
    0`` still holds and the fixed point stays the optimum (the proximal weight keeps the static
    ``d_i``: our choice).

    Args:
        c: the penalty of the edge constraints, ``c > 0`` (default 1; ``suggest_hparams``:
            ``√(μ L)``).
    """

    name = "admm"
    trains = True
    state_copies = 12
    on_loss = "edge"  # an edge sits a lost round out at both ends: Σ α = 0 is kept
    requires = Requirements(
        gradients=True, compressor="identity",
        compressor_message="{name} sends exact models but the compressor is '{spec}'; use "
                           "--compressor none, or lead / c-gt for compressed exact methods")

    def __init__(self, c: float = 1.0):
        check_range("c", c, 0.0, float("inf"), "The penalty of the edge constraints; try "
                    "sqrt(mu L) (suggest_hparams).")
        self.c = c

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        return {"c": suggested_penalty(problem)}

    def validate(self, topology: Any, compressor: Any) -> None:
        lonely = [i for i in range(topology.n) if not topology.view(i).in_neighbors]
        if lonely:
            raise ConfigError(f"{self.name} needs every node to have a neighbor, but node "
                              f"{lonely[0]} of '{topology.name}' has none; use a connected graph")

    def validate_block(self, block: Block) -> None:
        for nd in block.nodes:
            oracle = nd.oracle
            if getattr(oracle, "has_prox", False):
                raise ConfigError(f"{self.name} minimizes Σ f_i and has no step for the "
                                  "problem's regularizer r; use prox-lead for f + r")
            if not getattr(oracle, "has_local_prox", False):
                problem = type(getattr(oracle, "problem", oracle)).__name__
                raise ConfigError(
                    f"{self.name} solves every node's subproblem exactly, which needs quadratic "
                    f"f_i (least-squares, consensus); {problem} has no such solve: use dlm, its "
                    "linearized form, which takes gradients only", node=nd.id)
            if getattr(oracle, "estimator", "full") != "full":
                raise ConfigError(f"{self.name} solves its subproblems exactly and samples "
                                  f"nothing; --estimator {oracle.estimator} has no meaning for "
                                  "it: use the full estimator, or dlm", node=nd.id)

    def setup(self, block: Block) -> None:
        x = block.x
        degree = [len(nd.view.in_neighbors) for nd in block.nodes]
        block.workspace["degree"] = torch.tensor(degree, dtype=x.dtype, device=x.device)[:, None]
        counts = IdentityCache(limit=4)

        def unit(node: Node) -> Weights:  # m_ij = 1, m_ii = 1 − (neighbors heard this round)
            row = block.ids.index(node.id)
            n_heard = counts.get(block.plan, lambda: heard(block.plan))[row]
            return lambda j: 1.0 - n_heard if j == node.id else 1.0

        # neighbors' sum minus d x_i: the graph Laplacian's −L x, over the edges heard
        block.workspace["channel"] = Channel(block, "x", weights=unit)
        block.state["alpha"] = torch.zeros_like(x)
        block.workspace.update(dual=CompensatedSum(block, "alpha"), v=torch.empty_like(x))

    def step(self, block: Block) -> Round:
        ws = block.workspace
        ch = ws["channel"]
        q = yield ch.send(block.x)  # one message, x^k to every neighbor
        gap = ch.gap(q)  # Σ_j (x_j − x_i) over the edges heard
        if block.round > 1:  # α^k = α^{k−1} + c Σ_j (x_i^k − x_j^k); α⁰ = 0
            ws["dual"].add_(gap, alpha=-self.c)
        self.primal(block, gap)

    def primal(self, block: Block, gap: torch.Tensor) -> None:
        """``x_i ← prox_{f_i/(2c d_i)}(x_i + gap_i/(2 d_i) − α_i/(2c d_i))``: the exact solve."""
        x, ws, c = block.x, block.workspace, self.c
        deg, v, alpha = ws["degree"], ws["v"], block.state["alpha"]
        torch.div(gap, deg, out=v).mul_(0.5).add_(x)
        v.sub_(alpha.div(deg).mul_(0.5 / c))
        for r in block.computing_rows():  # not a node inactive this round (--network active=)
            nd = block.nodes[r]
            block.oracle_call(lambda vr, out, nd=nd, r=r: nd.oracle.local_prox(
                vr, 0.5 / (c * float(deg[r])), out), v[r], out=x[r])


class DLM(ADMM):
    """DLM: decentralized linearized ADMM. The local solve becomes one gradient step with
    proximal weight ρ, ``x_i ← x_i − (∇f_i(x_i) + α_i − c Σ_j (x_j − x_i))/(2c d_i + ρ)``; the
    dual step is ADMM's (docs/algorithms/dlm.md). Gradients only: any smooth problem.

    Args:
        c: the penalty of the edge constraints (default 1; ``suggest_hparams``: ``√(μ L)``).
        rho: the proximal weight ρ > 0 of the linearized step (default 1; ``suggest_hparams``:
            ``L``, so that the step ``1/(2c d_i + ρ)`` is below ``1/L``).
    """

    name = "dlm"
    state_copies = 13

    def __init__(self, c: float = 1.0, rho: float = 1.0):
        super().__init__(c=c)
        check_range("rho", rho, 0.0, float("inf"), "The proximal weight; try L (suggest_hparams).")
        self.rho = rho

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        s = problem.smoothness()
        return {"c": suggested_penalty(problem),
                "rho": s.L if estimator == "full" else 6.0 * s.L_max}

    def validate_block(self, block: Block) -> None:
        for nd in block.nodes:
            if getattr(nd.oracle, "has_prox", False):
                raise ConfigError(f"{self.name} minimizes Σ f_i and has no step for the "
                                  "problem's regularizer r; use prox-lead for f + r")

    def setup(self, block: Block) -> None:
        super().setup(block)
        block.workspace["g"] = torch.empty_like(block.x)

    def primal(self, block: Block, gap: torch.Tensor) -> None:
        """``x ← x − (∇f(x) + α − c·gap)/(2c d + ρ)``."""
        x, ws, c = block.x, block.workspace, self.c
        g = block.gradients(ws["g"])
        g.add_(block.state["alpha"]).sub_(gap, alpha=c)
        x.sub_(g.div_(ws["degree"].mul(2.0 * c).add_(self.rho)))
