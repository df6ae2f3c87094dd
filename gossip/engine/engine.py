"""The engine: hosts this process's nodes as one :class:`~gossip.core.block.Block`, runs
the algorithm's round on it, moves each phase's messages through the transport, logs metrics.

Each round the algorithm's :meth:`~gossip.algorithms.Algorithm.step` generator runs over the
block; every ``yield`` hands a phase's message rows to the transport (local receivers read
them in place, remote ones get MPI messages) and resumes with them exchanged. Neighbors are
always visited in sorted order and metrics are reduced in node order, so a run gives the same
numbers in one process and under ``mpiexec`` for the same seed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gossip.comm.world import World
from gossip.compress import Compressor, dispatch, factory_for
from gossip.core.algorithm import Algorithm
from gossip.core.block import Block, StaticPhase
from gossip.core.cache import IdentityCache
from gossip.core.nodes import Node, NodeMap, NodeRows, NodeShared
from gossip.core.registry import REGISTRY
from gossip.core.routing import MixPlan
from gossip.core.staging import Rows
from gossip.errors import (
    CompressionError,
    ConfigError,
    ContractError,
    DivergenceError,
    GossipError,
    NodeError,
    RowsError,
)
from gossip.layout import Layout
from gossip.metrics import consensus_error, oracle_fields
from gossip.network import Network, NodeMetric, build
from gossip.rng import node_seeds
from gossip.stateful import Stateful

log = logging.getLogger(__name__)

_set_grad_enabled = torch._C._set_grad_enabled  # what torch.no_grad() sets and restores

Metric = Callable[["Engine", torch.Tensor], dict[str, Any]]


class Engine:
    """Runs ``algorithm`` on every node of ``topology`` hosted by this process.

    Args:
        algorithm: the per-node algorithm (its hyper-parameters already set).
        topology: a ``topologies.Topology`` or ``TimeVaryingTopology``.
        x0: initial model of node i, as ``x0(i) -> Tensor`` or a mapping; flattened. A tensor
            of every node's rows (``x0[i]`` node i's, shape [n, ...]) is taken whole, without
            a step per node (what 10⁶ nodes want).
        compressor: a registry spec (``"topk:0.01"``, ``"module:Class:PARAMS"``) or a
            :class:`~gossip.compress.Compressor` instance; every node (and every extra message
            stream of a node) gets its own copy, so stateful ones keep separate state.
        layout: shapes packed in the flat model (default: one flat vector); low-rank
            compressors and PowerGossip work per matrix-shaped tensor of the layout.
        oracles: ``oracles(i, generator) -> oracle`` giving node i's gradients, or None. One
            that also has ``rows(ids)`` (a problem's :meth:`~gossip.problems.base.Problem.oracles`)
            is asked for the block's oracles as one object first; where it gives one, no node
            is made before it is read (10⁶ nodes start in seconds).
        seed: the run seed; node generators and the nodes' and edges' random streams
            (:mod:`gossip.rng`) derive from it.
        world: the processes and how their messages travel (default: detected; in process
            without mpiexec): its ``timeout`` bounds every wait for a neighbor, its
            ``link_latency`` delays every phase (:class:`~gossip.comm.world.World`).
        divergence_factor: a watched metric above this times its first positive value (or
            non-finite) stops the run with :class:`DivergenceError`.
        watch: metrics watched besides ``consensus_error`` (e.g. ``distance_to_optimum``).
        network: what messages meet on their way (a :class:`~gossip.network.Network` or its
            ``--network`` spec, e.g. ``"loss=0.1"``; default: an ideal network). Lost messages
            are neither sent nor received and mix as the algorithm's
            :attr:`~gossip.algorithms.Algorithm.on_loss` says (docs/network.md). With timing
            models (``delay=``, ``compute=``, ``slow=``) the rounds keep a virtual clock and
            records gain ``time_virtual_s``; ``churn=`` is refused (asynchronous runs only).
            ``stale=`` makes messages arrive whole rounds late (:mod:`gossip.network.stale`),
            ``noise=`` adds Gaussian noise to every delivered message's decoded values
            (:mod:`gossip.network.noise`), ``active=`` lets only the round's active nodes
            compute and communicate (:mod:`gossip.network.activity`).
            The engine holds it as :attr:`network`, the run's :class:`gossip.network.Simulator`.
        overlap: compute the next round's gradients while this round's messages travel
            (algorithms whose :attr:`~gossip.algorithms.Algorithm.overlaps` is set; the same
            numbers, less wall time when messages are slow; docs/overlap.md).
        free_run: under mpiexec with one node per rank, this many wall seconds per virtual
            second of compute time (the ``compute=``/``slow=`` draws). An asynchronous
            algorithm runs free, in wall-clock order (:mod:`gossip.network.freerun`); a
            synchronous one keeps its rounds and sleeps each round's compute draw before
            sending, its records gaining ``wall_s`` (:mod:`gossip.network.clock`). None
            (default): virtual time only (the event loop, the same on every rank; the rounds'
            clock).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        topology: Any,
        x0: Callable[[int], torch.Tensor] | Mapping[int, torch.Tensor] | torch.Tensor,
        *,
        compressor: str | Compressor = "none",
        layout: Layout | None = None,
        oracles: Callable[[int, torch.Generator], Any] | None = None,
        seed: int = 0,
        world: World | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        divergence_factor: float = 1e6,
        watch: tuple[str, ...] = (),
        network: Network | str | None = None,
        overlap: bool = False,
        defer_setup: bool = False,
        free_run: float | None = None,
    ):
        self.algorithm = algorithm
        self.topology = topology
        self.n = topology.n
        self.seed = seed
        self.world = world or World.detect(device=device)
        self.device = torch.device(device)
        self.dtype = dtype
        self.divergence_factor = divergence_factor
        self._new_compressor = factory_for(compressor, layout)
        self.network = build(network, algorithm=algorithm, topology=topology, seed=seed,
                             free_run=free_run)
        """What messages and nodes meet: loss, lateness, clocks, asynchronous runs
        (:class:`gossip.network.Simulator`)."""
        self.overlap = overlap
        self._check_config(oracles)
        self.local_ids = self.world.local_nodes(self.n)
        self.transport = self.world.transport(self.n)
        if self.world.link_latency and algorithm.asynchronous:
            raise ConfigError(f"--link-latency delays real messages of rounds; {algorithm.name} runs "
                              "in virtual time: give its messages a delay with --network "
                              "delay=SECONDS (docs/network.md)")
        tic = time.perf_counter()
        self._shared = NodeShared(topology.at_round(1), seed, self.device, self._new_compressor)
        with _no_cyclic_gc():  # 10^6 new objects would start ever longer collections
            x_rows = self._initial_rows(x0, layout)
            self.nodes: NodeMap = self._new_nodes(x_rows, oracles)
            """The local nodes by id (each :class:`Node` made when first read)."""
        self._check_compressor(compressor, x_rows)
        self.round = 0
        self._open: _Round | None = None  # the round in flight (begin_round .. end_round)
        self._seq = 0
        self.compute_s = 0.0
        self.comm_s = 0.0
        self._start = time.perf_counter()
        self._reference: dict[str, float] = {}
        self.oracle_counts: bool | None = None
        """Whether the nodes' oracles count their calls (any node on any process), settled at
        the first record (:func:`gossip.metrics.oracle_fields`)."""
        self.watch = ["consensus_error", *watch]
        self._plans = IdentityCache()
        self._last_plan: tuple[Any, MixPlan] | None = None
        self._static: StaticRound | None = None  # the round to replay (StaticRound), if any
        self.block = self._new_block(x_rows)
        del x_rows
        self._shared.block = self.block
        algorithm.validate_block(self.block)
        self.network.attach(self)
        self.is_set_up = False
        self.timings: dict[str, float] = {"nodes_s": time.perf_counter() - tic}
        """Wall seconds of the run's parts before its rounds (``nodes_s``: nodes and block,
        ``setup_s``: the algorithm's setup) and of its first round (``first_round_s``), which
        pays the kernels' warm-up: :meth:`summary` reports the rounds after it apart."""
        self._rounds_timed = 0  # rounds this process ran (a resumed run counts from its restart)
        self._steady_s = 0.0  # wall seconds of those after the first
        self._record_s = 0.0  # wall seconds in record() (metrics, collective)
        self._round_tic = 0.0
        if not defer_setup:
            self.setup()

    @torch.no_grad()
    def setup(self, stand_in: bool = False) -> None:
        """The algorithm's setup (its state; some take the nodes' first gradients here), once
        before round 1: at construction, or with ``defer_setup`` when :func:`gossip.wrap`'s first
        ``opt.step()`` has the gradients (:meth:`begin_round` calls it if nobody did).
        ``stand_in``: zeros instead of gradients, for a setup whose state a checkpoint is about
        to overwrite."""
        if self.is_set_up:
            return
        tic = time.perf_counter()
        block = self.block
        block.begin_round(0, self._plan(self.topology.at_round(1)))  # setup may route (arc_plan)
        with block.stand_in_gradients(stand_in):
            self.algorithm.setup(block)
        _check_state(self.algorithm, block)
        block.check_arc_state()  # (each node's views of it are made when asked: node.state)
        self.network.setup()
        self.is_set_up = True
        self.timings["setup_s"] = time.perf_counter() - tic

    @property
    def hparams(self) -> dict[str, Any]:
        """The run's hyper-parameters as resolved at setup (the constructor's values with the
        defaults the algorithm derived from the compressor and graph)."""
        return dict(self.block.hparams)

    def _new_nodes(self, x_rows: _InitialRows, oracles: Any) -> NodeMap:
        """The local nodes: per node only what cannot be shared or deferred (its oracle and,
        for it, its generator); without oracles no node object is made before it is read."""
        rows = NodeRows(self.local_ids, x_rows.layouts, self._shared)
        if oracles is None:
            return NodeMap(rows)
        whole = getattr(oracles, "rows", None)  # a problem's factory (Problem.oracles)
        group = whole(self.local_ids) if callable(whole) and self.local_ids else None
        if group is not None:  # every node's oracle in one object: no node made before read
            rows.serve(group)
            self._check_problem(group.problem, self.local_ids[0])
            return NodeMap(rows)
        seeds = node_seeds(self.seed, self.local_ids)
        for r, i in enumerate(self.local_ids):
            gen = torch.Generator(device=self.device)  # the oracle factory takes it now
            gen.manual_seed(int(seeds[r]))
            node = Node(i, r, x_rows.layout(r), self._shared, generator=gen,
                        oracle=oracles(i, gen))
            rows.put(r, node)
            self._check_oracle(node)
        return NodeMap(rows)

    def _initial_rows(self, x0: Any, layout: Layout | None) -> _InitialRows:
        """Each local node's initial model (flattened, in the run's dtype) and layout, checked;
        nodes of one size share one flat layout. A tensor of every node's rows (``x0[i]`` is
        node i's) is taken whole: no per-node step at all."""
        ids = self.local_ids
        if isinstance(x0, torch.Tensor) and x0.dim() >= 2 and x0.shape[0] == self.n and ids:
            rows = x0.detach()[ids[0] : ids[-1] + 1] if ids == list(range(ids[0], ids[-1] + 1)) \
                else x0.detach()[torch.tensor(ids)]
            rows = rows.reshape(len(ids), -1).to(self.device, self.dtype)
            lay = layout or Layout.flat(rows.shape[1])
            if lay.numel != rows.shape[1]:
                raise ConfigError(f"layout {lay} holds {lay.numel} entries, node {ids[0]}'s x has "
                                  f"{rows.shape[1]}", node=ids[0])
            return _InitialRows(stacked=rows, layouts=[lay])
        out, layouts, flat = [], [], {}
        device, dtype = self.device, self.dtype
        for i in ids:
            x = x0(i) if callable(x0) else x0[i]
            if x.requires_grad:  # (each torch call skipped is a second at 10^6 nodes)
                x = x.detach()
            if x.dtype != dtype or x.device != device:
                x = x.to(device, dtype)
            if x.dim() != 1:
                x = x.reshape(-1)
            numel = x.shape[0]
            lay = layout
            if lay is None:
                lay = flat.get(numel)
                if lay is None:
                    lay = flat[numel] = Layout.flat(numel)
            if lay.numel != numel:
                raise ConfigError(f"layout {lay} holds {lay.numel} entries, node {i}'s x has "
                                  f"{numel}", node=i)
            out.append(x)
            layouts.append(lay)
        return _InitialRows(rows=out, layouts=layouts)

    def _check_compressor(self, spec: Any, x_rows: _InitialRows) -> None:
        """A spec that cannot fit the models (top-k with k > d) is refused before round 1: one
        check per model size (every node's compressor is a copy of the same spec)."""
        for r, x in x_rows.one_per_size():
            try:
                self._new_compressor().max_nbytes(x)
            except CompressionError as exc:
                i = self.local_ids[r]
                raise ConfigError(f"compressor '{spec}' cannot compress node {i}'s model of "
                                  f"{x.numel()} entries: {exc}", node=i) from None

    def _new_block(self, x_rows: _InitialRows) -> Block:
        """The local nodes as rows of one [m, d] tensor (each node's ``x`` reads its row)."""
        block = Block(self.nodes.rows, None, self._new_compressor(), self._new_compressor, seed=self.seed,
                      topology=self.topology, hparams=self.algorithm.hparams())
        x = block.message_tensor(x_rows.d, self.dtype, self.device)  # sent as it is by 'none'
        x_rows.copy_into(x)
        block.x = x  # (node.x reads its row of it)
        return block

    def _plan(self, topo: Any) -> MixPlan:
        """The block's routing for a round's topology (cached per topology object; a static
        graph's comes back every round)."""
        last = self._last_plan
        if last is not None and last[0] is topo:
            return last[1]
        plan = self._plans.get(topo, lambda: MixPlan.build(topo, self.block.ids,
                                                           self.transport.is_local, self.device))
        self._last_plan = (topo, plan)
        return plan

    def _check_oracle(self, node: Node) -> None:
        """Refuse a problem whose gradients come in another dtype or device than the models
        (they would fail in round 1 inside a torch kernel)."""
        problem = getattr(node.oracle, "problem", None)
        if problem is not None:
            self._check_problem(problem, node.id)

    def _check_problem(self, problem: Any, node: int) -> None:
        """:meth:`_check_oracle` for the ``problem`` behind node ``node``'s oracle."""
        device = torch.device(problem.device)
        same_device = device.type == self.device.type and (
            device.index is None or self.device.index is None or device.index == self.device.index)
        for what, have, want, same in (("dtype", problem.dtype, self.dtype, problem.dtype == self.dtype),
                                       ("device", device, self.device, same_device)):
            if not same:
                raise ConfigError(
                    f"node {node}'s gradient oracle computes in {what} {have} (its problem's) but "
                    f"the models are {want}: build the problem with {what}={want} or run the engine "
                    f"with {what}={have} (the scripts' --{what} sets both)", node=node)

    def _check_config(self, oracles: Any) -> None:
        """Refuse, before any message, what this algorithm cannot run on: its
        :attr:`~gossip.algorithms.Algorithm.requires`, then its own ``validate``."""
        alg, topo, compressor = self.algorithm, self.topology, self._new_compressor()
        alg.requires.check(topo, compressor, oracles is not None, name=alg.name)
        alg.validate(topo, compressor)
        if alg.asynchronous and self.overlap:
            raise ConfigError(f"--overlap hides a round's messages behind the next gradients; "
                              f"{alg.name} is asynchronous (no rounds): its nodes never wait for "
                              "messages anyway; run it without --overlap")
        if self.overlap and self.network.model.partial:
            raise ConfigError(f"--overlap computes every node's next gradient ahead; with "
                              f"--network {self.network.model.spec()} a node may sleep that "
                              "round: run it without --overlap")
        if self.overlap and not (alg.overlaps and oracles is not None):
            able = sorted(name for name, cls in REGISTRY.items() if cls.overlaps)
            raise ConfigError(
                f"--overlap: {alg.name} " + ("has no gradients to compute while its messages "
                                             "travel (no problem or model)" if alg.overlaps else
                                             "changes x after its messages are sent, so the next "
                                             "gradient cannot be computed while they travel")
                + f"; it applies to {', '.join(able)} (docs/overlap.md)")

    # -- rounds ----------------------------------------------------------------------------
    def step(self, prefetch: bool = False) -> None:
        """Run one round on every local node (under no_grad: oracles that need autograd enable it).

        ``prefetch``: while the round's first phase travels, compute the next round's
        gradients at x as it then stands (``overlap``: :meth:`run` asks it for every round
        but those that end in a log, a checkpoint or the run's end, where the next round's
        mini-batches must not be drawn yet). For an asynchronous algorithm a "round" is a
        sweep: the events up to n more activations (:mod:`gossip.network.events`)."""
        grad = torch.is_grad_enabled()
        if not grad:
            return self._step(prefetch)
        _set_grad_enabled(False)  # no_grad's effect without its objects (µs a round)
        try:
            return self._step(prefetch)
        finally:
            _set_grad_enabled(True)

    def _step(self, prefetch: bool) -> None:
        if self.algorithm.asynchronous:
            self.setup()
            tic = self._round_tic = time.perf_counter()
            self.network.sweep(self.round + 1)
            self.compute_s += time.perf_counter() - tic
            self.round += 1
            self._round_timed()
            return
        static = self._static
        if static is not None and not prefetch and self._replay(static):
            return
        self._begin_round()  # (under this no_grad: entering it again costs µs a round)
        if prefetch and self._open is not None:  # the next round's gradients while they travel
            tic = time.perf_counter()
            self.block.prefetch_gradients(self.algorithm.name)
            self.compute_s += time.perf_counter() - tic
        self._end_round()

    @torch.no_grad()
    def begin_round(self) -> None:
        """Run the next round up to its first phase's messages being posted, and return while
        they travel: work done before :meth:`end_round` overlaps them (for algorithms with
        :attr:`~gossip.algorithms.Algorithm.overlaps`, x is then final for the round). A
        round without messages ends here."""
        self._begin_round()

    def _begin_round(self) -> None:
        if self._open is not None:
            raise ContractError(f"round {self.round + 1} is in flight: end_round() it first")
        if self.algorithm.asynchronous:
            raise ContractError(f"{self.algorithm.name} is asynchronous: it has no round to begin; "
                                "call step(), which runs a sweep of its events")
        if not self.is_set_up:
            self.setup()
        self._round_tic = time.perf_counter()
        t = self.round + 1
        topo = self.topology.at_round(t)
        self._shared.topology = topo  # what the nodes' views read (node.round reads the block's)
        block = self.block
        block.begin_round(t, self._plan(topo))
        self.network.prepare_round(t)  # (partial activation: who computes this round)
        tic = time.perf_counter()
        gen = self.algorithm.step(block)
        msg = self._advance(gen, None)
        self.network.begin_round(t)  # (a wall-clock round sleeps its compute draw here)
        self.compute_s += time.perf_counter() - tic
        self._open = _Round(t, topo, gen)
        self._post(msg)

    @torch.no_grad()
    def end_round(self) -> None:
        """Wait for the messages :meth:`begin_round` posted and finish the round (its later
        phases included); nothing when no round is in flight."""
        self._end_round()

    def _end_round(self) -> None:
        rnd = self._open
        if rnd is None:
            return
        while rnd.pending is not None:
            tic = time.perf_counter()
            self.transport.finish_rows(rnd.pending)
            toc = time.perf_counter()
            self.comm_s += toc - tic
            phase, msg = rnd.phase, rnd.msg
            self.network.arrived(phase, rnd.t, rnd.phases - 1)  # late ones held at the receivers
            msg = self._advance(rnd.gen, phase, phase.parts if phase is not msg else phase)
            self.compute_s += time.perf_counter() - toc
            self._post(msg)
        self._open = None
        self.round = rnd.t
        self.network.end_round()
        self._static = StaticRound.record(self, rnd)
        self._round_timed()

    def _replay(self, static: StaticRound) -> bool:
        """Run the next round from ``static``, the round before it as recorded (see
        :class:`StaticRound`), when its guards hold; False (nothing run) when they do not. The
        algorithm's round runs as always, the block answering its recorded calls; a call that
        is not the recorded one continues the round the generic way."""
        t = self.round + 1
        topo = self.topology.at_round(t)
        if not static.holds(self, topo):
            self._static = None
            return False
        self._round_tic = tic = time.perf_counter()
        self._shared.topology = topo
        block = self.block
        block.begin_round(t, static.plan)
        block.replay = phase = static.phase
        try:
            gen = self.algorithm.step(block)
            msg = self._advance(gen, None)
            if msg is None or msg is not phase.rows:  # not the recorded phase: the generic way
                self._static = None
                self.compute_s += time.perf_counter() - tic
                self._open = _Round(t, topo, gen)
                self._post(msg)
                self._end_round()
                return True
            self._seq += 1
            toc = time.perf_counter()
            self.compute_s += toc - tic
            transport, again = self.transport, static.again
            handles = transport.post_again(again, self._seq)
            transport.finish_again(again, handles, t)
            tic = time.perf_counter()
            self.comm_s += tic - toc
            msg = self._advance(gen, phase.rows, phase.rows)
            self.compute_s += time.perf_counter() - tic
            if block.replay is not phase:  # the block left the record for a call of its own
                self._static = None
        finally:
            block.replay = None
        if msg is not None:  # a second phase: the round goes on the generic way
            self._static = None
            self._open = _Round(t, topo, gen, phases=1)
            self._post(msg)
            self._end_round()
            return True
        self.round = t
        self._round_timed()
        return True

    def _round_timed(self) -> None:
        """Book the round just ended: the first this process runs (numba's compilation, the
        kernels' first touch of their buffers) apart from the steady ones after it."""
        took = time.perf_counter() - self._round_tic
        if self._rounds_timed == 0:
            self.timings["first_round_s"] = took
        else:
            self._steady_s += took
        self._rounds_timed += 1

    def progress(self) -> None:
        """Let the round's messages in flight move (MPI moves bytes only inside its calls):
        for work that overlaps them, called between its pieces (:func:`gossip.wrap`'s
        backward hooks)."""
        if self._open is not None:
            self.transport.progress()

    @property
    def in_round(self) -> bool:
        """A round's messages are in flight (between :meth:`begin_round` and :meth:`end_round`)."""
        return self._open is not None

    def _post(self, msg: Any) -> None:
        """Post the phase the round yielded (``None``: the round has no more phases)."""
        rnd = self._open
        if msg is None:
            rnd.pending = None
            return
        tic = time.perf_counter()
        # several messages yielded together travel as one (their parts come back)
        phase = self.block.pack(list(msg)) if isinstance(msg, (tuple, list)) else msg  # noqa: UP038
        self._seq += 1
        self.network.send(phase, rnd.topo, rnd.t, rnd.phases)  # lost messages: neither sent nor mixed
        rnd.phases += 1
        rnd.phase, rnd.msg = phase, msg
        rnd.pending = self.transport.start_rows(phase, phase.route, self._seq, rnd.t)
        self.comm_s += time.perf_counter() - tic

    def _advance(self, gen, received: Rows | None, reply: Any = None) -> Any:
        """Run the round to its next phase (after checking the rows ``received`` from other
        processes, and sending ``reply`` into the round); an error comes out as a
        :class:`NodeError` or :class:`DivergenceError` naming the node, its rank, the round and
        (for a refused message) the sender."""
        block = self.block
        try:
            if received is None:
                return next(gen)
            block.check_received(received)
            return gen.send(reply)
        except StopIteration:
            return None
        except Exception as exc:
            t, rank = block.round, self.world.rank
            bad = (~torch.isfinite(block.x)).any(dim=1).nonzero()
            if bad.numel():
                i = block.ids[int(bad[0])]
                raise DivergenceError(
                    f"round {t}: node {i} (rank {rank}) has NaN/Inf in x: the run diverged "
                    f"({exc}). Lower the step sizes (gamma, eta).", round=t, node=i, rank=rank,
                ) from exc
            if isinstance(exc, RowsError) and exc.sender == exc.receiver:
                raise NodeError(
                    f"round {t}: node {exc.sender} (rank {rank}) sent a message its own decoder "
                    f"refuses: {exc.__cause__ or exc}", round=t, node=exc.sender, rank=rank,
                    sender=exc.sender, receiver=exc.receiver,
                ) from exc
            if isinstance(exc, RowsError):
                raise NodeError(
                    f"round {t}: node {exc.receiver} (rank {rank}) refused the message from node "
                    f"{exc.sender} (rank {self.transport.placement[exc.sender]}): "
                    f"{exc.__cause__ or exc}", round=t, node=exc.receiver, rank=rank,
                    sender=exc.sender, receiver=exc.receiver,
                ) from exc
            if isinstance(exc, GossipError):
                raise NodeError(f"round {t}: rank {rank}: {exc}", round=t, rank=rank,
                                node=exc.node) from exc
            raise NodeError(
                f"round {t}: the block of nodes {_span(block.ids)} (rank {rank}) failed: {exc}",
                round=t, rank=rank,
            ) from exc

    # -- metrics ---------------------------------------------------------------------------
    def mean_model(self) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i, summed in node order (identical on every process); for a
        federated algorithm the server's (node 0's) model, the run's model."""
        if self.algorithm.federated:  # node 0's x plus zeros: exactly x_0 on every process
            return self.world.ordered_sum(
                {i: nd.x if i == 0 else torch.zeros_like(nd.x) for i, nd in self.nodes.items()})
        return self.world.ordered_sum({i: nd.x for i, nd in self.nodes.items()}).div_(self.n)

    def node_values(self, local: Mapping[int, Any], width: int = 0) -> Any:
        """Gather one float per node (indexed by node id) on every process; ``width`` > 0:
        ``width`` floats per node, as an ``[n, width]`` array."""
        return self.world.node_values(self.n, local, width=width)

    def bytes_sent(self) -> Any:
        """Cumulative bytes handed to the transport by each node (indexed by node id)."""
        sent = self.transport.bytes_sent
        return self.node_values({i: float(sent.get(i, 0)) for i in self.nodes})

    def record(self, metrics: list[Metric] = ()) -> dict[str, Any]:
        """One log record of the current round (collective: every process must call it)."""
        tic = time.perf_counter()
        try:
            return self._record(metrics)
        finally:
            self._record_s += time.perf_counter() - tic

    def _record(self, metrics: list[Metric]) -> dict[str, Any]:
        xbar = self.mean_model()
        error = consensus_error(self, xbar)
        bits = self.bytes_sent() * 8
        rec: dict[str, Any] = {
            "type": "round",
            "round": self.round,
            "consensus_error": error,
            "bits_per_node": float(bits.mean()),
            "bits_per_node_max": float(bits.max()),
        }
        if self.algorithm.federated:  # the server sends only downlinks, the clients only uplinks
            rec["bits_up_per_client"] = float(bits[1:].mean())
            rec["bits_down_per_client"] = float(bits[0]) / (self.n - 1)
        if self.algorithm.counts:  # the algorithm's per-node counters, summed over the nodes
            ids, state = self.block.ids, self.block.state
            rec.update(self.algorithm.log_fields({
                key.rsplit(".", 1)[-1]: float(self.node_values(
                    {i: float(state[key][r]) for r, i in enumerate(ids)}).sum())
                for key in self.algorithm.counts}))
        rec.update(oracle_fields(self))
        rec.update(self.network.fields())
        for metric in metrics:
            rec.update(metric(self, xbar))
        rec.update(
            time_s=self.elapsed_s(),
            compute_s=self.compute_s,
            comm_s=self.comm_s,
        )
        self.network.after_record()  # a wall clock's restart, the record's time taken out
        self._check_divergence(rec, noise=1e-12 * float(torch.sum(xbar * xbar)))
        return rec

    def _check_divergence(self, rec: dict[str, Any], noise: float = 0.0) -> None:
        """Stop on a non-finite metric, or one past ``divergence_factor`` × its first value.

        The reference is the first value above rounding noise (``noise`` ~ 1e-12 ‖x̄‖²), so a
        run whose nodes start equal is not judged against a floating-point residue.
        """
        for key in self.watch:
            value = rec.get(key)
            if value is None:
                continue
            ref = self._reference.get(key)
            floor = noise if key == "consensus_error" else 0.0
            if ref is None and value > floor and math.isfinite(value):
                self._reference[key] = ref = value
            if not math.isfinite(value) or (ref is not None and value > self.divergence_factor * ref):
                raise DivergenceError(
                    f"round {self.round}: {key} = {value:.3g}"
                    + (f" exceeds {self.divergence_factor:g} x its first value {ref:.3g}" if ref else "")
                    + ": the run diverged. Lower the consensus step gamma (or eta).",
                    round=self.round,
                )

    def run(
        self,
        rounds: int,
        *,
        log_every: int = 1,
        metrics: list[Metric] = (),
        on_record: Callable[[dict[str, Any]], None] | None = None,
        progress: bool = False,
        checkpointer: Any = None,
        node_metrics: list[NodeMetric] = (),
    ) -> list[dict[str, Any]]:
        """Run ``rounds`` rounds, recording round 0 and every ``log_every``-th round and the last.

        ``checkpointer`` (a :class:`gossip.checkpoint.Checkpointer`) saves every K rounds and
        turns SIGINT/SIGTERM into a final checkpoint. ``node_metrics`` (free runs: what one
        node computes from its own model, ``metric(node, x) -> {name: value}``) go into the
        ``node`` records of a free run's snapshots (:mod:`gossip.network.freerun`); the other
        runs record every node at once and do not use them.
        """
        records = []

        def deliver(rec: dict[str, Any]) -> None:
            records.append(rec)
            if on_record is not None:
                on_record(rec)

        if self.algorithm.asynchronous:
            self.setup()
        self.network.begin_run(rounds, checkpointer is not None)
        if self.round == 0:  # (a free run's start gains its fields, so the columns line up)
            deliver(self.record(metrics) | self.network.start_fields())
        if self.network.runs_free:  # snapshots at wall instants, then the end record
            deliver(self.network.run_free(rounds, metrics=metrics, log_every=log_every,
                                          node_metrics=node_metrics, on_record=deliver))
            return records
        bar = _progress(rounds, progress and self.world.is_root)
        last = self.round + rounds

        def boundary(t: int) -> bool:  # a round after which the state must be the round's own
            return (t % log_every == 0 or t == last
                    or (checkpointer is not None and checkpointer.acts_at(t)))

        while self.round < last:
            self.step(prefetch=self.overlap and not boundary(self.round + 1))
            if self.round % log_every == 0 or self.round == last:
                deliver(self.record(metrics))
            if checkpointer is not None:
                checkpointer.after_round(self)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return records

    # -- checkpoints -------------------------------------------------------------------------
    def node_state_dicts(self) -> dict[int, dict[str, Any]]:
        """Each local node's whole state: model, algorithm state, generators, compressors,
        oracle, bytes sent (tensors, numbers, lists and dicts only: loadable weights_only)."""
        self.network.check_checkpoint()
        sent = self.transport.bytes_sent
        _check_state(self.algorithm, self.block)  # a round may have added to it since setup
        self.block.check_arc_state()
        out = {}
        for i, nd in self.nodes.items():
            out[i] = {
                "x": _compact(nd.x),
                "state": {k: [_compact(t) for t in v] if isinstance(v, list | tuple) else _compact(v)
                          for k, v in nd.state.items()},
                "generator": nd.generator.get_state(),
                "compressor": nd.compressor.state_dict(),
                "compressors": {name: c.state_dict() for name, c in nd.compressors.items()},
                "oracle": nd.oracle.state_dict() if isinstance(nd.oracle, Stateful) else None,
                "bytes_sent": int(sent.get(i, 0)),
                **self.network.node_state(i),  # its lost messages, the messages in flight to it
            }
        return out

    def run_state_dict(self) -> dict[str, Any]:
        """The engine's own counters (identical on every process)."""
        out = {"round": self.round, "set_up": self.is_set_up, "seq": self._seq,
               "reference": dict(self._reference),
               "algorithm": self.algorithm.state_dict(),
               "compute_s": self.compute_s, "comm_s": self.comm_s,
               "elapsed_s": self.elapsed_s(),
               **self.network.state_dict()}  # an event queue between sweeps
        return out

    def load_state_dicts(self, nodes: Mapping[int, dict[str, Any]], run: dict[str, Any]) -> None:
        """Restore what :meth:`node_state_dicts` and :meth:`run_state_dict` returned."""
        if run.get("set_up", True):
            self.setup(stand_in=True)  # allocates the state the checkpoint fills
        elif self.is_set_up:
            raise ConfigError("the checkpoint was saved before the algorithm's setup (before the "
                              "first step), this run is past it: load it into a new run")
        for i, blob in nodes.items():
            nd = self.nodes[i]
            nd.x.copy_(blob["x"])
            _load_node_state(nd, blob["state"])
            nd.generator.set_state(blob["generator"])
            nd.compressor.load_state_dict(blob["compressor"])
            for name, st in blob.get("compressors", {}).items():
                nd.stream_compressor(name).load_state_dict(st)
            if isinstance(nd.oracle, Stateful):
                nd.oracle.load_state_dict(blob["oracle"])
            self.transport.bytes_sent[i] = int(blob["bytes_sent"])
        self.algorithm.load_state_dict(run.get("algorithm", {}))
        self.network.load_state_dicts(nodes, run)
        self.round = int(run["round"])
        self._seq = int(run["seq"])
        self._reference = dict(run["reference"])
        self.compute_s = float(run["compute_s"])
        self.comm_s = float(run["comm_s"])
        self._start = time.perf_counter() - float(run["elapsed_s"])
        self._shared.topology = self.topology.at_round(max(self.round, 1))

    def elapsed_s(self) -> float:
        """Wall seconds since the run started (a resumed run's include the saved run's)."""
        return time.perf_counter() - self._start

    def summary(self) -> dict[str, Any]:
        """The run's times: total wall time, and apart from it the setup (nodes, block and the
        algorithm's setup: ``setup_s``), the first round (``first_round_s``: numba's and the
        kernels' warm-up) and the mean of the rounds after it (``steady_s_per_round``, None
        after one round), none of them counting the metrics' records (``record_s``).
        ``seconds_per_round`` is the mean over every round of the rounds alone (setup and
        records out), what comparing methods compares."""
        wall = self.elapsed_s()
        timed = self._rounds_timed
        first = self.timings.get("first_round_s")
        return {
            "type": "summary",
            "rounds": self.round,
            "wall_time_s": wall,
            "seconds_per_round": (((first or 0.0) + self._steady_s) / timed if timed
                                  else wall / max(self.round, 1)),  # a free run: its wall time
            "setup_s": self.timings.get("nodes_s", 0.0) + self.timings.get("setup_s", 0.0),
            "first_round_s": first,
            "steady_s_per_round": self._steady_s / (timed - 1) if timed > 1 else None,
            "record_s": self._record_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
        }


def _check_state(algorithm: Algorithm, block: Block) -> None:
    """``block.state`` must hold tensors (or lists of tensors): checkpoints restore them in place."""
    for key, value in block.state.items():
        items = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(v, torch.Tensor) for v in items):
            raise ConfigError(
                f"{algorithm.name} put a {type(value).__name__} in block.state[{key!r}]; "
                "block.state holds tensors (or lists of tensors) only, which checkpoints save. "
                "Keep scratch buffers and other objects in block.workspace, a counter in a "
                "tensor, run-wide state in Algorithm.state_dict, and use "
                "block.stream_compressor(name) for an extra compressor"
            )


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` on its own storage: a row view of a block saved as is would carry the whole block
    (torch.save writes a view's entire storage) into every node's checkpoint."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone(memory_format=torch.contiguous_format)
    return t


def _span(ids: list[int]) -> str:
    """``0..24`` for a contiguous run of ids, else the list."""
    if ids and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    return str(ids)


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Python's cyclic collector paused while a block's nodes are made: each collection walks
    every tracked object, and a million new ones start a growing number of them (measured:
    17 µs a node instead of 1)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(eq=False)
class _InitialRows:
    """The local nodes' initial models before the block holds them: ``stacked`` [m, d] (from
    a tensor of all rows; one layout) or one flat tensor per node in ``rows``."""

    layouts: list[Layout]
    stacked: torch.Tensor | None = None
    rows: list[torch.Tensor] | None = None

    @property
    def d(self) -> int:
        if self.stacked is not None:
            return self.stacked.shape[1]
        return self.rows[0].shape[0] if self.rows else 0

    def layout(self, r: int) -> Layout:
        return self.layouts[0] if self.stacked is not None else self.layouts[r]

    def one_per_size(self) -> list[tuple[int, torch.Tensor]]:
        """(row, model) of the first node of each model size."""
        if self.stacked is not None:
            return [(0, self.stacked[0])] if self.stacked.shape[0] else []
        seen: dict[int, tuple[int, torch.Tensor]] = {}
        for r, x in enumerate(self.rows):
            seen.setdefault(x.shape[0], (r, x))
        return list(seen.values())

    def copy_into(self, X: torch.Tensor) -> None:
        """Write every row into the block's ``X`` (in chunks of ~16 M entries: no second
        whole copy, and not m small copies)."""
        if self.stacked is not None:
            X.copy_(self.stacked)
            return
        rows, d = self.rows, X.shape[1]
        if len(rows) > 1 and d and all(x.shape[0] == d for x in rows):
            step = max(1, (1 << 24) // d)
            for r in range(0, len(rows), step):
                X[r : r + step].copy_(torch.stack(rows[r : r + step]))
            return
        for r, x in enumerate(rows):
            X[r].copy_(x)


class StaticRound:
    """A round that repeats, replayed by :meth:`Engine.step` without the generic machinery:
    one phase, sent from the model's own memory (``none``: only the headers written) and
    mixed by the dense kernel (the block's :class:`~gossip.core.block.StaticPhase`), on the
    same plan and staging rows, so posted from the transport's prepared :class:`Wire` (the
    bytes counted from its totals), on a network whose round hooks do nothing.

    The algorithm's round is the definition and still runs: its generator is started and
    resumed as always, and the block answers the recorded calls (the same objects) from the
    record. Taken only while every guard of the generic path is known unchanged: checked
    here once per round, what stays with the objects (the round's graph and plan, the
    network's hooks, the transport's settings, the dispatcher's switches); by the block at
    each call, what may change in between (the model's memory and version, its
    ``requires_grad``, the model changed between send and mix). Anything else ends the
    replay, and the round goes on the generic way (and may be recorded again)."""

    __slots__ = ("topo", "plan", "phase", "again", "network", "switches")

    def __init__(self, topo: Any, plan: MixPlan, phase: StaticPhase, again: Any, network: Any):
        self.topo, self.plan, self.phase, self.again = topo, plan, phase, again
        self.network, self.switches = network, dispatch.switches()

    @classmethod
    def record(cls, engine: Engine, rnd: _Round) -> StaticRound | None:
        """The round ``rnd`` just ended, as a :class:`StaticRound` when it is one; else None."""
        phase = rnd.phase
        if (rnd.phases != 1 or phase is not rnd.msg or type(phase) is not Rows
                or not engine.network.quiet or engine.overlap
                or phase.route is not engine.block.routing):
            engine.block._sent_again = None
            return None
        static = engine.block.static_phase(phase)
        again = engine.transport.repeat(phase, phase.route) if static is not None else None
        if again is None:
            return None
        return cls(rnd.topo, phase.route, static, again, engine.network)

    def holds(self, engine: Engine, topo: Any) -> bool:
        """Whether the next round, on ``topo``, may replay this one (the guards kept with the
        objects; the block checks the others at each call)."""
        return (topo is self.topo and engine._plan(topo) is self.plan
                and engine.network is self.network and self.network.quiet
                and engine.transport.repeat_holds(self.again)
                and dispatch.switches() == self.switches and engine.is_set_up
                and engine._open is None)


@dataclass(eq=False)
class _Round:
    """The round in flight between :meth:`Engine.begin_round` and :meth:`Engine.end_round`."""

    t: int
    topo: Any
    gen: Any
    phases: int = 0  # phases posted so far
    phase: Any = None  # the phase in flight and what the round yielded for it
    msg: Any = None
    pending: Any = None  # the transport's handle of the phase in flight (None: no more phases)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="round", dynamic_ncols=True, delay=2.0)  # none for short runs


def _load_node_state(node: Node, saved: Mapping[str, Any]) -> None:
    """Copy saved tensors into ``node.state`` in place, refusing a checkpoint of another setup.

    Saved keys this run does not keep are skipped: checkpoints written before scratch buffers
    moved to ``block.workspace`` hold them, and nothing reads them."""
    state = node.state  # (views of the block's rows, made on each access)
    missing = set(state) - set(saved)
    if missing:
        raise ConfigError(
            f"node {node.id}: the checkpoint's algorithm state has {sorted(saved)}, this run "
            f"needs {sorted(state)} (missing {sorted(missing)}); resume with the flags the "
            "run was started with", node=node.id,
        )
    for key, current in state.items():
        value = saved[key]
        if isinstance(current, torch.Tensor):  # a list: per-neighbor rows saved one by one
            current.copy_(torch.stack(list(value)) if isinstance(value, list | tuple) else value)
        else:
            for c, v in zip(current, value, strict=True):
                c.copy_(v)
