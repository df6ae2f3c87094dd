"""Federated learning on the star: FedAvg, FedProx, FedAdam / FedYogi / FedAdagrad, SCAFFOLD.

Node 0 is the server, holding the global model ``x`` (its row of ``block.x``) and the server
optimizer's state; nodes 1..n−1 are the clients, holding the data (docs/algorithms/fedavg.md).
One round, for the clients S drawn this round (:class:`~gossip.core.star.ClientSampler`)::

    server → i ∈ S:   x, exact or C(x − x̂_i)              (SCAFFOLD: x and c)
    client i ∈ S:     y_i ← x;  K times  y_i ← y_i − η g_i(y_i)
                      g_i = ∇f_i(y_i)                           FedAvg, FedAdam, ...
                          = ∇f_i(y_i) + μ (y_i − x)             FedProx
                          = ∇f_i(y_i) − c_i + c                 SCAFFOLD
    i ∈ S → server:   Δ_i = y_i − x  (compressed, EF21 memory when lossy)
    server:           Δ = (1/|S|) Σ_{i∈S} Δ_i;  x ← ServerOpt(x, Δ)

(with a compressed downlink the client starts from its copy ``x̂_i`` and ``x`` above is it).
The phases and their memories are :class:`~gossip.core.star.StarLink`'s; what is left here is
each paper's update. A client's ``x`` row holds its last local model ``y_i``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from gossip.compress import make as make_compressor
from gossip.core.algorithm import Algorithm, Round, check_range
from gossip.core.block import Block
from gossip.core.requirements import Graph, Requirements
from gossip.core.star import SAMPLINGS, ClientSampler, StarLink
from gossip.errors import ConfigError, GossipError

SELECTIONS = ("sampled", "power")
"""How a round's training clients are chosen: the sampler's draw (``sampling``: uniform, with
replacement, by data size, fair) or power-of-choice among the sampler's draw of candidates."""

SERVER_OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad", "adamw")
"""Server updates of Reddi et al. (ICLR'21, Algorithm 2), and Adam with decoupled weight decay."""


_ARGS = """
    Args:
        clients_per_round: clients drawn per round k (None: all clients).
        local_steps: local steps K per round (>= 1), or one K per client (client i's at
            index i − 1: E local epochs are ``⌈E·n_i/B⌉`` steps, as McMahan et al.'s u_i).
        eta: the clients' step size η.
        sampling: ``"uniform"`` (k distinct clients), ``"replacement"`` (k uniform draws) or
            ``"weighted"`` (k draws with probability ∝ ``client_weights``).
        client_weights: the clients' weights for ``"weighted"`` (their data sizes; the
            scripts fill them in).
        downlink_compressor: a compressor spec for the downlink (None or ``"none"``: exact),
            sent against an EF21 copy per client of what it knows.
        aggregation: ``"mean"`` (the plain average of the sampled deltas) or ``"data"``
            (weighted by ``client_weights``, the data sizes: McMahan et al.'s
            ``Σ n_i Δ_i / Σ n_i``; with ``sampling="uniform"`` only).
        availability: probability a client is online in a round (1: always).
        server_optimizer: ``"sgd"``, ``"adam"``, ``"yogi"``, ``"adagrad"`` or ``"adamw"``.
        server_lr: the server step η_s (default 1 for sgd, 0.01 for the adaptive ones).
        beta1, beta2: the server moments' decay rates.
        tau: the server's adaptivity τ (added to √v; v starts at τ²).
        weight_decay: decoupled weight decay λ of ``adamw``.
        uplink_memory: ``"ef21"``, ``None`` (no memory; ``"none"`` too) or ``"auto"`` (EF21
            for a lossy compressor, none for ``none``).
        selection: ``"sampled"`` (the sampler's draw trains) or ``"power"`` (Cho et al.'s
            power-of-choice: the sampler draws ``candidates`` clients, they receive the model
            and report their local loss at it, and the ``clients_per_round`` with the highest
            loss train; two more one-entry phases a round).
        candidates: the candidates d of ``"power"`` (clients_per_round <= d <= N).
"""


class ServerOptimizer:
    """``x ← x + η_s Δ`` (sgd) or the adaptive updates of Reddi et al. on the pseudo-gradient
    ``−Δ`` (docs/algorithms/fedadam.md)::

        m ← β1 m + (1 − β1) Δ
        v ← v + Δ²                                   adagrad
        v ← v − (1 − β2) Δ² sign(v − Δ²)             yogi
        v ← β2 v + (1 − β2) Δ²                       adam, adamw
        x ← x + η_s m / (√v + τ)                     (adamw: x ← x + η_s (m / (√v + τ) − λ x))

    with ``v`` starting at τ² and ``m`` at 0 (no bias correction, as in the paper).
    """

    def __init__(self, kind: str, lr: float, beta1: float, beta2: float, tau: float,
                 weight_decay: float):
        self.kind, self.lr, self.beta1, self.beta2 = kind, lr, beta1, beta2
        self.tau, self.weight_decay = tau, weight_decay

    def setup(self, block: Block) -> None:
        """The moments in ``block.state`` (a row per node; only the server's moves)."""
        if self.kind != "sgd":
            block.state["server.m"] = torch.zeros_like(block.x)
            block.state["server.v"] = torch.full_like(block.x, self.tau**2)

    def step(self, block: Block, r: int, delta: torch.Tensor) -> None:
        """The server's update of ``block.x[r]`` with the averaged client delta."""
        x = block.x[r]
        if self.kind == "sgd":
            x.add_(delta, alpha=self.lr)
            return
        m, v = block.state["server.m"][r], block.state["server.v"][r]
        m.mul_(self.beta1).add_(delta, alpha=1.0 - self.beta1)
        sq = delta * delta
        if self.kind == "adagrad":
            v.add_(sq)
        elif self.kind == "yogi":
            v.sub_(torch.sign(v - sq).mul_(sq), alpha=1.0 - self.beta2)
        else:
            v.mul_(self.beta2).add_(sq, alpha=1.0 - self.beta2)
        step = m / (v.sqrt().add_(self.tau))
        if self.kind == "adamw" and self.weight_decay:
            step.sub_(x, alpha=self.weight_decay)
        x.add_(step, alpha=self.lr)


class FedAvg(Algorithm):
    __doc__ = """FedAvg (McMahan et al. 2017) with a server optimizer (Reddi et al. 2021).

    One round: the server sends ``x`` to the sampled clients S; each runs K local steps
    ``y_i ← y_i − η ∇f_i(y_i)`` from ``y_i = x`` and sends ``Δ_i = y_i − x`` (compressed with
    the run's compressor, EF21 memory when it is lossy); the server averages
    ``Δ = (1/|S|) Σ_{i∈S} Δ_i`` and steps ``x ← x + η_s Δ`` (``server_optimizer="sgd"``, η_s = 1:
    plain FedAvg) or adaptively. See docs/algorithms/fedavg.md.
""" + _ARGS

    name = "fedavg"
    trains = True
    federated = True
    takes_optimizer = True  # a client's local steps: its torch.optim optimizer when it has one
    requires = Requirements(
        graph=Graph(star=True), gradients=True, compressor="stateless",
        compressor_message="{name} compresses each sampled client's uplink on its own arc, which "
                           "a compressor that keeps state per node ('{spec}') cannot do: use a "
                           "stateless one (topk, randk, qsgd, sign, lead:BITS, none)")
    state_copies = 14  # x, down/up/gradient rows, m and v, the up- and downlink copies, buffers
    step_rule = "exact"
    default_server: ClassVar[str] = "sgd"

    def __init__(self, clients_per_round: int | None = None, local_steps: int | list[int] = 5,
                 eta: float = 0.01, sampling: str = "uniform", availability: float = 1.0,
                 server_optimizer: str | None = None, server_lr: float | None = None,
                 beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
                 weight_decay: float = 0.0, uplink_memory: str | None = "auto",
                 client_weights: list[float] | None = None,
                 downlink_compressor: str | None = None, aggregation: str = "mean",
                 selection: str = "sampled", candidates: int | None = None):
        server_optimizer = server_optimizer or self.default_server
        if server_optimizer not in SERVER_OPTIMIZERS:
            raise ConfigError(f"server_optimizer {server_optimizer!r} (--server-optimizer) does not "
                              "exist: use one of "
                              f"{', '.join(SERVER_OPTIMIZERS)}")
        steps = [local_steps] if isinstance(local_steps, int) else list(local_steps)
        if not steps or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1
                                for k in steps):
            raise ConfigError(f"local_steps = {local_steps}: a client takes at least one local "
                              "step a round (--local-steps K, K >= 1, or one K per client)")
        if clients_per_round is not None and (not isinstance(clients_per_round, int)
                                              or clients_per_round < 1):
            raise ConfigError(f"clients_per_round = {clients_per_round}: give a whole number >= 1")
        if sampling not in SAMPLINGS:
            raise ConfigError(f"sampling {sampling!r} is not one of {', '.join(SAMPLINGS)}")
        uplink_memory = None if uplink_memory == "none" else uplink_memory  # --hparam's text
        if uplink_memory not in ("auto", "ef21", None):
            raise ConfigError(f"uplink_memory {uplink_memory!r} is not 'auto', 'ef21' or None")
        check_range("eta", eta, 0.0, math.inf, "the clients' local step size")
        check_range("availability", availability, 0.0, 1.0, "a probability that a client is online")
        server_lr = (1.0 if server_optimizer == "sgd" else 0.01) if server_lr is None else server_lr
        check_range("server_lr", server_lr, 0.0, math.inf, "the server step η_s")
        check_range("beta1", beta1, 0.0, 1.0, include_low=True, include_high=False)
        check_range("beta2", beta2, 0.0, 1.0, include_low=True, include_high=False)
        check_range("tau", tau, 0.0, math.inf, "the adaptivity τ of Reddi et al. (e.g. 1e-3)")
        check_range("weight_decay", weight_decay, 0.0, math.inf, include_low=True)
        self.local_steps = local_steps if isinstance(local_steps, int) else steps
        self.clients_per_round, self.eta = clients_per_round, eta
        self.sampling, self.availability = sampling, availability
        self.server_optimizer, self.server_lr = server_optimizer, server_lr
        self.beta1, self.beta2, self.tau, self.weight_decay = beta1, beta2, tau, weight_decay
        self.uplink_memory = uplink_memory
        self.client_weights = None if client_weights is None else [float(w) for w in client_weights]
        if downlink_compressor is not None:
            try:
                down = make_compressor(downlink_compressor)
            except GossipError as exc:
                raise ConfigError(f"downlink_compressor: {exc}") from None
            if down.stateful:
                raise ConfigError(f"downlink_compressor '{downlink_compressor}' keeps state per "
                                  "node and cannot compress one message per client: use a "
                                  "stateless one (topk, randk, qsgd, sign, lead:BITS)")
        self.downlink_compressor = downlink_compressor
        if aggregation not in ("mean", "data"):
            raise ConfigError(f"aggregation {aggregation!r} is not 'mean' or 'data'")
        if aggregation == "data" and sampling != "uniform":
            raise ConfigError(f"aggregation 'data' weights k distinct clients by their data; "
                              f"with sampling {sampling!r} the draws already follow the "
                              "weights or repeat clients: use aggregation 'mean'")
        self.aggregation = aggregation
        self._init_selection(selection, candidates)

    def _init_selection(self, selection: str, candidates: int | None) -> None:
        """The round's selection rule (class docstring's ``selection``, ``candidates``)."""
        if selection not in SELECTIONS:
            raise ConfigError(f"selection {selection!r} is not one of {', '.join(SELECTIONS)}")
        if selection == "power":
            k = self.clients_per_round
            if not isinstance(candidates, int) or isinstance(candidates, bool) or candidates < 1:
                raise ConfigError(f"selection 'power' needs candidates d (a whole number >= "
                                  f"clients_per_round), got {candidates!r}")
            if k is None or candidates < k:
                raise ConfigError(f"selection 'power' picks clients_per_round = {k} of its "
                                  f"candidates = {candidates}: give clients_per_round <= "
                                  "candidates (power-of-choice picks k of d >= k)")
        elif candidates is not None:
            raise ConfigError("candidates is selection 'power''s d: give selection='power' too")
        self.selection, self.candidates = selection, candidates

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """The clients' ``eta`` by the ``"exact"`` rule (1/L with full gradients: each local
        step is a safe gradient step); for an adaptive server ``server_lr = RMS(∇f(x0))/L``,
        one local step's per-coordinate size (Adam-like steps move each coordinate by about
        ``server_lr``)."""
        hp = super().suggest_hparams(problem, estimator, topology)
        if cls.default_server == "sgd":
            return hp
        x0 = problem.initial_point()
        grad = sum(problem.grad_full(i, x0) for i in range(problem.n_nodes)) / problem.n_nodes
        rms = float(grad.square().mean().sqrt())
        if 0.0 < rms < math.inf:
            hp["server_lr"] = rms / problem.smoothness().L
        return hp

    def validate(self, topology: Any, compressor: Any) -> None:
        """At most as many clients per round as the star has clients (the star itself is
        ``requires.graph.star``)."""
        n = topology.n
        if self.clients_per_round is not None and self.clients_per_round > n - 1:
            raise ConfigError(f"clients_per_round = {self.clients_per_round} "
                              f"(--clients-per-round) but the star has "
                              f"{n - 1} clients: give at most {n - 1} (or more nodes)")
        if self.selection == "power" and self.candidates > n - 1:
            raise ConfigError(f"candidates = {self.candidates} but the star has {n - 1} "
                              f"clients: give at most {n - 1}")
        ClientSampler(0, n - 1, self.clients_per_round or n - 1, self.sampling, self.availability,
                      self.client_weights)  # refuses weights that do not fit the clients
        if not isinstance(self.local_steps, int) and len(self.local_steps) != n - 1:
            raise ConfigError(f"local_steps gives {len(self.local_steps)} clients their K, the "
                              f"star has {n - 1} clients: give one K per client (or one K)")
        w = self.client_weights
        if self.aggregation == "data" and (w is None or len(w) != n - 1
                                           or not all(0 < v < math.inf for v in w)):
            raise ConfigError(f"aggregation 'data' needs client_weights: {n - 1} positive numbers "
                              f"(the clients' data sizes), got {None if w is None else len(w)}")

    # -- what each method changes -----------------------------------------------------------
    def up_dim(self, d: int) -> int:
        """Entries a client sends up (Δ_i; SCAFFOLD adds Δc_i)."""
        return d

    def down_dim(self, d: int) -> int:
        """Entries the server sends down (x; SCAFFOLD adds c)."""
        return d

    def down_vector(self, block: Block, r: int) -> torch.Tensor:
        """What the server (row r) sends its clients."""
        return block.x[r]

    def uplink_compressor(self) -> Any:
        """The uplink's compressor of a whole ``up_dim`` row, None: the run's (FedAvg)."""
        return None

    def start_local(self, block: Block, rows: list[int], down: torch.Tensor) -> None:
        """Before the local steps: ``y_i ← x`` for the sampled rows (what came down)."""
        d = block.x.shape[1]
        for r in rows:
            block.x[r].copy_(down[r, :d])

    def correction(self, block: Block, rows: list[int], y: torch.Tensor,
                   down: torch.Tensor, out: torch.Tensor) -> None:
        """Add the method's term to the local gradients ``out`` (FedAvg: none)."""

    def local_update(self, block: Block, rows: list[int], grad: torch.Tensor, s: int) -> None:
        """Local step ``s`` (0-based) of the rows: ``y ← y − η g`` (or the client's own
        optimizer's step)."""
        block.local_step(grad, self.eta, rows)

    def finish_local(self, block: Block, rows: list[int], down: torch.Tensor,
                     up: torch.Tensor) -> None:
        """After the local steps: ``up[r] = y_r − x`` for the sampled rows."""
        d = block.x.shape[1]
        for r in rows:
            torch.sub(block.x[r], down[r, :d], out=up[r, :d])

    def after_upload(self, block: Block, link: StarLink, rows: list[int]) -> None:
        """The clients' own use of what they sent (FedAvg: none)."""

    def steps_of(self, client: int) -> int:
        """Client ``client``'s local steps K_i per round."""
        if isinstance(self.local_steps, int):
            return self.local_steps
        return self.local_steps[client - 1]

    def choose(self, losses: dict[int, float]) -> list[int]:
        """Power-of-choice: the ``clients_per_round`` candidates of highest loss (the lower id
        first among equal losses)."""
        ranked = sorted(losses, key=lambda i: (-losses[i], i))
        return sorted(ranked[: self.clients_per_round])

    def server_update(self, block: Block, r: int, avg: torch.Tensor) -> None:
        """The server's step with the averaged uplink."""
        block.workspace["server_opt"].step(block, r, avg[: block.x.shape[1]])

    # -- the round ----------------------------------------------------------------------------
    def setup(self, block: Block) -> None:
        """The sampler, the two phases (:class:`StarLink`, with the uplink memory resolved
        from the compressor), the local buffers and the server optimizer's state."""
        n, d = block.topology.n, block.x.shape[1]
        k = self.clients_per_round or n - 1
        memory, uplink = self.uplink_memory, self.uplink_compressor()
        if memory == "auto":
            memory = None if (uplink or block.compressor).is_identity else "ef21"
        block.hparams.update(clients_per_round=k, uplink_memory=memory)
        drawn = self.candidates if self.selection == "power" else k
        sampler = ClientSampler(block.seed, n - 1, drawn, self.sampling, self.availability,
                                self.client_weights)
        ws = block.workspace
        start = None
        if self.downlink_compressor is not None:  # every node's downlink vector: one for all
            start = torch.stack([self.down_vector(block, r) for r in range(block.m)])
        ws["link"] = StarLink(block, "fed", sampler, self.up_dim(d), self.down_dim(d), memory,
                              self.downlink_compressor, start, uplink)
        ws["down"] = block.x.new_zeros((block.m, self.down_dim(d)))
        ws["up"] = block.x.new_zeros((block.m, self.up_dim(d)))
        ws["grad"] = torch.zeros_like(block.x)
        if self.selection == "power":
            ws["losses"] = block.x.new_zeros((block.m, 1))
        opt = ServerOptimizer(self.server_optimizer, self.server_lr, self.beta1, self.beta2,
                              self.tau, self.weight_decay)
        opt.setup(block)
        ws["server_opt"] = opt

    def step(self, block: Block) -> Round:
        """One round: the downlink to the sampled clients, their K local steps, the uplink of
        their deltas, the server's step (module docstring)."""
        ws, x = block.workspace, block.x
        link: StarLink = ws["link"]
        link.begin()
        server = link.server_row
        inbox = yield link.broadcast(self.down_vector(block, server) if server is not None else None)
        link.receive(inbox, ws["down"])  # the global model (and c) for the sampled clients
        if self.selection == "power":  # the candidates' losses up, the server's choice down
            d, losses = x.shape[1], ws["losses"]
            for r in link.rows:
                losses[r, 0] = block.loss(r, ws["down"][r, :d])
            inbox = yield link.report(losses)
            chosen = self.choose(link.reported(inbox)) if server is not None else None
            inbox = yield link.announce(chosen)
            link.narrow(inbox, chosen)
        rows, g = link.rows, ws["grad"]
        self.start_local(block, rows, ws["down"])
        steps = [self.steps_of(block.ids[r]) for r in rows]
        for s in range(max(steps, default=0)):  # a client stops after its K_i steps
            active = [r for r, k in zip(rows, steps, strict=True) if k > s]
            block.gradients(g, active)
            self.correction(block, active, x, ws["down"], g)
            self.local_update(block, active, g, s)
        self.finish_local(block, rows, ws["down"], ws["up"])
        sent = link.upload(ws["up"])
        self.after_upload(block, link, rows)
        inbox = yield sent
        avg = link.average(inbox, self.client_weights if self.aggregation == "data" else None)
        if avg is not None:
            self.server_update(block, server, avg)


class FedAdam(FedAvg):
    __doc__ = """FedAdam (Reddi et al. ICLR'21): FedAvg whose server steps with Adam on ``−Δ``.

    ``m ← β1 m + (1 − β1) Δ``, ``v ← β2 v + (1 − β2) Δ²``, ``x ← x + η_s m / (√v + τ)``.
    See docs/algorithms/fedadam.md (server_optimizer "adam" by default).
""" + _ARGS

    name = "fedadam"
    default_server = "adam"


class FedYogi(FedAvg):
    __doc__ = """FedYogi (Reddi et al. ICLR'21): FedAdam with ``v ← v − (1 − β2) Δ² sign(v − Δ²)``.

    See docs/algorithms/fedyogi.md (server_optimizer "yogi" by default).
""" + _ARGS

    name = "fedyogi"
    default_server = "yogi"


class FedAdagrad(FedAvg):
    __doc__ = """FedAdagrad (Reddi et al. ICLR'21): FedAdam with ``v ← v + Δ²``.

    See docs/algorithms/fedadagrad.md (server_optimizer "adagrad" by default).
""" + _ARGS

    name = "fedadagrad"
    default_server = "adagrad"


class FedProx(FedAvg):
    """FedProx (Li et al. MLSys 2020): FedAvg whose clients minimize ``f_i(y) + (μ/2)‖y − x‖²``.

    Local step ``y_i ← y_i − η (∇f_i(y_i) + μ (y_i − x))``; the rest is :class:`FedAvg`'s.
    See docs/algorithms/fedprox.md.

    Args:
        mu: the proximal weight μ >= 0 (0: FedAvg). clients_per_round, local_steps, eta,
            sampling, availability, server_optimizer, server_lr, beta1, beta2, tau,
            weight_decay, uplink_memory, client_weights, downlink_compressor, aggregation,
            selection, candidates: as :class:`FedAvg`.
    """

    name = "fedprox"

    def __init__(self, mu: float = 0.01, clients_per_round: int | None = None,
                 local_steps: int = 5, eta: float = 0.01, sampling: str = "uniform",
                 availability: float = 1.0, server_optimizer: str | None = None,
                 server_lr: float | None = None, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3, weight_decay: float = 0.0, uplink_memory: str | None = "auto",
                 client_weights: list[float] | None = None,
                 downlink_compressor: str | None = None, aggregation: str = "mean",
                 selection: str = "sampled", candidates: int | None = None):
        check_range("mu", mu, 0.0, math.inf, "FedProx's proximal weight", include_low=True)
        super().__init__(clients_per_round, local_steps, eta, sampling, availability,
                         server_optimizer, server_lr, beta1, beta2, tau, weight_decay,
                         uplink_memory, client_weights, downlink_compressor, aggregation,
                         selection, candidates)
        self.mu = mu

    def correction(self, block: Block, rows: list[int], y: torch.Tensor,
                   down: torch.Tensor, out: torch.Tensor) -> None:
        d = y.shape[1]
        for r in rows:  # + μ (y_i − x)
            out[r].add_(y[r] - down[r, :d], alpha=self.mu)


class Scaffold(FedAvg):
    __doc__ = """SCAFFOLD (Karimireddy et al. ICML'20), control variates with option II.

    The server sends ``(x, c)``; client i runs K steps ``y_i ← y_i − η (∇f_i(y_i) − c_i + c)``,
    sets ``c_i⁺ = c_i − c + (x − y_i)/(K η)`` and sends ``(Δy_i, Δc_i) = (y_i − x, c_i⁺ − c_i)``;
    ``c_i ← c_i + Δĉ_i``, what the server receives of Δc_i (``c_i⁺`` when exact). The server
    steps ``x ← x + η_g (1/|S|) Σ Δŷ_i`` (its optimizer, η_g = ``server_lr``) and
    ``c ← c + (1/N) Σ_{i∈S} Δĉ_i``. See docs/algorithms/scaffold.md.
""" + _ARGS

    name = "scaffold"
    takes_optimizer = False  # its control variates take the plain steps of size eta
    state_copies = 24  # FedAvg's with 2d-entry messages, and the control variates

    def validate(self, topology: Any, compressor: Any) -> None:
        """FedAvg's checks; the plain average only (``c`` is the clients' plain mean)."""
        super().validate(topology, compressor)
        if self.aggregation != "mean":
            raise ConfigError("scaffold averages its clients plainly (its c is their mean): "
                              "use aggregation 'mean'")

    def up_dim(self, d: int) -> int:
        return 2 * d

    def down_dim(self, d: int) -> int:
        return 2 * d

    def setup(self, block: Block) -> None:
        block.state["scaffold.c"] = torch.zeros_like(block.x)  # c_i (clients), c (server)
        super().setup(block)

    def down_vector(self, block: Block, r: int) -> torch.Tensor:
        return torch.cat((block.x[r], block.state["scaffold.c"][r]))

    def correction(self, block: Block, rows: list[int], y: torch.Tensor,
                   down: torch.Tensor, out: torch.Tensor) -> None:
        d, c = y.shape[1], block.state["scaffold.c"]
        for r in rows:  # − c_i + c
            out[r].sub_(c[r]).add_(down[r, d:])

    def finish_local(self, block: Block, rows: list[int], down: torch.Tensor,
                     up: torch.Tensor) -> None:
        super().finish_local(block, rows, down, up)
        d = block.x.shape[1]
        for r in rows:  # c_i⁺ = c_i − c + (x − y_i)/(Kη);  Δc_i = c_i⁺ − c_i = −c − Δy_i/(Kη)
            scale = 1.0 / (self.steps_of(block.ids[r]) * self.eta)
            torch.mul(up[r, :d], -scale, out=up[r, d:]).sub_(down[r, d:])

    def after_upload(self, block: Block, link: StarLink, rows: list[int]) -> None:
        """``c_i ← c_i + Δĉ_i``, by what the server adds (Δc_i itself when exact), so the
        server's ``c`` stays the clients' mean under compression too."""
        d, c, up = block.x.shape[1], block.state["scaffold.c"], block.workspace["up"]
        link.delivered(up)
        for r in rows:
            c[r].add_(up[r, d:])

    def server_update(self, block: Block, r: int, avg: torch.Tensor) -> None:
        d = block.x.shape[1]
        link = block.workspace["link"]
        super().server_update(block, r, avg)
        # (1/N) Σ_{i∈S} Δc_i = (|S|/N) · (the uplink average)
        block.state["scaffold.c"][r].add_(avg[d:], alpha=len(link.sample) / link.sampler.clients)
