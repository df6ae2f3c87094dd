"""C-ECL: compressed edge-consensus learning (Takezawa, Niwa, Yamada 2023).

A primal-dual method: every edge (i, j) carries dual variables, neighbors exchange compressed
*dual* updates every K rounds, and no model is ever sent.

Runs as a block (gossip/core/block.py): the duals and mirrors are per-arc state (``block.arc_state``,
a row per arc (i, j) the block sends; node i's ``state["z"]`` is the [deg_i, d] view of its
arcs, sorted by neighbor), and the dual updates go out in one per-arc phase. A randomized
compressor draws from the arc's stream (``block.arc_rng``, keyed by the arc).

Under message loss (``on_loss = "ack"``, docs/network.md): the mirror ``r_ij`` is i's copy of
``z_ji``, which only i's messages move, so both ends apply a delivered ``q_ij`` and neither a
lost one (the sender reads ``route.out_delivered``): the mirror stays equal to the dual. A lost
dual update is only late (the next one carries it: ``q = C(y − r)``), and at the fixed point
every message is zero, so the fixed point (the exact optimum) is the one without loss.
Under ``stale=`` too (:mod:`gossip.network.stale`): ``r_ij`` moves when ``q_ij`` is sent and
``z_ji`` when it is handed over, so ``r_ij`` is ``z_ji`` plus the updates in flight, and the next
message is computed against both; the code is the same (``decode_received`` decodes what is
handed over).
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.algorithms.arcs import OutArcs
from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.block import Block
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError


class CECL(Algorithm):
    r"""C-ECL on an undirected graph. Node i keeps its model ``w_i`` and, per neighbor j, its dual
    ``z_ij`` and a mirror ``r_ij`` of the neighbor's dual ``z_ji`` (which only i's messages
    change); ``A_ij = +1`` if ``i < j`` else ``−1``, ``|N_i|`` the degree. Every round::

        α_i = 1 / (η (K/ρ − 1) |N_i|)
        w_i ← (w_i/η − ∇f_i(w_i) − λ w_i + α_i Σ_j A_ij z_ij) / (1/η + α_i |N_i|)

    and every K-th round, on every edge, both ways::

        y_ij = z_ij − 2 A_ij w_i;   q_ij = C(y_ij − r_ij);   send q_ij to j;   r_ij += θ q_ij
        on receiving q_ji:   z_ij += θ q_ji

    With a random mask for C (``randk:ρ``) this is the authors' rule
    ``z_ij += θ mask ⊙ (y_ji − z_ij)``: the sender knows ``z_ij`` through its mirror, so only the
    masked values travel (rand-k sends its seed, not the indices). Any compressor works the same
    way; ρ enters the step α only. Per node: ``w`` plus three d-vectors per edge (dual,
    mirror, scratch for the message). One message per edge direction every K rounds; a
    randomized compressor draws from the arc's stream (``block.arc_rng``).

    Reaches the exact optimum on heterogeneous data (no gradient tracking needed); compression
    costs rounds, not accuracy.

    Args:
        eta: step size η (default 0.05; ``suggest_hparams``: 0.2/L, step rule "tracking").
        period: K, rounds between dual exchanges (default 5).
        rho: kept fraction ρ in α (default: k/d for the sparsifiers, e.g. ``randk:0.2`` → 0.2;
            1 otherwise). Needs ``K/ρ > 1``.
        theta: dual step θ ∈ (0, 1] (default 1).
        weight_decay: λ, an extra L2 term on the model (default 0; the authors use 0.001).
    """

    name = "c-ecl"
    on_loss = "ack"  # both ends apply a delivered q_ij (z_ji and its mirror r_ij), neither a lost one
    state_copies = 4
    neighbor_copies = 3
    trains = True
    overlaps = "next"  # the duals change after the send, x does not
    requires = Requirements(
        gradients=True, compressor="stateless",
        compressor_message="{name} sends one stream per edge; '{spec}' keeps state per stream: use a "
                           "stateless compressor (randk, topk, qsgd, lead)")
    tunable = ("theta",)

    def __init__(self, eta: float = 0.05, period: int = 5, rho: float | None = None,
                 theta: float = 1.0, weight_decay: float = 0.0):
        check_range("eta", eta, 0.0, float("inf"), "Try 0.1/L to 0.3/L.")
        if not isinstance(period, int) or period < 1:
            raise ConfigError(f"period = {period!r} must be an integer >= 1 (rounds between exchanges)")
        if rho is not None:
            check_range("rho", rho, 0.0, 1.0, "The fraction of a dual update a message keeps.")
        check_range("theta", theta, 0.0, 1.0, "The dual step; 1 in the authors' scripts.")
        if weight_decay < 0:
            raise ConfigError(f"weight_decay = {weight_decay} must be >= 0")
        self.eta = eta
        self.period = period
        self.rho = rho
        self.theta = theta
        self.weight_decay = weight_decay

    def validate(self, topology: Any, compressor: Any) -> None:
        if self.rho is not None:
            self._check_rho(self.rho)

    def _check_rho(self, rho: float) -> None:
        if self.period / rho <= 1.0:
            raise ConfigError(
                f"c-ecl needs period/rho > 1 (its step α = 1/(η (K/ρ − 1) |N_i|)), got K = "
                f"{self.period}, ρ = {rho:g}; use --period 2 or more, or a compressor that "
                "keeps a fraction (e.g. randk:0.2)"
            )

    def kept_fraction(self, block: Block) -> float:
        """ρ: given, else the fraction of entries a sparsifier keeps (k/d), else 1."""
        if self.rho is not None:
            return self.rho
        k_for = getattr(block.compressor, "k_for", None)
        d = block.x.shape[1]
        return min(1.0, k_for(d) / d) if k_for is not None else 1.0

    def validate_block(self, block: Block) -> None:
        for nd in block.nodes:
            if not nd.view.neighbors:
                raise ConfigError(f"node {nd.id} has no neighbors; c-ecl needs a connected graph")
        self._check_rho(self.kept_fraction(block))

    def setup(self, block: Block) -> None:
        work = block.workspace["arcs"] = _Arcs(block, self)
        x = block.x
        block.arc_state["z"] = x.new_zeros(len(work.arcs.route.arcs), x.shape[1])  # row per arc (i, j)
        block.arc_state["r"] = torch.zeros_like(block.arc_state["z"])
        block.workspace.update(grad=torch.empty_like(x), acc=torch.empty_like(x))

    def step(self, block: Block) -> Round:
        x, ws = block.x, block.workspace
        z, r = block.arc_state["z"], block.arc_state["r"]
        work = ws["arcs"]
        arcs = work.arcs
        mu = 1.0 / self.eta
        g = block.gradients(ws["grad"])
        acc = ws["acc"].copy_(x).mul_(mu - self.weight_decay).sub_(g)
        arcs.add_to_senders(acc, z, work.alpha)  # Σ_j A_ij α_i z_ij, in sorted neighbor order
        torch.div(acc, work.denominator, out=x)
        if block.round % self.period:
            return
        # y_ij − r_ij = z_ij − 2 A_ij w_i − r_ij, one row per arc (i, j)
        msg = torch.sub(z, r, out=work.msg).addcmul_(x.index_select(0, arcs.src), work.two)
        route = arcs.route
        q = block.encode(msg, rng=block.arc_rng(route), route=route)
        yield q
        block.decode_add(r, q, self.theta, only=q.route.out_delivered)  # None: every arc
        block.decode_received(z, q, self.theta)  # incoming arc (j, i) is own row (i, j)


class _Arcs:
    """A block's arcs and its per-arc coefficients and message scratch (outside the state)."""

    def __init__(self, block: Block, alg: CECL):
        self.arcs = arcs = OutArcs(block)
        arcs.require_symmetric(alg.name)
        x = block.x
        rho = alg.kept_fraction(block)
        alpha = [1.0 / (alg.eta * (alg.period / rho - 1.0) * deg) if deg else 0.0
                 for deg in arcs.degree]
        per_arc = torch.tensor(alpha, dtype=torch.float64)[arcs.src.cpu()].to(x.device)
        self.alpha = torch.where(arcs.lower, per_arc, -per_arc)  # A_ij α_i
        mu = 1.0 / alg.eta
        self.denominator = torch.tensor([mu + a * deg for a, deg in zip(alpha, arcs.degree)],
                                        dtype=torch.float64).to(x.device, x.dtype).view(-1, 1)
        self.two = torch.where(arcs.lower, -2.0, 2.0).to(x.dtype).view(-1, 1)  # −2 A_ij
        self.msg = x.new_empty(len(arcs.route.arcs), x.shape[1])
