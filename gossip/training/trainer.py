"""Decentralized training of a PyTorch model: every node trains a copy, then gossips.

:class:`DecentralizedTrainer` turns a model, a data set and a topology into an
:class:`~gossip.engine.Engine` run:

* the model's parameters (and, with ``gossip_buffers=True``, its float buffers such as BatchNorm
  running statistics) live in one flat buffer per node — the node's ``x``, so a message is one
  buffer — and the node's module copy and optimizer work on views into it;
* the training set is split over the nodes (``partition``: ``iid``, ``sorted``,
  ``dirichlet:ALPHA`` or explicit index arrays) and each node reads its part through its own
  seeded ``DataLoader``;
* a round = each node computes a mini-batch gradient, steps with its ``torch.optim`` optimizer
  and gossips, in the order of its algorithm (D-PSGD and PowerGossip: gradient at the
  pre-gossip model, gossip, then the optimizer step; CHOCO-SGD and DeepSqueeze: gradient and
  step, then gossip). Algorithms whose class says ``takes_optimizer = False`` (LEAD, BEER,
  DCD, ECD) take the gradient directly with their own ``eta`` (their update needs the raw
  gradient; docs/algorithms/), so they get no optimizer; weight decay then enters as ``l2``.
* asynchronous algorithms (AD-PSGD, gossip learning, asynchronous SGP and CHOCO;
  docs/asynchronous.md) have no rounds: a "round" is a *sweep* of n activations in virtual
  time, one per node on average, and each activation (gossip learning: each model's arrival)
  draws one mini-batch of the node it steps. A node's steps per sweep vary (a straggler takes
  fewer, the others more), so its scheduler follows the sweeps (``schedule_by_round``), not
  its own count of steps. They run in one process, without ``overlap`` or ``link_latency``
  (the engine refuses them); checkpoints save their event queue (docs/asynchronous.md).
* ``free_run=SCALE`` under ``mpiexec`` with one node per rank: the nodes train in wall-clock
  order, each local step lasting its ``--network`` compute draw × SCALE wall seconds
  (asynchronous algorithms: :mod:`gossip.network.freerun`; rounds: :mod:`gossip.network.clock`).
  An asynchronous free run's schedule follows the sweep of the wall clock (one mean compute
  time × SCALE per sweep), common to all nodes, as in virtual time; its records are taken at
  the common wall instants of every ``log_every`` sweeps after the run, from each node's
  snapshot, so :meth:`node_metrics` keeps each node's train loss and learning rate at those
  instants for :meth:`metrics` (which then evaluates the snapshots' averaged and own models).

Definitions (documented because logs depend on them):

* **epoch** = ``ceil(N_train / (n · batch_size))`` rounds: the rounds in which the nodes draw,
  together, as many samples as the training set holds. Each node reshuffles its own data when
  its pass ends, so nodes with more data see less than one local pass per epoch. For an
  asynchronous algorithm the same count of sweeps: n·batch_size samples a sweep, one pass over
  a node's data on average (a faster node makes more, a straggler less).
* **buffers**: by default (``gossip_buffers=False``) BatchNorm statistics stay local to each
  node and are not sent; the averaged model is evaluated with the average of the nodes'
  buffers. With ``gossip_buffers=True`` they are part of ``x``, compressed and mixed like the
  parameters (their gradient is 0).
* **evaluation** at every log: ``epoch``, ``time_per_epoch_s`` (wall time so far / epochs),
  ``lr``, ``train_loss`` = mean mini-batch loss of all nodes since the last log;
  ``test_loss`` / ``test_accuracy`` of the averaged model x̄ (node i evaluates slice i of the
  test set); ``worst_node_accuracy`` / ``mean_node_accuracy`` of the nodes' own models (each
  on the first ``node_eval_samples`` test samples, all by default). With
  ``eval_train=True`` also ``avg_model_train_loss`` / ``avg_model_train_accuracy``: x̄ on the
  whole training set (node i evaluates its own part) — the global objective f(x̄).

The initial model is the one given, identical on every node: build it from a seeded generator
(see ``experiments/train.py``) so that every MPI process builds the same; the trainer checks.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from gossip.algorithms import make_algorithm
from gossip.comm.world import World
from gossip.compress import Compressor
from gossip.core.algorithm import Algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError, DivergenceError
from gossip.rng import data_seed, generator, oracle_seed, partition_seed
from gossip.training import flat
from gossip.training.build import check_trainable, load_average, training_engine
from gossip.training.data import BatchStream, node_loader, partition_indices
from gossip.training.evaluate import Sums, evaluate, shard
from gossip.training.oracle import LossFn, ModelOracle, OptimizerOracle
from gossip.training.precision import HALF_DTYPES, MasterWeights, autocast_dtype, quantize_mode, wants_master_weights

SAME_START_FIX = ("build it after seeding torch identically on every process (e.g. "
                  "torch.manual_seed(seed) before the model)")

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]

log = logging.getLogger("gossip")


def epoch_rounds(train_size: int, nodes: int, batch_size: int) -> int:
    """Rounds per epoch: ``ceil(train_size / (nodes · batch_size))`` (at least 1); for a
    federated run ``nodes`` is clients per round × local steps (the batches a round draws)."""
    return max(1, math.ceil(train_size / (nodes * batch_size)))


def batches_per_round(algorithm: Any, n: int) -> int:
    """Mini-batches one round draws: one per node, or for a federated method (node 0 the
    server, no data) ``clients_per_round × local_steps`` (every client and one step for a
    method without them: CADA's workers each take one gradient a round)."""
    if not getattr(algorithm, "federated", False):
        return n
    steps = getattr(algorithm, "local_steps", 1)
    if not isinstance(steps, int):  # one K per client: their mean
        steps = sum(steps) / len(steps)
    return math.ceil((getattr(algorithm, "clients_per_round", None) or n - 1) * steps)


class _NoData:
    """The batches of a federated server, which holds no data: drawing one is a bug."""

    def __iter__(self) -> _NoData:
        return self

    def __next__(self) -> Any:
        raise ConfigError("the federated server (node 0) holds no data: only the clients compute "
                          "gradients")


class DecentralizedTrainer:
    """Train ``model`` on ``train_set`` split over the nodes of ``topology``.

    Args:
        model: the initial model (not modified; every node gets a copy).
        train_set: a map-style data set of ``(input, label)``.
        topology: a ``topologies`` topology, or a spec such as ``"ring"`` (then ``nodes``).
        algorithm: an :class:`~gossip.algorithms.Algorithm` or a registry name.
        compressor: compressor spec (``"topk:0.01"``, ``"sign"``, ``"module:Class"`` …) or a
            :class:`~gossip.compress.Compressor` instance (each node gets its own copy).
        optimizer: ``optimizer(params) -> torch.optim.Optimizer``, built once per node on its
            module's parameters; for D-PSGD, CHOCO-SGD, DeepSqueeze and PowerGossip. None: the
            algorithm's own ``x -= eta·g``.
        scheduler: ``scheduler(optimizer) -> LRScheduler``, stepped once per round.
        loss_fn: mean loss of a batch (default ``cross_entropy``).
        partition: ``iid``, ``sorted``, ``dirichlet:ALPHA``, or one index array per node.
        batch_size: mini-batch per node and round.
        test_set: evaluated at every log (optional).
        gossip_buffers: put float buffers (BatchNorm statistics) into the flat model.
        per_tensor: compress each tensor on its own (default, as the reference DL code);
            False compresses the flat vector as a whole.
        l2: weight decay added to the gradient for algorithms without an optimizer.
        seed: run seed (engine, partition, shuffling).
        nodes, world, device, dtype, network, overlap: as for :class:`Engine`.
        timeout, link_latency: set on ``world`` (detected when None): see
            :class:`~gossip.comm.world.World`.
        divergence_factor: the run stops with :class:`~gossip.errors.DivergenceError` when the
            logged train loss exceeds this times its first logged value, or anything logged is
            NaN/Inf. (The engine's own consensus-error rule is off: all nodes start equal, so
            the first consensus error is floating-point noise, no reference.)
        eval_batch_size: batch size of evaluations.
        node_eval_samples: test samples each node's own model is evaluated on (None: all).
        eval_train: also evaluate the averaged model on the training set at every log.
        autocast: ``"bf16"`` or ``"fp16"``: mixed precision, each node's forward and backward
            under ``torch.autocast`` in that type while ``x`` (the float32 master weights
            every compressor sends) and the optimizer state stay float32; fp16 with a dynamic
            loss scale (:mod:`gossip.training.precision`, docs/low-precision.md). Needs
            ``dtype=torch.float32``. Evaluations run in float32. None: off.
        quantize: ``"int8"`` or ``"int8-sr"``: 8-bit compute, each node's linear and convolution
            layers round their weights, input activations and output gradients to 256 min-max
            levels (``-sr``: activations and gradients stochastically, from a generator per
            node), while ``x`` and the optimizer state stay float32
            (:class:`~gossip.training.precision.QuantizedCompute`, docs/low-precision.md).
            Not with ``autocast``; evaluations run in full precision. None: off.
        master_weights: with a half-precision ``dtype`` (bfloat16, float16: the models are
            sent, mixed and run in it), each node's optimizer steps a float32 copy of its
            parameters (:class:`~gossip.training.precision.MasterWeights`; its state float32
            too) and the model follows it, rounded. None (default): on for half models with an
            optimizer; False: the optimizer steps the half parameters themselves.
        free_run: under mpiexec with one node per rank, wall seconds per virtual second of
            the ``network``'s compute draws: the run trains in wall-clock order (module doc).
    """

    def __init__(
        self,
        model: nn.Module,
        train_set: Dataset,
        *,
        topology: Any,
        algorithm: Algorithm | str | type[Algorithm] = "dpsgd",
        compressor: str | Compressor = "none",
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        loss_fn: LossFn | None = None,
        partition: str | Sequence[Sequence[int]] = "iid",
        batch_size: int = 32,
        test_set: Dataset | None = None,
        gossip_buffers: bool = False,
        per_tensor: bool = True,
        l2: float = 0.0,
        seed: int = 0,
        nodes: int | None = None,
        world: World | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        timeout: float = 120.0,
        network: str | None = None,
        overlap: bool = False,
        link_latency: float = 0.0,
        divergence_factor: float = 1e3,
        eval_batch_size: int = 1024,
        node_eval_samples: int | None = None,
        eval_train: bool = False,
        autocast: str | None = None,
        master_weights: bool | None = None,
        quantize: str | None = None,
        free_run: float | None = None,
    ):
        if isinstance(topology, str):
            import topologies

            topology = topologies.build(topology, nodes if nodes is not None else 8, seed=seed)
        self.topology = topology
        self.n = topology.n
        self.algorithm = make_algorithm(algorithm)
        check_trainable(self.algorithm, optimizer, scheduler)
        if batch_size < 1:
            raise ConfigError(f"batch_size = {batch_size}: give at least 1 sample per node")
        self.train_set, self.test_set = train_set, test_set
        self.batch_size = batch_size
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        self.gossip_buffers = gossip_buffers
        self.seed = seed
        self.device, self.dtype = torch.device(device), dtype
        autocast_dtype(autocast, dtype, self.device)  # refuse a bad combination before any work
        self.autocast = None if autocast == "none" else autocast
        self.quantize = quantize_mode(quantize, dtype, self.autocast)
        self.master_weights = wants_master_weights(master_weights, dtype, optimizer is not None,
                                                   self.algorithm.name)
        if dtype in HALF_DTYPES and optimizer is None:
            log.warning("%s steps the %s model itself (no local optimizer, so no float32 master "
                        "weights): steps below half a unit of its last place round away",
                        self.algorithm.name, dtype)
        self.eval_batch_size = eval_batch_size
        self.node_eval_samples = node_eval_samples
        self.eval_train = eval_train

        self.model = copy.deepcopy(model).to(device=self.device, dtype=dtype)
        self.layout = flat.layout_of(self.model, gossip_buffers)
        self.initial = flat.flatten(self.model, gossip_buffers)
        self.federated = bool(self.algorithm.federated)  # node 0 the server: it holds no data
        self.partition = self._split(partition)
        self.rounds_per_epoch = epoch_rounds(len(train_set),  # type: ignore[arg-type]
                                             batches_per_round(self.algorithm, self.n), batch_size)
        self._optimizer, self._scheduler, self._l2 = optimizer, scheduler, l2

        self.engine = training_engine(
            self.algorithm, topology, self.initial, self.layout, self._make_oracle,
            per_tensor=per_tensor, compressor=compressor, seed=seed,
            world=(world or World.detect(timeout=timeout, device=self.device)).configure(
                timeout=timeout, link_latency=link_latency),
            network=network, device=self.device, dtype=dtype, fix=SAME_START_FIX,
            overlap=overlap, free_run=free_run,
        )
        self._at_instant: dict[int, tuple[float, int, float | None]] = {}
        """An asynchronous free run's (loss sum, samples, lr) of this rank's node at the instant
        of each snapshot round (:meth:`node_metrics`)."""
        self.divergence_factor = divergence_factor
        self._first_loss: float | None = None
        self._eval_module = copy.deepcopy(self.model)
        self._eval_flat = self.initial.clone()
        flat.bind(self._eval_module, self._eval_flat, gossip_buffers)

    # -- construction --------------------------------------------------------------------------
    def _split(self, partition: str | Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One index array per node; federated: the data split over the clients 1..n−1 and
        none for the server."""
        holders = self.n - self.federated
        if isinstance(partition, str):
            parts = partition_indices(self.train_set, holders, partition, partition_seed(self.seed))
        else:
            parts = [np.sort(np.asarray(p, dtype=np.int64)) for p in partition]
            if len(parts) != holders or any(p.size == 0 for p in parts):
                raise ConfigError(
                    f"an explicit partition needs {holders} non-empty index arrays"
                    + (" (one per client)" if self.federated else "")
                    + f", got {[p.size for p in parts]}")
        return [np.empty(0, dtype=np.int64), *parts] if self.federated else parts

    def _make_oracle(self, i: int, _gen: torch.Generator) -> ModelOracle:
        module = copy.deepcopy(self.model)
        if self.federated and i == 0:  # the server's module (evaluated), never a gradient
            return ModelOracle(module, _NoData(), self.loss_fn, buffers=self.gossip_buffers)
        loader = node_loader(self.train_set, self.partition[i], self.batch_size,
                             generator(data_seed(self.seed, i)), dtype=self.dtype)
        stream = BatchStream(loader)
        rng = oracle_seed(self.seed, i)
        if self._optimizer is None:
            return ModelOracle(module, stream, self.loss_fn, buffers=self.gossip_buffers,
                               l2=self._l2, rng_seed=rng, autocast=self.autocast,
                               quantize=self.quantize)
        master = MasterWeights(flat.parameters(module)) if self.master_weights else None
        opt = self._optimizer(master.params if master is not None else flat.parameters(module))
        sched = self._scheduler(opt) if self._scheduler is not None else None
        return OptimizerOracle(module, stream, opt, sched, self.loss_fn,
                               buffers=self.gossip_buffers, rng_seed=rng, autocast=self.autocast,
                               quantize=self.quantize, master=master, schedule_by_round=self.algorithm.asynchronous)

    # -- running -------------------------------------------------------------------------------
    @property
    def round(self) -> int:
        return self.engine.round

    @property
    def is_root(self) -> bool:
        """True on the process that should print and write files (rank 0; always in process)."""
        return self.engine.world.is_root

    @property
    def epoch(self) -> float:
        return self.engine.round / self.rounds_per_epoch

    def fit(
        self,
        epochs: float | None = None,
        *,
        rounds: int | None = None,
        eval_every: float = 1.0,
        log_every: int | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        progress: bool = False,
    ) -> list[dict[str, Any]]:
        """Train for ``epochs`` (or ``rounds``); evaluate every ``eval_every`` epochs (or every
        ``log_every`` rounds) and at the end. Returns the round records (collective)."""
        if rounds is None:
            if epochs is None:
                raise ConfigError("fit() needs how long to train: give epochs=... or rounds=...")
            rounds = max(1, math.ceil(epochs * self.rounds_per_epoch - 1e-9))
        if log_every is None:
            log_every = max(1, round(eval_every * self.rounds_per_epoch))
        return self.engine.run(rounds, log_every=log_every, metrics=[self.metrics],
                               on_record=on_record, progress=progress)

    def summary(self) -> dict[str, Any]:
        """The engine's summary plus ``epochs`` and ``seconds_per_epoch``."""
        s = self.engine.summary()
        epochs = self.engine.round / self.rounds_per_epoch
        s["epochs"] = epochs
        s["seconds_per_epoch"] = s["wall_time_s"] / epochs if epochs else float("nan")
        return s

    # -- evaluation (collective: every process calls these together) -----------------------------
    @property
    def _free(self) -> bool:
        """An asynchronous free run: records made after the run from snapshots."""
        return self.engine.network.runs_free

    def node_metrics(self, node: int, x: torch.Tensor) -> dict[str, float]:
        """What an asynchronous free run's snapshot keeps of this rank's node (a
        :data:`~gossip.network.freerun.NodeMetric`, called during the run at each instant):
        its mean train loss since the last instant (NaN without a step) and its learning rate
        (NaN without an optimizer), also kept here for :meth:`metrics`, which makes the
        instant's record after the run."""
        oracle = self.engine.nodes[node].oracle
        lr = oracle.lr if isinstance(oracle, OptimizerOracle) else None
        free = self.engine.network.last_free_run
        rnd = free.snapshot_round if free is not None else None
        if rnd is None:  # the names' probe before the start: nothing taken
            loss, count = float(oracle.loss_sum), oracle.loss_count
        else:
            loss, count = oracle.pop_loss()
            self._at_instant[rnd] = (loss, count, lr)
        return {"train_loss": loss / count if count else float("nan"),
                "lr": float("nan") if lr is None else lr}

    def metrics(self, engine: Engine, xbar: torch.Tensor) -> dict[str, Any]:
        """The training metrics of a log record (see the module docstring)."""
        epoch = engine.round / self.rounds_per_epoch
        rec: dict[str, Any] = {"epoch": epoch}
        free = self._free
        if epoch > 0 and not free:  # a free run's records carry wall_s instead
            rec["time_per_epoch_s"] = engine.summary()["wall_time_s"] / epoch
        nodes = engine.nodes
        kept = self._at_instant.pop(engine.round, None) if free else None
        lr = None
        if kept is not None:  # a free run's snapshot: the loss and rate at its instant
            popped = {i: kept[:2] for i in nodes}
            lr = kept[2]
        else:
            popped = {i: nd.oracle.pop_loss() for i, nd in nodes.items()}
        loss = engine.node_values({i: p[0] for i, p in popped.items()})
        count = engine.node_values({i: float(p[1]) for i, p in popped.items()})
        total = math.fsum(count.tolist())
        rec["train_loss"] = math.fsum(loss.tolist()) / total if total else None
        self._check_loss(engine, rec["train_loss"])
        first = nodes[min(nodes)].oracle
        if isinstance(first, OptimizerOracle):
            rec["lr"] = first.lr if lr is None else lr
        if self.test_set is None and not self.eval_train:
            return rec
        avg = self._load_average(xbar)
        if self.test_set is not None:
            n_test = len(self.test_set)  # type: ignore[arg-type]
            sums = self._gather({i: self._eval(avg, self.test_set, shard(n_test, self.n, i))
                                 for i in nodes})
            rec["test_loss"], rec["test_accuracy"] = sums.mean_loss, sums.accuracy
            limit = self.node_eval_samples
            idx = np.arange(n_test if limit is None else min(n_test, limit))
            acc = engine.node_values(
                {i: self._eval(nd.oracle.module, self.test_set, idx).accuracy
                 for i, nd in nodes.items()})
            rec["worst_node_accuracy"] = float(acc.min())
            rec["mean_node_accuracy"] = math.fsum(acc.tolist()) / self.n
        if self.eval_train:
            sums = self._gather({i: self._eval(avg, self.train_set, self.partition[i])
                                 for i in nodes})
            rec["avg_model_train_loss"] = sums.mean_loss
            rec["avg_model_train_accuracy"] = sums.accuracy
        return rec

    def _check_loss(self, engine: Engine, value: float | None) -> None:
        if value is None:
            return
        oracles = [nd.oracle for nd in engine.nodes.values()]
        if self._first_loss is None:  # after a resume, the reference comes from the checkpoint
            self._first_loss = oracles[0].loss_reference
        if self._first_loss is None and math.isfinite(value) and value > 0:
            self._first_loss = value
            for oracle in oracles:
                oracle.loss_reference = value
        ref = self._first_loss
        if not math.isfinite(value) or (ref is not None and value > self.divergence_factor * ref):
            why = f" exceeds {self.divergence_factor:g} x its first value {ref:.3g}" if ref else ""
            raise DivergenceError(
                f"round {engine.round}: train loss {value:.3g}{why}: the run diverged. Lower the "
                "learning rate or the consensus step gamma.",
                round=engine.round,
            )

    def average_model(self) -> nn.Module:
        """A copy of the averaged model x̄ (with averaged buffers unless they are gossiped)."""
        return copy.deepcopy(self._load_average(self.engine.mean_model()))

    def node_model(self, i: int) -> nn.Module:
        """Node ``i``'s own module (a live view of its flat model; local nodes only)."""
        return self.engine.nodes[i].oracle.module

    def evaluate_average(self, dataset: Dataset) -> Sums:
        """Loss and accuracy sums of x̄ on ``dataset`` (split over the nodes, gathered)."""
        avg = self._load_average(self.engine.mean_model())
        n = len(dataset)  # type: ignore[arg-type]
        return self._gather({i: self._eval(avg, dataset, shard(n, self.n, i))
                             for i in self.engine.nodes})

    def global_train_loss(self) -> float:
        """f(x̄): the averaged model's mean loss on the whole training set."""
        avg = self._load_average(self.engine.mean_model())
        return self._gather({i: self._eval(avg, self.train_set, self.partition[i])
                             for i in self.engine.nodes}).mean_loss

    def _load_average(self, xbar: torch.Tensor) -> nn.Module:
        modules = {i: nd.oracle.module for i, nd in self.engine.nodes.items()}
        return load_average(self.engine, xbar, self._eval_module, self._eval_flat, modules,
                            self.gossip_buffers)

    def _eval(self, module: nn.Module, dataset: Dataset, indices: np.ndarray) -> Sums:
        return evaluate(module, dataset, indices, loss_fn=self.loss_fn,
                        batch_size=self.eval_batch_size, device=self.device, dtype=self.dtype)

    def _gather(self, per_node: dict[int, Sums]) -> Sums:
        values = self.engine.node_values
        loss = values({i: s.loss for i, s in per_node.items()})
        correct = values({i: s.correct for i, s in per_node.items()})
        count = values({i: float(s.count) for i, s in per_node.items()})
        return Sums(math.fsum(loss.tolist()), math.fsum(correct.tolist()),
                    int(round(math.fsum(count.tolist()))))
