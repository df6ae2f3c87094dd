"""The network of one run, as the engine sees it: one :class:`Simulator` built by :func:`build`
from the engine's ``network=`` and ``free_run=``.

It answers what synchronous rounds need (which of a phase's messages arrive, which arrive rounds
late, the rounds' virtual clock and wall-clock pacing, the fields they add to a record and to a
checkpoint) and runs asynchronous algorithms (a sweep of the event loop in virtual time, or a
free run on wall clocks under mpiexec). The engine calls it at fixed points of a round and knows
nothing of the models behind it:

* :func:`build` (the engine's constructor): the spec parsed and refused where it cannot hold
  for the algorithm and graph (churn for rounds, nodes that do not exist, a free run's models);
* :meth:`Simulator.attach` (once the nodes exist): what needs the process's nodes (a free
  run's one node per rank, per-arc state under ``stale=``);
* :meth:`Simulator.setup` (after the algorithm's setup): the event loop, or the rounds' loss
  and lateness;
* per run call :meth:`~Simulator.begin_run`; per round :meth:`~Simulator.begin_round`,
  :meth:`~Simulator.send` for each phase posted, :meth:`~Simulator.arrived` for each phase
  received, :meth:`~Simulator.end_round`; per record :meth:`~Simulator.fields` and
  :meth:`~Simulator.after_record`; per checkpoint :meth:`~Simulator.check_checkpoint`,
  :meth:`~Simulator.node_state`, :meth:`~Simulator.state_dict` and
  :meth:`~Simulator.load_state_dicts`;
* :meth:`~Simulator.sweep` and :meth:`~Simulator.run_free` for asynchronous algorithms.

On an ideal network every part is None and each call returns at once: the rounds are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gossip.core.algorithm import Algorithm
from gossip.core.routing import ArcPlan, MixPlan
from gossip.core.staging import Rows
from gossip.errors import ConfigError
from gossip.network.activity import Activity
from gossip.network.clock import SyncClock, WallRounds
from gossip.network.events import EventLoop
from gossip.network.freerun import FreeRun, NodeMetric, check_host, check_models
from gossip.network.host import Host
from gossip.network.loss import ARC_STATE_POLICIES, Delivery
from gossip.network.noise import ChannelNoise
from gossip.network.spec import Network, parse_network
from gossip.network.stale import Staleness, mode_of
from gossip.network.timing import Timing


class Simulator:
    """What messages and nodes meet in one run (module doc). Built by :func:`build`."""

    def __init__(self, model: Network, algorithm: Algorithm, topology: Any, seed: int,
                 free_run: float | None, clock: SyncClock | None) -> None:
        self.model = model
        """The parsed ``--network`` spec."""
        self.algorithm = algorithm
        self.topology = topology
        self.n = topology.n
        self.seed = seed
        self.free_run = free_run
        """Wall seconds per virtual second under mpiexec (``--free-run``); None: virtual time."""
        self.clock = clock
        """Virtual time of the rounds (None without timing models, or for events)."""
        self.wall: WallRounds | None = None
        """The rounds' wall clock (synchronous algorithms with ``free_run``)."""
        self.delivery: Delivery | None = None
        """Message loss of the rounds (None on a network that loses nothing)."""
        self.stale: Staleness | None = None
        """Late messages of the rounds (None on a network where none is late)."""
        self.events: EventLoop | None = None
        """An asynchronous algorithm's event queue in virtual time (None for rounds)."""
        self.noise: ChannelNoise | None = None
        """The rounds' noisy channel (None on a channel without noise)."""
        self.activity: Activity | None = None
        """The rounds' partial activation (None: every node takes part in every round)."""
        self.last_free_run: FreeRun | None = None
        """The :class:`~gossip.network.freerun.FreeRun` of the last free run (its counters)."""
        self._host: Host | None = None
        self._policy: str | None = None
        self._finishes: Any = None  # every node's wall end of round, between fields and after_record

    @property
    def runs_free(self) -> bool:
        """An asynchronous algorithm runs free on wall clocks (:meth:`run_free`)."""
        return self.free_run is not None and self.algorithm.asynchronous

    def _where(self) -> str:
        return f"--network {self.model.spec()}"

    def _loss_policy(self) -> str:
        """The algorithm's declared :attr:`~gossip.core.Algorithm.on_loss`, once its
        :attr:`~gossip.core.Algorithm.loss_requires` accept the run's compressor."""
        if self._policy is None:
            alg = self.algorithm
            if alg.on_loss is None:
                fix = (f"use its per-arc form {alg.name}-arcs (make_algorithm({alg.name!r}, "
                       "arcs=True), --hparam arcs=true), exact under loss"
                       if vars(type(alg)).get("arcs_form") is not None else
                       "use one of the algorithms docs/network.md lists (gossip, dpsgd, choco, "
                       "lead, ...)")
                raise ConfigError(f"--network: {alg.name} has no defined meaning for a lost "
                                  f"message; run it without loss, or {fix}")
            if alg.loss_requires is not None:
                alg.loss_requires.check_compressor(self._host.block.compressor, name=alg.name)
            self._policy = alg.on_loss
        return self._policy

    # -- building ------------------------------------------------------------------------------
    def attach(self, host: Host) -> None:
        """Bind to the process's nodes once they exist (their compressor is the run's, which
        the algorithm's :attr:`~gossip.core.Algorithm.loss_requires` check), refusing in one
        line what they cannot run: a free run off mpiexec or with several nodes per rank,
        ``stale=`` where late rounds have no meaning."""
        self._host = host
        if self.free_run is not None:
            check_host(host)
            if not self.algorithm.asynchronous:
                self.wall = WallRounds(Timing(self.model, self.seed, self.n), host.local_ids[0],
                                       self.free_run)
        self._check_stale(host)
        if self.model.partial:
            self.activity = Activity(self.model, self.seed, self.n)
            self.activity.check(host, self.algorithm.name)

    def _check_stale(self, host: Host) -> None:
        """Refuse ``stale=`` where late rounds have no meaning: an asynchronous algorithm (no
        rounds: its messages take ``delay=`` seconds), together with ``delay=``, per-arc lags
        on arcs the graph lacks, an algorithm without loss semantics, with per-arc moves of an
        edge's two ends (``"edge"``), with acknowledged per-arc copies on a graph that changes,
        or with other per-arc state (what a late message means follows
        :attr:`~gossip.core.Algorithm.on_loss`, :mod:`gossip.network.stale`)."""
        net, alg = self.model, self.algorithm
        if not net.late:
            return
        where = self._where()
        if alg.asynchronous:
            raise ConfigError(f"{where}: stale= makes messages of synchronous rounds late; "
                              f"{alg.name} is asynchronous (no rounds): give its messages a "
                              "delay in seconds with delay= instead")
        if net.delay is not None:
            raise ConfigError(f"{where}: stale= (rounds late) and delay= (seconds a receiver "
                              "waits) are two models of one thing; give one of them")
        net.check(self.n, self.topology)
        try:
            policy = self._loss_policy()
        except ConfigError as exc:
            raise ConfigError(f"{where}: a late message means what a lost one means to its "
                              f"algorithm (docs/network.md), and {alg.name} has no such meaning "
                              f"here ({str(exc).removeprefix('--network: ')}); run it without "
                              "stale=") from None
        mode_of(policy, net, alg.name)
        if policy == "ack" and getattr(self.topology, "time_varying", False):
            raise ConfigError(f"{where}: {alg.name} keeps per-arc copies acknowledged at both "
                              "ends, and a late message is handed over on its arc in a later "
                              "round, where a graph that changes every round may not have it "
                              "(not combined yet): run it on a static graph, or without stale=")
        if host.block.arc_state and policy not in ("ack", "running-sum"):
            raise ConfigError(f"{where}: {alg.name} keeps state per arc "
                              f"({', '.join(sorted(host.block.arc_state))}); late messages have "
                              "no defined meaning there yet: run it without stale=")

    def setup(self) -> None:
        """After the algorithm's setup: the event loop of an asynchronous algorithm, or the
        rounds' loss (refusing, before any message, per-arc state without a meaning for lost
        messages: only ``on_loss = "ack"`` or ``"edge"`` reads what was delivered) and
        lateness."""
        host = self._host
        if self.algorithm.asynchronous:  # its events meet the network themselves
            self.events = EventLoop(host, self.model)
        elif self.model.lossy or self.model.partial:
            try:
                policy = self._loss_policy()
            except ConfigError as exc:
                if self.model.lossy:
                    raise
                raise ConfigError(f"{self._where()}: an inactive node is a silent neighbor, which "
                                  "means to an algorithm what a lost message means "
                                  f"(docs/network.md), and {self.algorithm.name} has no such "
                                  f"meaning ({str(exc).removeprefix('--network: ')}); run it "
                                  "without active=") from None
            if host.block.arc_state and policy not in ARC_STATE_POLICIES:
                raise ConfigError(
                    f"{self._where()}: {self.algorithm.name} keeps state per arc "
                    f"({', '.join(sorted(host.block.arc_state))}) and sends a message per arc; "
                    "lost messages have no defined meaning there yet: run it on a static graph "
                    "or without loss")
            self.delivery = Delivery(self.model, self.seed, policy, host.block.ids,
                                     self.activity)
        if self.model.noisy and not self.algorithm.asynchronous:
            self.noise = ChannelNoise(self.model, self.seed, host.block.ids, self.algorithm.name)
        if self.model.late:
            self.stale = Staleness(self.model, self.seed, self._loss_policy(), host.block.ids,
                                   self.algorithm.name)

    def begin_run(self, rounds: int, checkpointing: bool) -> None:
        """A run call of ``rounds`` rounds (or sweeps) begins: refuse what its length or
        checkpoints cannot hold (delays and churn past the asynchronous run's horizon,
        ``stale=`` lags no message of the call outlives, each call judged by its own last round,
        and checkpoints with messages held in flight, which are not saved), then (re)start the
        rounds' wall clock at a common instant."""
        if self.events is not None:
            self.events.check_horizon(rounds)
        if self.model.late:
            self._check_lags(rounds, checkpointing)
        if self.wall is not None:
            self.wall.resume(self._host.node_values({self.wall.node: self.wall.finish}))

    def _check_lags(self, rounds: int, checkpointing: bool) -> None:
        last = self._host.round + rounds
        if self.model.stale.low >= last:
            raise ConfigError(f"{self._where()}: every message is at least "
                              f"{self.model.stale.low} rounds late, so none sent in this run of "
                              f"{last} rounds would arrive before it ends: give a smaller lag or "
                              "more rounds")
        if checkpointing:
            raise ConfigError(f"{self._where()}: the messages held in flight are not "
                              "checkpointed yet; run it without --checkpoint-every")

    # -- synchronous rounds --------------------------------------------------------------------
    def prepare_round(self, t: int) -> None:
        """Round ``t`` is about to run (before the algorithm's first line): under partial
        activation, draw who is active and keep the inactive rows to put back at
        :meth:`end_round` (:mod:`gossip.network.activity`)."""
        if self.activity is not None:
            self.activity.begin(t, self._host.block)

    def begin_round(self, t: int) -> None:
        """Round ``t``'s first messages are ready to leave: its counts of lost and late
        messages start at zero, and in wall-clock rounds this node sleeps its compute draw."""
        if self.delivery is not None:
            self.delivery.begin_round()
        if self.stale is not None:
            self.stale.begin_round()
        if self.wall is not None:
            self.wall.pace(t)

    @property
    def quiet(self) -> bool:
        """Whether the round hooks do nothing (no loss, lateness, noise, partial activation or
        wall-clock pacing): an ideal network, whose rounds the engine may replay
        (:class:`gossip.engine.engine.StaticRound`) without calling them."""
        return (self.delivery is None and self.stale is None and self.noise is None
                and self.activity is None and self.wall is None)

    def send(self, phase: Rows, topology: Any, t: int, index: int) -> None:
        """Phase ``index`` of round ``t`` is about to be posted: under loss, route it (and the
        round's mixing, until the next phase) on the plan of what is delivered, whose transport
        skips the lost messages and whose mix their terms."""
        if self.noise is not None:
            self.noise.attach(phase, t, index)
        if self.delivery is None:
            return
        plan = self.delivery.route(phase.route, topology, t, index)
        phase.route = plan
        for part in getattr(phase, "parts", ()):
            part.route = plan
        if isinstance(plan, MixPlan):  # an arc phase's masks ride on its rows' route
            self._host.block.plan = plan

    def arrived(self, phase: Rows, t: int, index: int) -> None:
        """Phase ``index`` of round ``t`` was received: under ``stale=``, hold its messages at
        the receivers and hand over those due now (the round mixes them)."""
        if self.stale is None:
            return
        block = self._host.block
        block.check_received(phase)
        phase.settle()
        if self.stale.mode == "sequenced" and isinstance(phase.route, ArcPlan):
            self.stale.hold_arcs(phase, t, index)  # per-arc copies: both ends handed theirs
            return
        block.plan = self.stale.hold(phase, t, index, block.routing)

    def end_round(self) -> None:
        """The round's last phase was received: inactive nodes get back their rows."""
        if self.activity is not None:
            self.activity.end(self._host.block)
        if self.wall is not None:
            self.wall.finished()

    # -- asynchronous runs ---------------------------------------------------------------------
    def sweep(self, t: int) -> None:
        """Sweep ``t`` of an asynchronous algorithm in virtual time: events until ``t · n``
        activations in all (``block.round``, what step-size schedules read, is ``t``)."""
        host = self._host
        host.block.round = t  # (each node's round reads the block's)
        self.events.run(t * self.n)

    def run_free(self, rounds: int, *, metrics: list[Any], log_every: int,
                 node_metrics: list[NodeMetric],
                 on_record: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Run the asynchronous algorithm free for ``rounds`` sweeps of wall time (module doc of
        :mod:`gossip.network.freerun`): the snapshots go to ``on_record`` as they come; returns
        the end record. The host's round is the end's (what metrics read) from the start."""
        host = self._host
        free = self.last_free_run = FreeRun(host, self.model, self.free_run)
        host.round += rounds  # the end record's; each snapshot's its own
        rec = free.run(seconds=rounds * free.sweep_s, metrics=metrics, log_every=log_every,
                       node_metrics=node_metrics, on_record=on_record)
        rec["round"] = host.round
        return rec

    # -- records -------------------------------------------------------------------------------
    def start_fields(self) -> dict[str, Any]:
        """What the first record of a free run adds, so that its columns line up with the
        snapshots' and the end's."""
        if not self.runs_free:
            return {}
        return {"wall_s": 0.0, "local_steps": 0, "routed_around": 0, "messages": 0,
                "messages_lost_total": 0}

    def fields(self) -> dict[str, Any]:
        """What a record of the host's current round adds (collective): the event loop's
        counters, the messages lost and late, the virtual and the wall time. In wall-clock
        rounds the record's own time is taken out of the clock by :meth:`after_record`."""
        host, rec = self._host, {}
        if self.events is not None and self.free_run is None:
            rec.update(self.events.log_fields())
        ids = host.block.ids
        if self.delivery is not None:
            lost = self.delivery
            rec["messages_lost"] = int(host.node_values(dict(zip(ids, lost.lost_round.tolist()))).sum())
            rec["messages_lost_total"] = int(host.node_values(dict(zip(ids, lost.lost_total.tolist()))).sum())
        if self.stale is not None:
            late = self.stale
            rec["messages_late"] = int(host.node_values(dict(zip(ids, late.late_round.tolist()))).sum())
            rec["messages_late_total"] = int(host.node_values(dict(zip(ids, late.late_total.tolist()))).sum())
        if self.activity is not None:
            rec["nodes_active"] = self.activity.count if host.round > 0 else self.n
            rec["node_rounds_active_total"] = self.activity.total
        if self.clock is not None:
            rec["time_virtual_s"] = self.clock.time(host.round)
        if self.wall is not None:  # the round's end in wall time: the latest node's
            self._finishes = host.node_values({self.wall.node: self.wall.finish})
            rec["wall_s"] = float(self._finishes.max())
        return rec

    def after_record(self) -> None:
        """The record is done: the wall clock restarts where the nodes were before it."""
        if self._finishes is not None:
            self.wall.resume(self._finishes)
            self._finishes = None

    # -- checkpoints ---------------------------------------------------------------------------
    def check_checkpoint(self) -> None:
        """Refuse a checkpoint of what cannot be resumed: a free run's wall-clock events, or
        messages held in flight under ``stale=``."""
        if self.free_run is not None:
            raise ConfigError(f"{self.algorithm.name} --free-run: a free run's events happen in "
                              "wall-clock time and differ from run to run, so there is no state "
                              "to resume to; checkpoint it in virtual time (without --free-run)")
        if self.stale is not None:
            raise ConfigError(f"{self._where()}: the messages held in flight are not "
                              "checkpointed yet; run it without checkpoints")

    def node_state(self, i: int) -> dict[str, Any]:
        """Local node i's part of a checkpoint: its lost messages, the messages in flight to
        it (:meth:`EventLoop.node_state`)."""
        out: dict[str, Any] = {}
        if self.delivery is not None:
            out["messages_lost"] = int(self.delivery.lost_total[self._host.block.ids.index(i)])
        if self.events is not None:
            out["events"] = self.events.node_state(i)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The run's part of a checkpoint: the event queue between sweeps (identical
        everywhere)."""
        return {"events": self.events.state_dict()} if self.events is not None else {}

    def load_state_dicts(self, nodes: Mapping[int, dict[str, Any]], run: dict[str, Any]) -> None:
        """Restore what :meth:`node_state` and :meth:`state_dict` gave."""
        ids = self._host.block.ids
        if self.delivery is not None:
            for i, blob in nodes.items():
                self.delivery.lost_total[ids.index(i)] = int(blob.get("messages_lost", 0))
        if self.events is None:
            return
        if "events" not in run:
            raise ConfigError(f"{self.algorithm.name} is asynchronous but the checkpoint holds "
                              "no event queue: it is another run's; start with a new "
                              "--checkpoint-dir")
        self.events.load_state_dict(run["events"], {i: blob["events"] for i, blob in nodes.items()})


def build(network: Network | str | None, *, algorithm: Algorithm, topology: Any, seed: int,
          free_run: float | None = None) -> Simulator:
    """The run's :class:`Simulator` for ``network`` (a :class:`Network` or its ``--network``
    spec; None: ideal), refusing in one line what cannot hold before any node exists: churn
    for synchronous rounds (they wait for every node), slow or churning nodes and per-arc lags
    that do not exist, timing draws past the largest float, and a ``free_run`` scale or model
    the kind of run does not take."""
    model = network if isinstance(network, Network) else parse_network(network)
    _check_rounds_models(model, algorithm, free_run)
    clock = None
    if model.timed:
        if not algorithm.asynchronous and model.churn is not None:
            raise ConfigError(f"--network {model.spec()}: churn is modeled for asynchronous "
                              "algorithms (nodes away in an event run's virtual time); synchronous "
                              f"rounds wait for every node, so {algorithm.name} cannot run "
                              "with churn=: drop it")
        model.check(topology.n, topology)
        if not algorithm.asynchronous:  # an asynchronous algorithm's events keep the time
            clock = SyncClock(Timing(model, seed, topology.n), topology)
    if free_run is not None:
        check_models(algorithm, model, free_run)
    return Simulator(model, algorithm, topology, seed, free_run, clock)


def _check_rounds_models(model: Network, algorithm: Algorithm, free_run: float | None) -> None:
    """Refuse, in one line, ``noise=`` and ``active=`` where they are not modeled: asynchronous
    algorithms (events, with their own clocks), and combinations not built yet (``stale=``;
    for ``active=`` also timing models and ``--free-run``)."""
    where = f"--network {model.spec()}"
    for kind, on in (("noise", model.noisy), ("active", model.partial)):
        if not on:
            continue
        if algorithm.asynchronous:
            raise ConfigError(f"{where}: {kind}= is modeled for synchronous rounds; "
                              f"{algorithm.name} is asynchronous (events in virtual time): run it "
                              f"without {kind}=")
        if model.late:
            raise ConfigError(f"{where}: {kind}= and stale= are not combined yet; give one of them")
    if model.partial and (model.timed or free_run is not None):
        raise ConfigError(f"{where}: active= is not combined with timing models or --free-run yet "
                          "(the virtual clock would still count an inactive node's compute "
                          "time); drop one of them")


__all__ = ["Simulator", "build"]
