"""CADA and G-CADA: lazily aggregated Adam on the star (docs/algorithms/cada.md).

Chen, Guo, Sun, Yin, "CADA: Communication-Adaptive Distributed Adam", AISTATS 2021. Node 0
is the server, holding θ and Adam's moments; nodes 1..M are the workers. Round k::

    server → every worker:  θ^k
    worker m:               g_m = ∇ℓ(θ^k; ξ_m^k) and its rule's left side L_m
                            upload  iff  L_m > (c/d_max) Σ_{d=1}^{d_max} ‖θ^{k+1−d} − θ^{k−d}‖²
                                    or   it skipped the last D − 1 rounds (D: max_delay)
    worker m → server:      one flag (upload or not), then, if it uploads, g_m
    server:                 ∇^k = (1/M) Σ_m ĝ_m   (ĝ_m: m's last upload; the stale one if it skipped)
                            θ^{k+1} = Adam(θ^k, ∇^k)

The rules' left sides (ξ_m^k one sample drawn in round k, used at both points)::

    cada1:   ‖δ_m^k − δ_m^{last}‖²,  δ_m^k = ∇ℓ(θ^k; ξ_m^k) − ∇ℓ(θ̃; ξ_m^k)
             (θ̃ a snapshot of θ every D rounds, when everyone uploads; δ_m^{last} the δ of
             m's last upload: the paper's variance-reduced rule (7a))
    cada2:   ‖∇ℓ(θ^k; ξ_m^k) − ∇ℓ(θ^{k−τ_m}; ξ_m^k)‖²   (θ^{k−τ_m}: θ at m's last upload; (7b))
    g-cada:  ‖∇ℓ(θ^k; ξ_m^k) − ĝ_m‖²   (against what the server holds: one gradient a round)

The flags and the uploads are :class:`~gossip.core.star.StarLink` phases, so only uploading
workers' arcs carry a gradient and the bits count what was sent; the server's copy ĝ_m of each
worker's gradient is the link's EF21 memory (exact with the ``none`` compressor, EF21-compressed
otherwise), and Adam is FedAdam's :class:`~gossip.algorithms.federated.ServerOptimizer`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from gossip.algorithms.federated import ServerOptimizer
from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements
from gossip.core.star import ClientSampler, StarLink
from gossip.errors import ConfigError

RULES = ("cada1", "cada2")
"""CADA's two communication rules (the paper's (7a) and (7b)); G-CADA has its own."""


class CADA(Algorithm):
    """CADA (Chen et al. AISTATS'21): Adam at the server on the workers' lazily uploaded
    stochastic gradients (module docstring, docs/algorithms/cada.md).

    Args:
        rule: ``"cada1"`` (snapshot, variance-reduced) or ``"cada2"`` (the same sample at the
            model of the last upload); both evaluate one mini-batch at two points.
        c: the threshold's weight c >= 0 (0: upload whenever the gradient moved at all).
        d_max: how many past model moves the threshold averages (>= 1).
        max_delay: D >= 1: a worker uploads at least once every D rounds (1: every round,
            Adam at the server on fresh gradients); cada1 also refreshes its snapshot then.
        server_lr: the server's Adam step α.
        beta1, beta2, tau: Adam's decay rates and adaptivity τ (FedAdam's form: ``v`` starts at
            τ², the step is ``α m / (√v + τ)``).
    """

    name = "cada"
    trains = True
    federated = True
    requires = Requirements(
        graph=Graph(star=True), gradients=True, compressor="stateless",
        compressor_message="{name} compresses each worker's upload on its own arc, which a "
                           "compressor that keeps state per node ('{spec}') cannot do: use a "
                           "stateless one (topk, randk, qsgd, sign, lead:BITS, none)")
    state_copies = 16  # x, gradients (two), snapshot/old model, δ's, m, v, h, h_server, buffers
    counts = ("cada.uploads", "cada.uploads_skipped")
    rules: ClassVar[tuple[str, ...]] = RULES

    def __init__(self, rule: str = "cada2", c: float = 0.1, d_max: int = 10,
                 max_delay: int = 50, server_lr: float = 0.01, beta1: float = 0.9,
                 beta2: float = 0.99, tau: float = 1e-3):
        if rule not in self.rules:
            raise ConfigError(f"rule {rule!r} is not one of {', '.join(self.rules)} "
                              f"({self.name}'s communication rules)")
        for key, value, what in (("d_max", d_max, "past model moves the threshold averages"),
                                 ("max_delay", max_delay, "rounds a worker may go without "
                                                          "uploading, at most")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key} = {value!r}: a whole number >= 1 ({what})")
        check_range("c", c, 0.0, math.inf, "the threshold's weight", include_low=True)
        check_range("server_lr", server_lr, 0.0, math.inf, "the server's Adam step α")
        check_range("beta1", beta1, 0.0, 1.0, include_low=True, include_high=False)
        check_range("beta2", beta2, 0.0, 1.0, include_low=True, include_high=False)
        check_range("tau", tau, 0.0, math.inf, "Adam's adaptivity τ (e.g. 1e-3)")
        self.rule, self.c, self.d_max, self.max_delay = rule, c, d_max, max_delay
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``server_lr = RMS(∇f(x0))/L``, one gradient step's per-coordinate size (Adam moves
        each coordinate by about ``server_lr``), as for FedAdam."""
        x0 = problem.initial_point()
        grad = sum(problem.grad_full(i, x0) for i in range(problem.n_nodes)) / problem.n_nodes
        rms = float(grad.square().mean().sqrt())
        return {"server_lr": rms / problem.smoothness().L} if 0.0 < rms < math.inf else {}

    def log_fields(self, totals: dict[str, float]) -> dict[str, Any]:
        """The uploads and skips so far, summed over the workers, and ``skip_rate``: the share
        of the workers' rounds without an upload."""
        rounds = totals["uploads"] + totals["uploads_skipped"]
        return {**totals, "skip_rate": totals["uploads_skipped"] / rounds if rounds else 0.0}

    # -- setup ----------------------------------------------------------------------------------
    def setup(self, block: Block) -> None:
        """Every worker each round (a sampler of all of them), the link with EF21 memories
        (the server's copies of the gradients), the rule's state, Adam's moments."""
        n, d = block.topology.n, block.x.shape[1]
        for nd in block.nodes:
            if nd.oracle is not None:
                self._two_point(nd.oracle)  # refuse an oracle the rule cannot use, before round 1
        ws, st, x = block.workspace, block.state, block.x
        ws["link"] = StarLink(block, "cada", ClientSampler(block.seed, n - 1, n - 1), d, d, "ef21")
        ws["down"], ws["grad"], ws["other"] = (torch.zeros_like(x) for _ in range(3))
        counter = dict(dtype=torch.float64, device=x.device)
        st["cada.moves"] = torch.zeros((block.m, self.d_max), **counter)  # ‖θ^{k+1−d} − θ^{k−d}‖²
        st["cada.run"] = torch.full((block.m,), float(self.max_delay - 1), **counter)  # skips in a row
        st["cada.uploads"] = torch.zeros(block.m, **counter)
        st["cada.uploads_skipped"] = torch.zeros(block.m, **counter)
        if self.rule in ("cada1", "cada2"):
            st["cada.anchor"] = x.clone()  # cada1: the snapshot θ̃; cada2: θ at the last upload
        if self.rule == "cada1":
            st["cada.delta"] = torch.zeros_like(x)  # δ of the last upload
        opt = ServerOptimizer("adam", self.server_lr, self.beta1, self.beta2, self.tau, 0.0)
        opt.setup(block)
        ws["server_opt"] = opt

    def _two_point(self, oracle: Any) -> str:
        """How the rule evaluates one sample at two points: ``"batch"`` (an ``sgd`` oracle:
        one drawn mini-batch), ``"full"`` (deterministic), ``"one"`` (g-cada needs one point)."""
        from gossip.problems.oracles import SGD, FullGradient

        if isinstance(oracle, SGD):
            return "batch"
        if isinstance(oracle, FullGradient):
            return "full"
        raise ConfigError(
            f"{self.name} rule {self.rule} evaluates one mini-batch at two points, which the "
            f"'{getattr(oracle, 'estimator', type(oracle).__name__)}' oracle cannot do: use "
            "an sgd or full estimator (optimize.py --estimator), or g-cada (one gradient a "
            "round; it trains models)")

    # -- the round ------------------------------------------------------------------------------
    def step(self, block: Block) -> Round:
        """θ^k down, each worker's gradient and rule, the flags, the uploads, Adam."""
        ws, st, x = block.workspace, block.state, block.x
        link: StarLink = ws["link"]
        link.begin()
        server = link.server_row
        inbox = yield link.broadcast(x[server] if server is not None else None)
        link.receive(inbox, ws["down"])
        rows, moves = link.rows, st["cada.moves"]
        for r in rows:  # the model's last move, then x_m ← θ^k
            if block.round > 1:
                moves[r] = moves[r].roll(1)
                moves[r, 0] = float(torch.sum((ws["down"][r] - x[r]) ** 2))
            x[r].copy_(ws["down"][r])
        send = {block.ids[r]: self._decide(block, r) for r in rows}
        flags = block.arc_plan([(i, 0) for i in link.distinct])
        out = block.message_rows(1, flags)
        for a, (i, _) in enumerate(flags.arcs):
            out.mine()[a, 0] = int(send[i])
        inbox = yield out
        if server is not None:  # the server learns who uploads from the flags
            got = block.received_arcs(inbox)[:, 0].tolist()
            send.update({i: bool(f) for (i, _), f in zip(flags.incoming, got, strict=True)})
        for r in rows:
            key = "cada.uploads" if send[block.ids[r]] else "cada.uploads_skipped"
            st[key][r] += 1.0
            st["cada.run"][r] = 0.0 if send[block.ids[r]] else st["cada.run"][r] + 1.0
        sent = link.upload(ws["grad"], sorted(i for i, s in send.items() if s))
        inbox = yield sent
        if server is not None:
            link.average(inbox)  # the senders' copies ĝ_m ← ĝ_m + C(g_m − ĝ_m)
            held = link.server_memories()
            grad = held.sum(0).div_(held.shape[0])  # ∇^k = (1/M) Σ_m ĝ_m
            ws["server_opt"].step(block, server, grad.neg_())  # Adam on −Δ = ∇^k

    def _decide(self, block: Block, r: int) -> bool:
        """Worker r's gradient ∇ℓ(θ^k; ξ) into ``grad[r]``, and whether it uploads it."""
        ws, st, x = block.workspace, block.state, block.x
        g, other = ws["grad"][r], ws["other"][r]
        if self.rule == "cada1":  # every D rounds a new snapshot, and everyone uploads
            forced = (block.round - 1) % self.max_delay == 0
            if forced:
                st["cada.anchor"][r].copy_(x[r])  # θ̃ ← θ^k
        else:  # the D-th round after an upload
            forced = bool(st["cada.run"][r] >= self.max_delay - 1)
        if self.rule not in RULES or forced:  # g-cada, or an upload the rule cannot stop
            block.gradients(ws["grad"], [r])
        else:
            self._gradients_at_two_points(block, r, st["cada.anchor"][r], g, other)
        if self.rule == "cada1":
            if forced:
                st["cada.delta"][r].zero_()  # δ at the new snapshot: exactly 0
                return True
            other.neg_().add_(g)  # δ_m^k = ∇ℓ(θ^k; ξ) − ∇ℓ(θ̃; ξ)
            lhs = float(torch.sum((other - st["cada.delta"][r]) ** 2))
        elif forced:
            lhs = math.inf
        elif self.rule == "cada2":
            lhs = float(torch.sum((g - other) ** 2))
        else:
            lhs = float(torch.sum((g - ws["link"].client_memory(block.ids[r])) ** 2))
        upload = forced or lhs > self.c / self.d_max * float(st["cada.moves"][r].sum())
        if upload and self.rule == "cada1":
            st["cada.delta"][r].copy_(other)
        if upload and self.rule == "cada2":
            st["cada.anchor"][r].copy_(x[r])  # θ^{k−τ_m} ← θ^k
        return upload

    def _gradients_at_two_points(self, block: Block, r: int, anchor: torch.Tensor,
                                 g: torch.Tensor, other: torch.Tensor) -> None:
        """``g = ∇ℓ(x_r; ξ)`` and ``other = ∇ℓ(anchor; ξ)`` with one sample ξ."""
        oracle = block.nodes[r].oracle
        if self._two_point(oracle) == "batch":
            idx = oracle.sample()
            block.oracle_call(oracle.grad_at, block.x[r], idx, out=g)
            block.oracle_call(oracle.grad_at, anchor, idx, out=other)
        else:
            block.oracle_call(oracle.grad, block.x[r], out=g)
            block.oracle_call(oracle.grad, anchor, out=other)


class GCADA(CADA):
    """G-CADA: CADA whose worker compares its fresh gradient with the one the server holds,
    ``‖∇ℓ(θ^k; ξ_m^k) − ĝ_m‖²``: one gradient a round (CADA's rules take two), so a round
    costs the wall-clock of Adam's, and any gradient oracle serves (docs/algorithms/cada.md).

    Args:
        c, d_max, max_delay, server_lr, beta1, beta2, tau: as :class:`CADA`.
    """

    name = "g-cada"
    state_copies = 14
    rules = ("g-cada",)

    def __init__(self, c: float = 0.1, d_max: int = 10, max_delay: int = 50,
                 server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3):
        super().__init__("g-cada", c, d_max, max_delay, server_lr, beta1, beta2, tau)

    def hparams(self) -> dict[str, Any]:
        """The constructor's (``rule`` is fixed)."""
        return {k: v for k, v in super().hparams().items() if k != "rule"}

    def _two_point(self, oracle: Any) -> str:
        return "one"
