"""Decentralized training in your own loop: ``model, opt = gossip.wrap(model, optimizer, ...)``.

::

    model, opt = gossip.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                             algorithm="choco", compressor="topk:0.01", topology="ring")
    loader = DataLoader(train_set, batch_size=32, sampler=opt.sampler(train_set))
    for x, y in loader:                      # the loop stays yours
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                           # one round of CHOCO-SGD with this gradient

Each process is one node (under ``mpiexec -n 4`` or ``torchrun --nproc-per-node 4``: four
nodes), or a block of nodes with ``nodes=N`` (then :attr:`GossipOptimizer.models` holds one
copy of the model per hosted node, and the loop gives each its gradient). A plain ``python``
process is one node alone: nothing to gossip with, the algorithm's round reduces to its local
step (a quick check of the script before launching it on several processes).

``opt.step()`` runs one round of the algorithm on the :class:`~gossip.engine.Engine`, exactly
as :class:`~gossip.training.DecentralizedTrainer` does, except that the node's stochastic
gradient is the one ``loss.backward()`` left in the parameters' ``.grad`` (a
:class:`~gossip.training.oracle.BackwardOracle`). The model's parameters are views into the
node's flat ``x``, so after ``opt.step()`` ``model`` holds the node's new parameters. An
algorithm whose setup starts from a gradient (LEAD, BEER, MoTEF, DoCoM) spends the first step
on its setup, as the trainer spends its first mini-batch. Algorithms that want a gradient at
another point or twice per round are refused with a :class:`~gossip.errors.WrapError`, and
so are the asynchronous ones (no rounds: virtual time in one process, docs/asynchronous.md). See
``docs/wrap.md``.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from gossip.algorithms import REGISTRY, make_algorithm
from gossip.comm.launch import launched_by_mpi
from gossip.comm.world import World
from gossip.compress import Compressor
from gossip.core.algorithm import Algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError, GossipError, NodeError, WrapError
from gossip.metrics import consensus_error
from gossip.rng import oracle_seed
from gossip.training import flat
from gossip.training.build import check_trainable, load_average, training_engine
from gossip.training.data import NodeSampler
from gossip.training.oracle import BackwardOptimizerOracle, BackwardOracle
from gossip.training.precision import MasterWeights, quantize_mode, wants_master_weights

OptimizerLike = torch.optim.Optimizer | Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None

PROGRESS_EVERY_S = 2e-4
"""The least time between two calls into MPI's progress engine from the backward's hooks."""

SAME_START_FIX = ("build the model identically on every process: seed torch before creating it "
                  "(torch.manual_seed(0); model = ...) or load the same weights on every rank "
                  "before gossip.wrap")


class GossipOptimizer(torch.optim.Optimizer):
    """The optimizer :func:`wrap` returns: ``step()`` is one round of the algorithm for this
    process's nodes, with the gradients ``loss.backward()`` left in their models.

    A ``torch.optim.Optimizer`` (so that ``torch.optim.lr_scheduler`` accepts it) whose
    parameter groups are those of the nodes' own optimizers; it does not call
    ``Optimizer.__init__``, which would make groups of its own.

    Attributes:
        engine: the :class:`~gossip.engine.Engine` that runs the rounds.
        models: one module per node hosted here (``models[0]`` is the model you wrapped).
        optimizers: their local ``torch.optim`` optimizers (empty without one).
        n: the number of nodes of the run.
    """

    _step_supports_amp_scaling = True  # torch.amp.GradScaler hands step() its scale and overflow

    def __init__(self, engine: Engine, models: list[nn.Module], optimizers: list[torch.optim.Optimizer],
                 oracles: list[BackwardOracle | BackwardOptimizerOracle], *, seed: int,
                 gossip_buffers: bool, overlap: bool = False):
        self.engine = engine
        self.models = models
        self.optimizers = optimizers
        self.n = engine.n
        self.seed = seed
        self.gossip_buffers = gossip_buffers
        self.overlap = overlap
        self._oracles = oracles
        self.defaults = dict(optimizers[0].defaults) if optimizers else {}
        self._groups = [{"params": flat.parameters(m)} for m in models]
        eta = getattr(engine.algorithm, "eta", None)
        if not optimizers and isinstance(eta, int | float):  # a scheduler may drive the step
            for group in self._groups:
                group["lr"] = float(eta)
            self.defaults = {"lr": float(eta)}
        self._eval_module = copy.deepcopy(models[0])
        self._eval_flat = flat.flatten(models[0], gossip_buffers).clone()
        flat.bind(self._eval_module, self._eval_flat, gossip_buffers)
        self._sends_at_forward = overlap and engine.algorithm.overlaps == "within"
        self._progressed = 0.0
        self._hooks = []
        if overlap:
            for model in models:
                self._hooks.append(model.register_forward_pre_hook(self._forward_begins))
                for p in model.parameters():
                    if p.requires_grad:
                        self._hooks.append(p.register_post_accumulate_grad_hook(self._progress))

    # -- torch.optim's interface ---------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The local optimizers' parameter groups, node after node (a scheduler or a change of
        ``lr`` applies to every hosted node); without a local optimizer, one group of
        parameters per node whose ``lr`` is the algorithm's step size ``eta`` (a
        ``torch.optim.lr_scheduler`` on this optimizer, or a change of ``lr``, sets the
        ``eta`` of the next step; no ``lr`` where ``eta`` is a schedule ``lambda t: ...``
        or the algorithm has none)."""
        if self.optimizers:
            return [g for opt in self.optimizers for g in opt.param_groups]
        return self._groups

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]
        """The local optimizers' per-parameter state, every hosted node's (as torch.optim's)."""
        return {p: st for opt in self.optimizers for p, st in opt.state.items()}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the nodes' models are fixed when they are wrapped (a new tensor would not be
        in the flat model the nodes gossip)."""
        raise WrapError("a wrapped optimizer takes no new parameter group: add it to your optimizer "
                        "and the parameters to your model before gossip.wrap")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of every hosted node's model (as ``optimizer.zero_grad``). With
        a local optimizer, after a step the gradients are views into the node's flat
        gradient: ``set_to_none=False`` zeroes them in place, so the next backward accumulates
        into them and ``opt.step()`` copies nothing (DDP's ``gradient_as_bucket_view``)."""
        for oracle in self._oracles:
            oracle.zero_grad(set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One round of the algorithm on every hosted node (a collective under MPI: every process
        steps together). ``closure`` (optional) recomputes the loss and its gradient first.

        Called by ``torch.amp.GradScaler.step(opt)``, the processes first agree whether any
        of them found an overflow in its scaled gradients: then every one skips the step
        (no round, no local step, as the scaler skips an optimizer's step), else each unscales
        its gradients and the round runs."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)  # set by GradScaler.step for this call
        if found_inf is not None:
            if self.engine.world.any(bool(found_inf.item())):
                return loss
            scale = getattr(self, "grad_scale", None)  # None: the loop called scaler.unscale_
            grads = [p.grad for m in self.models for p in m.parameters() if p.grad is not None]
            if scale is not None and grads:
                torch._foreach_mul_(grads, scale.double().reciprocal().float().to(grads[0].device))
        for oracle in self._oracles:
            oracle.arm()
        if not self.optimizers and "lr" in self._groups[0]:
            self.engine.algorithm.eta = float(self._groups[0]["lr"])
        try:
            self._engine_call(self._round)
        finally:
            for oracle in self._oracles:
                oracle.disarm()
        return loss

    def _round(self) -> None:
        """The step's round on the engine (at the first step its setup, which may take the
        gradients itself: round 0, no messages)."""
        engine = self.engine
        if not engine.is_set_up:
            engine.setup()
            if not any(oracle.armed for oracle in self._oracles):
                return
        if self._sends_at_forward:  # the round began at the forward: x_t travels
            if not engine.in_round:
                engine.begin_round()
            engine.end_round()
        elif self.overlap:  # last round's messages arrived while this gradient was computed
            engine.end_round()
            engine.begin_round()
            if any(oracle.armed for oracle in self._oracles):
                engine.end_round()  # a round that sends first (ECD's first): no overlap
        else:
            engine.step()

    def synchronize(self) -> None:
        """With ``overlap`` on an algorithm that takes its gradient before sending (CHOCO-SGD &c.):
        wait for the round in flight and mix it in (the helpers below and :meth:`state_dict`
        do it first; call it after the last step before using the model). Nothing otherwise:
        D-PSGD's round in flight (posted at the forward) waits for the next ``opt.step()``'s
        gradient, and the model is already the current one."""
        if not self._sends_at_forward:
            self.engine.end_round()

    def _forward_begins(self, module: nn.Module, args: Any) -> None:
        """A forward that will be differentiated: post the round's messages of the model it
        reads, so they travel during the forward and the backward (D-PSGD, overlap)."""
        if (self._sends_at_forward and torch.is_grad_enabled() and self.engine.is_set_up
                and not self.engine.in_round):
            self._engine_call(self.engine.begin_round)

    def _progress(self, param: torch.Tensor) -> None:
        """A parameter's gradient is ready: let the messages in flight move (MPI progresses
        only inside its calls), at most every :data:`PROGRESS_EVERY_S` (a model of many small
        tensors would otherwise call into MPI hundreds of times per backward)."""
        now = time.perf_counter()
        if now - self._progressed >= PROGRESS_EVERY_S:
            self._progressed = now
            self.engine.progress()

    def _engine_call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` with the engine's errors as the user should see them: the algorithm's
        refusal of the gradient it was handed, or an algorithm that needs a neighbour alone."""
        try:
            return fn()
        except NodeError as exc:
            if isinstance(exc.__cause__, WrapError):  # the algorithm wanted another gradient
                raise exc.__cause__ from None
            if self.n == 1:
                raise _alone(self.engine.algorithm.name, exc) from exc
            raise

    def _refuse_in_flight(self, what: str) -> None:
        if self._sends_at_forward and self.engine.in_round:
            raise WrapError(f"{what} between a forward and its opt.step(): with overlap the round's "
                            "messages were posted at the forward and wait for that step's "
                            "gradient; call it after opt.step() (or run the forward under "
                            "torch.no_grad(), which posts nothing)", rank=self.rank)

    def state_dict(self) -> dict[str, Any]:
        """What resumes this process's nodes exactly: models, algorithm state, compressors,
        local optimizers, bytes sent, the round (each process saves its own nodes)."""
        self._refuse_in_flight("state_dict() was called")
        self.synchronize()
        return {
            "wrap": {"algorithm": self.engine.algorithm.name, "nodes": self.n,
                     "ids": list(self.engine.nodes)},
            "nodes": self.engine.node_state_dicts(),
            "run": self.engine.run_state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the models, which are views, change in place)."""
        saved = state.get("wrap") if isinstance(state, dict) else None
        if saved is None:
            raise WrapError("load_state_dict takes what GossipOptimizer.state_dict() returned "
                            "(keys 'wrap', 'nodes', 'run'); got another object")
        self._refuse_in_flight("load_state_dict() was called")
        self.synchronize()
        here = {"algorithm": self.engine.algorithm.name, "nodes": self.n, "ids": list(self.engine.nodes)}
        if saved != here:
            raise WrapError(f"the checkpoint was written by {saved}, this wrapper is {here}: load it "
                            "into a wrapper of the same algorithm, number of nodes and process "
                            "(each rank loads its own file)", rank=self.rank)
        self.engine.load_state_dicts(state["nodes"], state["run"])

    # -- what a training script needs --------------------------------------------------------
    @property
    def round(self) -> int:
        """Rounds so far (with ``overlap``, the one in flight too): one per ``opt.step()``,
        but for the first step of an algorithm whose setup takes a gradient (round 0)."""
        return self.engine.round + int(self.engine.in_round)

    @property
    def rank(self) -> int:
        """This process's rank (0 in a single process)."""
        return self.engine.world.rank

    @property
    def world_size(self) -> int:
        """The number of processes."""
        return self.engine.world.size

    @property
    def is_root(self) -> bool:
        """True on the process that should print and write files (rank 0)."""
        return self.engine.world.is_root

    @property
    def node(self) -> int:
        """The id of this process's (first) node."""
        return self.engine.block.ids[0]

    @property
    def local_nodes(self) -> list[int]:
        """The ids of the nodes this process hosts, in the order of :attr:`models`."""
        return list(self.engine.block.ids)

    @property
    def bits_sent(self) -> int:
        """Bits this process's nodes have handed to the transport so far (local, no collective)."""
        sent = self.engine.transport.bytes_sent
        return 8 * sum(int(sent.get(i, 0)) for i in self.engine.nodes)

    def bits_per_node(self) -> float:
        """Mean bits sent per node of the run so far (collective: every process calls it)."""
        self.synchronize()
        return float(self.engine.bytes_sent().mean()) * 8

    def average_model(self) -> nn.Module:
        """A copy of the averaged model x̄ = (1/n) Σ_i x_i, for evaluation (with the nodes'
        mean buffers unless they are gossiped). A collective: every process must call it."""
        self.synchronize()
        modules = dict(zip(self.engine.block.ids, self.models, strict=True))
        load_average(self.engine, self.engine.mean_model(), self._eval_module, self._eval_flat,
                     modules, self.gossip_buffers)
        return copy.deepcopy(self._eval_module)

    def consensus_distance(self) -> float:
        """(1/n) Σ_i ‖x_i − x̄‖²: how far the nodes are apart (collective)."""
        self.synchronize()
        return consensus_error(self.engine, self.engine.mean_model())

    def sampler(self, dataset: Any, partition: str | Sequence[Sequence[int]] = "iid",
                node: int | None = None) -> NodeSampler:
        """A torch ``Sampler`` over this process's node's part of ``dataset`` (``node``: another
        hosted node), in the order DecentralizedTrainer's loader reads it for the same seed."""
        return NodeSampler(dataset, self.node if node is None else node, self.n, seed=self.seed,
                           partition=partition)


def wrap_overlapping() -> list[str]:
    """Algorithms that ``wrap`` overlaps by default with the same numbers: those whose round
    takes the gradient before sending and leaves the model alone after (``overlaps ==
    "next"``: the messages travel from one ``opt.step()`` to the next), and those that take
    it after sending, at the model sent (``"within"``, D-PSGD: the messages of the model a
    forward reads are posted at that forward and mixed in at the step)."""
    return sorted(name for name, cls in REGISTRY.items() if cls.overlaps in ("next", "within"))


def wrap(
    model: nn.Module,
    optimizer: OptimizerLike = None,
    *,
    algorithm: str | type[Algorithm] | Algorithm = "choco",
    compressor: str | Compressor | None = None,
    topology: Any = "ring",
    seed: int = 0,
    nodes: int | None = None,
    world: World | None = None,
    gossip_buffers: bool = False,
    per_tensor: bool = True,
    l2: float = 0.0,
    timeout: float = 120.0,
    network: str | None = None,
    transport: str = "auto",
    overlap: bool | None = None,
    link_latency: float = 0.0,
    master_weights: bool | None = None,
    quantize: str | None = None,
    **hparams: Any,
) -> tuple[nn.Module, GossipOptimizer]:
    """Make ``model`` a node of a decentralized run; returns ``(model, opt)``.

    Args:
        model: the model, built identically on every process (seed torch first; checked).
        optimizer: a ``torch.optim`` optimizer on ``model.parameters()``, or a factory
            ``params -> optimizer``: the node's local step (algorithms with ``takes_optimizer``:
            dpsgd, choco, deepsqueeze, powergossip). None: the algorithm's own step with ``eta``.
        algorithm: a registry name, class or instance; ``**hparams`` go to its constructor.
        compressor: a compressor spec (``"topk:0.01"``) or instance; None sends models exactly.
        topology: a spec (``"ring"``, built for the number of nodes) or a topology.
        seed: the run seed (compressors' randomness, the data partition of :meth:`sampler`).
        nodes: the number of nodes; None: one per process. More than the processes: each
            process hosts a block of them (``opt.models``, one gradient each per step).
        world: the process group (default: detected, ``World.detect()``: MPI under mpiexec,
            torch.distributed under torchrun, NCCL for a CUDA model).
        transport: what the detected world uses: ``auto``, ``mpi``, ``torch``, ``gloo``,
            ``nccl`` or ``local`` (docs/transports.md).
        overlap: let the round's messages travel while your loop computes, with the same
            numbers (:func:`wrap_overlapping`; docs/wrap.md). For D-PSGD the messages of the
            model are posted when a forward runs with gradients enabled and mixed in at
            ``opt.step()`` (``x <- W x - lr grad f(x)``, the gradient at the model sent); for
            CHOCO-SGD and the others that send after their gradient, ``opt.step()`` posts them
            and returns, and they are mixed in at the next ``step()`` (or
            :meth:`GossipOptimizer.synchronize`). None (default): on where it keeps the
            numbers, off elsewhere; True refuses the other algorithms.
        link_latency: seconds every round's messages take to arrive on top of the transfer
            (a simulated link delay, to measure ``overlap``).
        master_weights: for a bfloat16/float16 model, the optimizer steps float32 copies of
            the parameters (its ``param_groups`` are moved onto them; docs/low-precision.md)
            and the model follows, rounded. None (default): on for half models with an
            optimizer; False: the optimizer steps the half parameters.
        quantize: ``"int8"`` or ``"int8-sr"``: the model's ``nn.Linear`` and ``nn.Conv*``
            layers compute in 8 bits in training mode (their ``forward`` is replaced on the
            instances: weights, input activations and output gradients rounded to 256 min-max
            levels, ``-sr`` stochastically with a generator per node seeded from ``seed``), as
            DecentralizedTrainer's ``quantize`` (docs/low-precision.md). In eval mode they
            run in full precision. None: off.
        l2: weight decay added to the gradient, for algorithms without a local optimizer.
        gossip_buffers, per_tensor, timeout, network: as for DecentralizedTrainer.
    """
    if not isinstance(model, nn.Module):
        raise WrapError(f"gossip.wrap takes an nn.Module, got {type(model).__name__}")
    params = flat.parameters(model)
    if not params:
        raise WrapError(f"the model ({type(model).__name__}) has no parameters: there is nothing to "
                        "train or gossip; wrap the module that holds the weights")
    kinds = {(p.dtype, p.device) for p in flat.tensors(model, gossip_buffers)}
    if len(kinds) > 1:
        raise WrapError(f"the model mixes dtypes/devices {sorted(map(str, kinds))}: the flat model is "
                        "one tensor; move it first (model.to(dtype=..., device=...))")
    dtype, device = params[0].dtype, params[0].device
    if world is None:  # the timeout bounds the start-up too (torchrun's rendezvous)
        try:
            world = World.detect(timeout=timeout, transport=transport, device=device)
        except ConfigError as exc:
            raise WrapError(f"transport={transport!r}: {exc}") from None
    _check_launch(world)
    n = world.size if nodes is None else int(nodes)
    if n < world.size:
        raise WrapError(f"nodes={n} cannot fill {world.size} processes: pass nodes >= {world.size} "
                        f"(or nodes=None, one node per process)", rank=world.rank)
    topo = _topology(topology, n, seed, nodes is None, world)
    alg = make_algorithm(algorithm, **hparams)
    if alg.federated:
        raise WrapError(f"{alg.name} is federated: a server without data and sampled clients taking "
                        "several local steps, each a gradient the wrapper cannot hand over from "
                        "one backward; train it with gossip.DecentralizedTrainer (or "
                        "experiments/train.py --algorithm " + alg.name + ")")
    if alg.asynchronous:
        raise WrapError(f"{alg.name} is asynchronous: its nodes have no rounds and take a varying "
                        "number of steps, each at its own instant of virtual time, all in one "
                        "process, while a wrapped loop is one synchronous round per opt.step() "
                        "with one backward per node; train it with experiments/train.py "
                        f"--algorithm {alg.name} or gossip.DecentralizedTrainer "
                        "(docs/asynchronous.md)")
    check_trainable(alg, optimizer)
    exact_overlap = alg.overlaps in ("next", "within")
    if overlap is None:
        overlap = exact_overlap
    elif overlap and not exact_overlap:
        raise WrapError(f"overlap=True: {alg.name} changes the model after sending its messages, "
                        f"so they cannot travel while the next gradient is computed; overlap works "
                        f"with {', '.join(wrap_overlapping())}")
    if l2 and optimizer is not None:
        raise WrapError(f"l2={l2} is the weight decay of algorithms without a local optimizer; with "
                        "one, give the optimizer weight_decay instead")
    masters = wants_master_weights(master_weights, dtype, optimizer is not None, alg.name, WrapError)
    quantize = quantize_mode(quantize, dtype, None, WrapError)
    local = world.local_nodes(n)
    models, optimizers = _node_copies(model, optimizer, len(local))
    oracles: list[BackwardOracle | BackwardOptimizerOracle] = []
    for i, module, opt in zip(local, models, optimizers or [None] * len(models), strict=True):
        rng = oracle_seed(seed, i)  # the trainer's node seed (8-bit stochastic rounding)
        if opt is None:
            oracles.append(BackwardOracle(module, algorithm=alg.name, buffers=gossip_buffers, l2=l2,
                                          quantize=quantize, rng_seed=rng))
        else:
            master = _master_weights(module, opt) if masters else None
            oracles.append(BackwardOptimizerOracle(module, opt, algorithm=alg.name,
                                                   buffers=gossip_buffers, master=master,
                                                   quantize=quantize, rng_seed=rng))
    by_id = dict(zip(local, oracles, strict=True))
    try:
        engine = training_engine(
            alg, topo, flat.flatten(model, gossip_buffers), flat.layout_of(model, gossip_buffers),
            lambda i, _gen: by_id[i], per_tensor=per_tensor,
            compressor="none" if compressor is None else compressor, seed=seed,
            world=world.configure(timeout=timeout, link_latency=link_latency),
            network=network, device=device, dtype=dtype, fix=SAME_START_FIX, defer_setup=True,
        )
    except GossipError as exc:
        if isinstance(exc.__cause__, WrapError):
            raise exc.__cause__ from None
        if n == 1 and not isinstance(exc, WrapError):
            raise _alone(alg.name, exc) from exc
        raise
    return models[0], GossipOptimizer(engine, models, optimizers, oracles, seed=seed,
                                      gossip_buffers=gossip_buffers, overlap=overlap)


def _node_copies(model: nn.Module, optimizer: OptimizerLike,
                 m: int) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
    """``m`` (model, optimizer) pairs: the given ones first, then deep copies of the pair (each
    copied optimizer works on its copied model), or the factory called on each model."""
    if optimizer is None:
        return [model] + [copy.deepcopy(model) for _ in range(m - 1)], []
    if isinstance(optimizer, torch.optim.Optimizer):
        _check_optimizer(model, optimizer)
        pairs = [(model, optimizer)] + [copy.deepcopy((model, optimizer)) for _ in range(m - 1)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if callable(optimizer):
        models = [model] + [copy.deepcopy(model) for _ in range(m - 1)]
        opts = [optimizer(flat.parameters(mod)) for mod in models]
        for mod, opt in zip(models, opts, strict=True):
            if not isinstance(opt, torch.optim.Optimizer):
                raise WrapError(f"the optimizer factory returned a {type(opt).__name__}, not a "
                                "torch.optim.Optimizer")
            _check_optimizer(mod, opt)
        return models, opts
    raise WrapError(f"optimizer must be a torch.optim.Optimizer on model.parameters(), a factory "
                    f"params -> optimizer, or None; got {type(optimizer).__name__}")


def _master_weights(module: nn.Module, optimizer: torch.optim.Optimizer) -> MasterWeights:
    """Float32 master weights of ``module``'s parameters, ``optimizer`` moved onto them (its
    groups and hyper-parameters kept; it must not have stepped yet)."""
    if optimizer.state:
        raise WrapError("master weights: the optimizer has state already (it stepped): build it "
                        "fresh on model.parameters() before gossip.wrap, or pass "
                        "master_weights=False")
    params = flat.parameters(module)
    master = MasterWeights(params)
    by_id = {id(p): m for p, m in zip(params, master.params, strict=True)}
    for group in optimizer.param_groups:
        group["params"] = [by_id[id(p)] for p in group["params"]]
    return master


def _check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer must step exactly the model's trainable parameters."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    ids = {id(p) for p in model.parameters()}
    foreign = held - ids
    if foreign:
        raise WrapError(f"the optimizer holds {len(foreign)} tensor(s) that are not parameters of the "
                        "model: build it on this model's parameters (model.parameters())")
    missing = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if missing:
        raise WrapError(f"the model's parameters {missing[:5]}{' ...' if len(missing) > 5 else ''} are "
                        f"not in the optimizer ({len(missing)} of {len(trainable)} trainable): they "
                        "would be gossiped but never trained; build the optimizer on "
                        "model.parameters(), or set requires_grad=False on the frozen ones")


def _topology(spec: Any, n: int, seed: int, per_process: bool, world: World) -> Any:
    """The run's graph: the spec built for ``n`` nodes (a single node alone when ``n`` is 1),
    or the given topology, which must have ``n`` nodes."""
    if isinstance(spec, str):
        import networkx as nx  # not at import: `import gossip` stays free of graph packages

        import topologies

        if n == 1:
            graph = nx.empty_graph(1)
            return topologies.Topology(graph, np.ones((1, 1)), name="single node")
        return topologies.build(spec, n, seed=seed)
    have = getattr(spec, "n", None)
    if have != n:
        if per_process:
            raise WrapError(f"the topology has {have} nodes but {world.size} process(es) run one node "
                            f"each: launch {have} processes ({world.launch_hint(have)}), or pass nodes={have} "
                            "(each process then hosts a block of nodes)", rank=world.rank)
        raise WrapError(f"the topology has {have} nodes but nodes={n}: pass nodes={have}",
                        rank=world.rank)
    return spec


def _alone(algorithm: str, exc: Exception) -> WrapError:
    """The error of an algorithm that cannot run on one node without neighbors."""
    return WrapError(f"{algorithm} cannot run on a single node (a plain process without mpiexec and "
                     f"without nodes=), which has no neighbors: {exc}. Launch several processes "
                     "(mpiexec -n 4 python ...) or pass nodes=N to host N nodes here")


def _check_launch(world: World) -> None:
    """Refuse a process that its launcher started as one of several but that sees a world of
    one (each would train alone without a word): MPI or the process group is not set up."""
    if world.size > 1:
        return
    if launched_by_mpi():
        size = _env_int("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
        if size > 1:
            raise WrapError(f"mpiexec started {size} processes but MPI (mpi4py) sees one: mpiexec and "
                            "mpi4py come from different MPI installations; run the mpiexec of the "
                            "MPI that mpi4py was built with (python -m mpi4py --mpi-library)")
        return
    size = _env_int("WORLD_SIZE")
    if size > 1:
        raise WrapError(f"this process was started as one of {size} (WORLD_SIZE={size}, torchrun) "
                        "but its world is a single process, so each would train alone: leave "
                        "world= and transport= out under torchrun (the process group is then "
                        f"joined), or launch with mpiexec -n {size}")


def _env_int(*names: str) -> int:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


class _CallableModule(types.ModuleType):
    """``gossip.wrap`` is this module and, called, :func:`wrap` (``gossip.wrap(model, opt)``
    as well as ``gossip.wrap.NodeSampler``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[nn.Module, GossipOptimizer]:
        return wrap(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["GossipOptimizer", "NodeSampler", "WrapError", "wrap"]
