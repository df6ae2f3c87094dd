"""The engine: hosts this process's nodes, runs their rounds in lockstep, routes messages.

Each round every local node's :meth:`Algorithm.step` generator is advanced to its next
:class:`Exchange`; the engine hands all of them to the transport at once (local receivers get
a copy, remote ones get MPI messages), then resumes every node with its inbox. Neighbors are
always visited in sorted order and metrics are reduced in node order, so a run gives the same
numbers in one process and under ``mpiexec`` for the same seed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gossip.algorithms.base import Algorithm, ConfigError, Exchange, Node, check_complete
from gossip.block import Block, IdentityCache, MixPlan, Rows, RowsError
from gossip.comm.world import World
from gossip.compress import Compressor, factory_for
from gossip.compress.base import CompressionError
from gossip.errors import GossipError
from gossip.layout import Layout
from gossip.metrics import consensus_error
from gossip.seeding import edge_seed, generator, node_seed
from gossip.stateful import Stateful

log = logging.getLogger(__name__)

Metric = Callable[["Engine", torch.Tensor], dict[str, Any]]


class DivergenceError(GossipError, RuntimeError):
    """A run blew up: NaN/Inf in a node's state, or an error past the divergence bound."""

    def __init__(self, message: str, round_: int, node: int | None = None):
        super().__init__(message)
        self.round = round_
        self.node = node


class NodeError(GossipError, RuntimeError):
    """A node's round raised; the message names the node, its rank and the round."""


class Engine:
    """Runs ``algorithm`` on every node of ``topology`` hosted by this process.

    Args:
        algorithm: the per-node algorithm (its hyper-parameters already set).
        topology: a ``topologies.Topology`` or ``TimeVaryingTopology``.
        x0: initial model of node i, as ``x0(i) -> Tensor`` or a mapping; flattened.
        compressor: a registry spec (``"topk:0.01"``, ``"module:Class:PARAMS"``) or a
            :class:`~gossip.compress.Compressor` instance; every node (and every extra message
            stream of a node) gets its own copy, so stateful ones keep separate state.
        layout: shapes packed in the flat model (default: one flat vector); low-rank
            compressors and PowerGossip work per matrix-shaped tensor of the layout.
        oracles: ``oracles(i, generator) -> oracle`` giving node i's gradients, or None.
        seed: the run seed; node generators and the nodes' and edges' random streams
            (:mod:`gossip.rng`) derive from it.
        world: the process group (default: detected; in process without mpiexec).
        timeout: seconds any wait for a neighbor may take before the run stops.
        divergence_factor: a watched metric above this times its first positive value (or
            non-finite) stops the run with :class:`DivergenceError`.
        watch: metrics watched besides ``consensus_error`` (e.g. ``distance_to_optimum``).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        topology: Any,
        x0: Callable[[int], torch.Tensor] | Mapping[int, torch.Tensor],
        *,
        compressor: str | Compressor = "none",
        layout: Layout | None = None,
        oracles: Callable[[int, torch.Generator], Any] | None = None,
        seed: int = 0,
        world: World | None = None,
        timeout: float = 120.0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
        divergence_factor: float = 1e6,
        watch: tuple[str, ...] = (),
    ):
        self.algorithm = algorithm
        self.topology = topology
        self.n = topology.n
        self.seed = seed
        self.world = world or World.detect()
        self.device = torch.device(device)
        self.dtype = dtype
        self.divergence_factor = divergence_factor
        self.compressor_spec = (compressor if isinstance(compressor, str)
                                else getattr(compressor, "spec", type(compressor).__name__))
        self._new_compressor = factory_for(compressor, layout)
        self._check_config(oracles)
        self.local_ids = self.world.local_nodes(self.n)
        self.transport = self.world.transport(self.n, timeout=timeout)
        self.nodes: dict[int, Node] = {}
        for i in self.local_ids:
            x = (x0(i) if callable(x0) else x0[i]).detach().to(self.device, self.dtype)
            x = x.reshape(-1).clone()
            lay = layout or Layout.flat(x.numel())
            if lay.numel != x.numel():
                raise ConfigError(f"layout {lay} holds {lay.numel} entries, node {i}'s x has {x.numel()}")
            gen = generator(node_seed(seed, i), self.device)
            node = Node(
                id=i,
                x=x,
                layout=lay,
                view=topology.at_round(1).view(i),
                compressor=self._new_compressor(),
                new_compressor=self._new_compressor,
                generator=gen,
                edge_seed=_edge_seeder(seed, i),
                seed=seed,
                oracle=oracles(i, gen) if oracles is not None else None,
            )
            self.nodes[i] = node
            try:  # a spec that cannot fit this model (top-k with k > d) is refused before round 1
                node.compressor.max_nbytes(x)
            except CompressionError as exc:
                raise ConfigError(f"compressor '{compressor}' cannot compress node {i}'s model of "
                                  f"{x.numel()} entries: {exc}") from None
        self.round = 0
        self._seq = 0
        self.compute_s = 0.0
        self.comm_s = 0.0
        self._start = time.perf_counter()
        self._reference: dict[str, float] = {}
        self.watch = ["consensus_error", *watch]
        self.block: Block | None = None
        self._viewed: Any = None  # the topology whose views the nodes hold
        self._plans = IdentityCache()
        with torch.no_grad():
            if algorithm.runs_blocks():
                self.block = self._new_block()
                self.block.plan = self._plan(topology.at_round(1))  # setup may route (arc_plan)
                algorithm.setup_block(self.block)
                self.block.mirror_state()
            else:
                for node in self.nodes.values():
                    algorithm.setup(node)
            for node in self.nodes.values():
                _check_state(algorithm, node)

    def _new_block(self) -> Block:
        """The local nodes as rows of one [m, d] tensor (each node's ``x`` becomes a row view)."""
        nodes = list(self.nodes.values())
        d = nodes[0].x.numel() if nodes else 0
        block = Block(nodes, None, self._new_compressor(), self._new_compressor, seed=self.seed)
        x = block.message_tensor(d, self.dtype, self.device)  # sent as it is by 'none'
        for r, node in enumerate(nodes):
            x[r].copy_(node.x)
            node.x = x[r]
        block.x = x
        return block

    def _plan(self, topo: Any) -> MixPlan:
        """The block's routing for a round's topology (cached per topology object)."""
        return self._plans.get(topo, lambda: MixPlan.build(topo, self.block.ids,
                                                           self.transport.is_local, self.device))

    def _check_config(self, oracles: Any) -> None:
        """Refuse, before any message, what this algorithm cannot run on."""
        alg, topo = self.algorithm, self.topology
        if alg.static_topology and getattr(topo, "time_varying", False):
            raise ConfigError(
                f"{alg.name} keeps per-neighbor state and needs a static topology, but "
                f"'{topo.name}' changes every round; use gossip or dpsgd, or a static graph"
            )
        if alg.symmetric and getattr(topo, "directed", False):
            raise ConfigError(
                f"{alg.name} needs a symmetric mixing matrix, but '{topo.name}' is directed; use a "
                "symmetric graph (e.g. 'exponential' instead of 'directed-exponential')"
            )
        if alg.needs_complete_graph:
            check_complete(alg.name, topo)
        if alg.needs_oracle and oracles is None:
            raise ConfigError(f"{alg.name} needs gradients: give it a problem (an oracle per node)")
        alg.validate(topo, self._new_compressor())

    # -- rounds ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Run one round on every local node (under no_grad: oracles that need autograd enable it)."""
        t = self.round + 1
        topo = self.topology.at_round(t)
        if topo is not self._viewed:  # static graphs: the views of round 1 stay
            for node in self.nodes.values():
                node.view = topo.view(node.id)
            self._viewed = topo
        if self.block is not None:  # the block's streams stand for the nodes'
            for node in self.nodes.values():
                node.round = t
            self._step_block(t, topo)
            return
        for node in self.nodes.values():
            node.begin_round(t)  # its round and the round of its random streams
        tic = time.perf_counter()
        gens = {i: self.algorithm.step(node) for i, node in self.nodes.items()}
        msgs = {i: self._advance(i, g, None) for i, g in gens.items()}
        self.compute_s += time.perf_counter() - tic
        while any(m is not None for m in msgs.values()):
            if any(m is None for m in msgs.values()):
                raise NodeError(f"round {t}: nodes yielded different numbers of exchanges")
            tic = time.perf_counter()
            inboxes = self._route(msgs, t)
            toc = time.perf_counter()
            self.comm_s += toc - tic
            msgs = {i: self._advance(i, g, inboxes[i]) for i, g in gens.items()}
            self.compute_s += time.perf_counter() - toc
        self.round = t

    def _step_block(self, t: int, topo: Any) -> None:
        """One round of a block algorithm: a single generator for all local nodes."""
        block = self.block
        plan = self._plan(topo)
        block.begin_round(t, plan)
        tic = time.perf_counter()
        gen = self.algorithm.block_step(block)
        msg = self._advance_block(gen, None)
        self.compute_s += time.perf_counter() - tic
        while msg is not None:
            tic = time.perf_counter()
            self._seq += 1
            self.transport.exchange_rows(msg, msg.route, self._seq, t)
            toc = time.perf_counter()
            self.comm_s += toc - tic
            msg = self._advance_block(gen, msg, check=True)
            self.compute_s += time.perf_counter() - toc
        self.round = t

    def _advance_block(self, gen, inbox, check: bool = False) -> Rows | None:
        block = self.block
        try:
            if inbox is None:
                return next(gen)
            if check:
                block.check_received(inbox)
            return gen.send(inbox)
        except StopIteration:
            return None
        except Exception as exc:
            rank = self.world.rank
            bad = (~torch.isfinite(block.x)).any(dim=1).nonzero()
            if bad.numel():
                i = block.ids[int(bad[0])]
                raise DivergenceError(
                    f"round {block.round}: node {i} (rank {rank}) has NaN/Inf in x: the run "
                    f"diverged ({exc}). Lower the step sizes (gamma, eta).", block.round, i,
                ) from exc
            if isinstance(exc, RowsError) and exc.sender == exc.receiver:
                raise NodeError(
                    f"round {block.round}: node {exc.sender} (rank {rank}) sent a message its own "
                    f"decoder refuses: {exc.__cause__ or exc}"
                ) from exc
            if isinstance(exc, RowsError):
                raise NodeError(
                    f"round {block.round}: node {exc.receiver} (rank {rank}) refused the message "
                    f"from node {exc.sender} (rank {self.transport.placement[exc.sender]}): "
                    f"{exc.__cause__ or exc}"
                ) from exc
            if isinstance(exc, GossipError):
                raise NodeError(f"round {block.round}: rank {rank}: {exc}") from exc
            raise NodeError(
                f"round {block.round}: the block of nodes {_span(block.ids)} (rank {rank}) "
                f"failed: {exc}"
            ) from exc

    def _advance(self, i: int, gen, inbox) -> Exchange | None:
        try:
            return next(gen) if inbox is None else gen.send(inbox)
        except StopIteration:
            return None
        except Exception as exc:
            node = self.nodes[i]
            if not bool(torch.isfinite(node.x).all()):
                raise DivergenceError(
                    f"round {node.round}: node {i} (rank {self.world.rank}) has NaN/Inf in x: "
                    f"the run diverged ({exc}). Lower the step sizes (gamma, eta).",
                    node.round,
                    i,
                ) from exc
            sender = getattr(exc, "sender", None)
            if sender is not None:
                raise NodeError(
                    f"round {node.round}: node {i} (rank {self.world.rank}) refused the message "
                    f"from node {sender} (rank {self.transport.placement[sender]}): {exc}"
                ) from exc
            raise NodeError(
                f"round {node.round}: node {i} (rank {self.world.rank}) failed: {exc}"
            ) from exc

    def _route(self, msgs: dict[int, Exchange], t: int) -> dict[int, dict[int, torch.Tensor]]:
        outgoing, expected = {}, {}
        for i, m in msgs.items():
            view = self.nodes[i].view
            for j in view.out_neighbors:
                outgoing[(i, j)] = m.buffer_for(j)
            for j in view.in_neighbors:
                expected[(j, i)] = m.capacity
        self._seq += 1
        received = self.transport.exchange(outgoing, expected, self._seq, t)
        inboxes: dict[int, dict[int, torch.Tensor]] = {i: {} for i in msgs}
        for (j, i), buf in sorted(received.items()):
            inboxes[i][j] = buf
        return inboxes

    # -- metrics ---------------------------------------------------------------------------
    def mean_model(self) -> torch.Tensor:
        """x̄ = (1/n) Σ_i x_i, summed in node order (identical on every process)."""
        return self.world.ordered_sum(self.n, {i: nd.x for i, nd in self.nodes.items()}).div_(self.n)

    def node_values(self, local: Mapping[int, float]) -> Any:
        """Gather one float per node (indexed by node id) on every process."""
        return self.world.node_values(self.n, local)

    def bytes_sent(self) -> Any:
        """Cumulative bytes handed to the transport by each node (indexed by node id)."""
        sent = self.transport.bytes_sent
        return self.node_values({i: float(sent.get(i, 0)) for i in self.nodes})

    def record(self, metrics: list[Metric] = ()) -> dict[str, Any]:
        """One log record of the current round (collective: every process must call it)."""
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
        for metric in metrics:
            rec.update(metric(self, xbar))
        rec.update(
            time_s=time.perf_counter() - self._start,
            compute_s=self.compute_s,
            comm_s=self.comm_s,
        )
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
                    self.round,
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
    ) -> list[dict[str, Any]]:
        """Run ``rounds`` rounds, recording round 0 and every ``log_every``-th round and the last.

        ``checkpointer`` (a :class:`gossip.checkpoint.Checkpointer`) saves every K rounds and
        turns SIGINT/SIGTERM into a final checkpoint.
        """
        records = []

        def emit() -> None:
            rec = self.record(metrics)
            records.append(rec)
            if on_record is not None:
                on_record(rec)

        if self.round == 0:
            emit()
        bar = _progress(rounds, progress and self.world.is_root)
        last = self.round + rounds
        while self.round < last:
            self.step()
            if self.round % log_every == 0 or self.round == last:
                emit()
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
        sent = self.transport.bytes_sent
        if self.block is not None:
            self.block.mirror_state()
        out = {}
        for i, nd in self.nodes.items():
            _check_state(self.algorithm, nd)  # a round may have added to it since setup
            out[i] = {
                "x": _compact(nd.x),
                "state": {k: [_compact(t) for t in v] if isinstance(v, list | tuple) else _compact(v)
                          for k, v in nd.state.items()},
                "generator": nd.generator.get_state(),
                "compressor": nd.compressor.state_dict(),
                "compressors": {name: c.state_dict() for name, c in nd.compressors.items()},
                "oracle": nd.oracle.state_dict() if isinstance(nd.oracle, Stateful) else None,
                "bytes_sent": int(sent.get(i, 0)),
            }
        return out

    def run_state_dict(self) -> dict[str, Any]:
        """The engine's own counters (identical on every process)."""
        return {"round": self.round, "seq": self._seq, "reference": dict(self._reference),
                "algorithm": self.algorithm.state_dict(),
                "compute_s": self.compute_s, "comm_s": self.comm_s,
                "elapsed_s": time.perf_counter() - self._start}

    def load_state_dicts(self, nodes: Mapping[int, dict[str, Any]], run: dict[str, Any]) -> None:
        """Restore what :meth:`node_state_dicts` and :meth:`run_state_dict` returned."""
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
        self.round = int(run["round"])
        self._seq = int(run["seq"])
        self._reference = dict(run["reference"])
        self.compute_s = float(run["compute_s"])
        self.comm_s = float(run["comm_s"])
        self._start = time.perf_counter() - float(run["elapsed_s"])
        for nd in self.nodes.values():
            nd.begin_round(self.round)
            nd.view = self.topology.at_round(max(self.round, 1)).view(nd.id)
        self._viewed = None

    def summary(self) -> dict[str, Any]:
        """The run's total wall time and mean seconds per round."""
        wall = time.perf_counter() - self._start
        return {
            "type": "summary",
            "rounds": self.round,
            "wall_time_s": wall,
            "seconds_per_round": wall / max(self.round, 1),
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
        }


def _check_state(algorithm: Algorithm, node: Node) -> None:
    """``node.state`` must hold tensors (or lists of tensors): checkpoints restore them in place."""
    for key, value in node.state.items():
        items = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(v, torch.Tensor) for v in items):
            raise ConfigError(
                f"{algorithm.name} put a {type(value).__name__} in node.state[{key!r}]; node.state "
                "holds tensors (or lists of tensors) only. Use node.stream_compressor(name) for an "
                "extra compressor, a tensor for a counter, and Algorithm.state_dict for run-wide state"
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


def _edge_seeder(seed: int, i: int) -> Callable[[int], int]:
    return lambda j: edge_seed(seed, i, j)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="round", dynamic_ncols=True)


def _load_node_state(node: Node, saved: Mapping[str, Any]) -> None:
    """Copy saved tensors into ``node.state`` in place, refusing a checkpoint of another setup."""
    if set(saved) != set(node.state):
        raise ConfigError(
            f"node {node.id}: the checkpoint's algorithm state has {sorted(saved)}, this run's "
            f"{sorted(node.state)}; resume with the flags the run was started with"
        )
    for key, value in saved.items():
        current = node.state[key]
        if isinstance(current, torch.Tensor):  # a list: per-neighbor rows saved one by one
            current.copy_(torch.stack(list(value)) if isinstance(value, list | tuple) else value)
        else:
            for c, v in zip(current, value, strict=True):
                c.copy_(v)
