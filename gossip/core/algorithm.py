"""What an algorithm is: immutable configuration plus a round written as a generator over a block.

A round runs for all of a process's nodes at once (a :class:`~gossip.core.block.Block`: row
r of every [m, d] tensor is node r). It yields each phase's messages and gets them back
exchanged, so it reads like the paper's update and never touches a transport::

    q = block.encode(x - x_hat)     # C(x_i − x̂_i) for every row
    inbox = yield q                 # sent to the out-neighbors; theirs received
    block.mix_into(s, q, inbox)     # s_i += Σ_j w_ij C(q_j), neighbors in sorted order

Every node of a run yields the same number of phases per round. Resolved hyper-parameters go
to ``block.hparams``, never onto the algorithm, so one instance serves several runs.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from gossip.core.channel import ArcRoute, check_stateless
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError, ContractError

if TYPE_CHECKING:
    import torch

    from gossip.compress import Compressor
    from gossip.core.activation import Activation, Message
    from gossip.core.block import Block

Round = Generator[Any, Any, None]
"""A round: yields a phase's :class:`~gossip.core.staging.Rows`, receives them exchanged."""


@dataclass(frozen=True)
class ArcsForm:
    """What a method's robust per-arc form declares (its ``arcs`` option:
    :meth:`Algorithm.with_arcs`, registered as ``<name>-arcs``).

    The form runs the method's own code: its channels, built with ``route=self.route(...)``
    (:meth:`Algorithm.route`), keep one copy per arc, held by both ends and moved by both only
    when the message was delivered (the sender learns it from an acknowledgement: ``on_loss``
    is ``"ack"``), so a lost message only delays. What changes is what it declares:

    Attributes:
        state_copies: its :attr:`Algorithm.state_copies`.
        neighbor_copies: its :attr:`Algorithm.neighbor_copies` (the copies kept per arc).
        requires: its :attr:`Algorithm.requires` (per-arc copies need a static graph with a
            symmetric W; one message per arc a stateless compressor, which the form's
            :meth:`~Algorithm.validate` checks whatever ``requires`` says).
    """

    state_copies: int
    neighbor_copies: int
    requires: Requirements


class Algorithm(ABC):
    """A decentralized algorithm: ``setup(block)`` allocates the run's state, ``step(block)``
    runs one round for every node the process hosts (docs/extending.md).

    The instance is configuration only: its constructor checks and stores hyper-parameters,
    and nothing a run derives is stored on it (that goes to the block). What the algorithm
    *needs* of a run is one value, :attr:`requires` (graph kind, gradients, compressor; see
    :class:`~gossip.core.requirements.Requirements`), checked once by the engine before
    any message, so bad runs are refused up front. What it *offers* to scripts (``trains``,
    ``takes_optimizer``, ``tunable``, ``step_schedule``, ``step_rule``, ``needs_layout``,
    :meth:`suggest_hparams`) stays in separate class attributes: each is read on its own by the
    script that picks a flag or a default, and nothing checks them together. Scripts read these,
    never lists of names, so a registered algorithm of a user's gets the same treatment.

    Per-node tensors live in ``block.state``; anything else an algorithm keeps between rounds
    belongs in :meth:`state_dict` (the :class:`gossip.stateful.Stateful` protocol). A page per
    algorithm in ``docs/algorithms/`` gives its update, messages and state;
    ``docs/extending.md`` shows how to write one.
    """

    name: ClassVar[str]
    requires: ClassVar[Requirements] = Requirements()
    """What a run must offer it (default: a static symmetric graph, no gradients needed, any
    compressor). A subclass changes it with ``dataclasses.replace(Parent.requires, ...)``."""
    trains: ClassVar[bool] = False
    """Uses gradients when the node has an oracle, so it can train a model or solve a problem."""
    overlaps: ClassVar[str | None] = None
    """Its round leaves ``x`` alone once its first phase is sent (only copies and sums change
    after), so ``--overlap`` may compute gradients while those messages travel
    (docs/overlap.md): ``"next"`` when the round takes its gradient before sending (the next
    round's is computed ahead; :func:`gossip.wrap` can overlap it too), ``"within"`` when it
    takes it after sending, at the model it sent (D-PSGD). A round that breaks this is caught,
    not mixed in."""
    takes_optimizer: ClassVar[bool] = False
    """Its local step goes through :func:`local_step`, so a node's ``torch.optim`` optimizer
    (momentum, Adam, weight decay) applies; otherwise it uses the plain gradient with ``eta``."""
    tunable: ClassVar[tuple[str, ...]] = ()
    """Hyper-parameters that ``--gamma auto`` may search on a grid (e.g. ``("gamma",)``)."""
    step_schedule: ClassVar[bool] = False
    """Its ``eta`` may be a schedule ``eta(t)`` (learning-rate warm-up, decay); otherwise constant."""
    needs_layout: ClassVar[bool] = False
    """Works per matrix-shaped tensor of the model, so it always gets the model's layout."""
    state_copies: ClassVar[int] = 4
    """How many model-sized vectors (``d`` entries) a run keeps per node, counting ``x``, its
    ``block.state`` and ``block.workspace`` tensors, scratch and the rows it sends; read by
    :mod:`gossip.memory` to refuse a run too large for the machine before anything is allocated.
    An upper bound (``tests/algorithms/test_memory.py`` measures the built-in ones); a new
    algorithm that does not say gets 4."""
    neighbor_copies: ClassVar[int] = 0
    """Model-sized vectors kept per node *and per neighbor* (per-edge state such as
    PowerGossip's warm starts or C-ECL's duals), on top of :attr:`state_copies`."""
    wide_copies: ClassVar[int] = 0
    """Of :attr:`state_copies`, the vectors kept or summed in the wider dtype of a 16- or
    32-bit model (a channel's copies and gap and the weighted sums of its messages,
    :data:`gossip.core.channel.WIDER`: float64 for a float32 model), which the memory estimate
    counts at the wider dtype's size."""
    step_rule: ClassVar[str] = "tracking"
    """How :meth:`suggest_hparams` picks ``eta`` from the base step ``1/L`` (``1/(6 L_max)`` for
    sampled gradients): ``"exact"`` — primal-dual methods that converge with it (LEAD);
    ``"dgd"`` — the model mixes and steps, stable only for ``η < (1 + λ_min(W))/L``, so the
    base step times ``min(1, 0.9 (1 + λ_min))`` (½ without a topology); ``"tracking"`` —
    gradient tracking, a fifth of it. The default is the cautious ``"tracking"``, so a new
    algorithm that does not say otherwise still gets a step that converges."""
    federated: ClassVar[bool] = False
    """A server–clients method on a star (node 0 the server, holding the run's model; nodes
    1..n−1 the clients, holding the data; docs/algorithms/fedavg.md): the run's model is the
    server's ``x``, so metrics read it instead of the nodes' average, and the log splits the
    bits into ``bits_up_per_client`` and ``bits_down_per_client``."""
    counts: ClassVar[tuple[str, ...]] = ()
    """``block.state`` keys holding one count per node ([m] tensors, e.g. CADA's
    ``cada.uploads_skipped``): every log record sums each over the nodes, under the key's part
    after its last dot, and adds :meth:`log_fields` of the sums (what happened, not a model of it)."""
    on_loss: ClassVar[str | None] = None
    """What a lost message means to it (``--network loss=...``; docs/network.md): ``"renormalize"``
    (its messages are values the receiver averages: a lost neighbor's weight goes to the
    receiver's own term), ``"drop"`` (its messages are increments to copies the receiver
    keeps: a lost one adds nothing, and the receiver's copy of the sender drifts), ``"keep-mass"``
    (push-sum: the sender keeps the share it could not send), ``"ack"`` (its phases send one
    message per arc and it reads which arrived, ``rows.route.out_delivered`` / ``in_delivered``:
    choco-arcs, lead-arcs, prox-lead-arcs, beer-arcs, c-gt-arcs and c-ecl, whose two ends of an
    arc apply a message only when it was delivered), ``"edge"`` (an edge either of whose
    messages is lost sits the phase out at both ends: PowerGossip, EXTRA), ``"running-sum"`` (its
messages carry running sums and a counter, :mod:`gossip.core.running`: a lost one adds
nothing, late ones are handed over unordered and the receiver keeps the newest;
robust-push-sum, robust-push-tracking). None (the default):
    not defined, and a run that may lose messages is refused before it starts."""

    arcs: ClassVar[bool] = False
    """The method's robust per-arc form (its ``arcs`` option, :meth:`with_arcs`): its channels
    route per arc with acknowledged copies (:meth:`route`) and :attr:`on_loss` is ``"ack"``."""
    arcs_form: ClassVar[ArcsForm | None] = None
    """What the method's per-arc form declares (:class:`ArcsForm`; None: it has none). Offered
    only by a class that declares it itself: a subclass re-declares it to keep it (its changes
    may not hold per arc). :func:`~gossip.algorithms.register_algorithm` registers the form
    as ``<name>-arcs`` beside the method."""

    loss_requires: ClassVar[Requirements | None] = None
    """What :attr:`on_loss` holds only with (None: every run it runs): a run that may lose or
    delay messages also checks the run's compressor against it, before any message (push-sum's
    exact form keeps a lost share at its sender; its compressed form is refused under loss)."""

    asynchronous: ClassVar[bool] = False
    """Runs on events in virtual time, not in rounds (:mod:`gossip.network.events`,
    docs/asynchronous.md): the engine calls :meth:`activate` each time a node's clock rings and
    :meth:`receive` for each message that arrives, and never :meth:`step`."""
    clock: ClassVar[str] = "compute"
    """An asynchronous algorithm's clocks (:data:`gossip.core.activation.CLOCKS`): ``"compute"``
    (a node rings when its local step ends) or ``"poisson"`` (randomized gossip's clocks)."""
    contact: ClassVar[str] = "exchange"
    """How an asynchronous algorithm's activation talks to its peer: ``"exchange"``
    (:meth:`Activation.exchange <gossip.core.activation.Activation.exchange>`: a message the
    peer's :meth:`receive` answers at once) or ``"post"`` (:meth:`Activation.post
    <gossip.core.activation.Activation.post>`: a one-way message, taken in by :meth:`receive`
    after the arc's delay). Declared, so that every process knows the trace."""
    peer: ClassVar[str] = "random"
    """Whom an activation talks to (:data:`gossip.core.activation.PEERS`): ``"random"`` (a uniform
    present out-neighbor) or ``"next"`` (the out-neighbors in turn)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse the former need-flags, which nothing reads any more (a class declaring one
        would silently run where it should be refused)."""
        super().__init_subclass__(**kwargs)
        former = sorted(_FORMER_NEEDS & set(vars(cls)))
        if former:
            raise ConfigError(
                f"{cls.__name__} declares {', '.join(former)}: an algorithm says what it needs in "
                "one value, requires = Requirements(graph=Graph(static=..., symmetric=..., "
                "complete=...), gradients=..., compressor=...) (gossip.core.requirements)"
            )

    @classmethod
    def with_arcs(cls) -> type[Algorithm]:
        """The method with its ``arcs`` option on: the class the registry names ``<name>-arcs``,
        made once from :attr:`arcs_form` (the method's code; the form's traits, ``on_loss =
        "ack"``, and a :meth:`validate` that also refuses a stateful compressor). Itself when
        it is that form already; :class:`ConfigError` for a method without one."""
        if cls.arcs:
            return cls
        form = vars(cls).get("arcs_form")
        if form is None:
            raise ConfigError(f"{cls.name} has no per-arc form (arcs=True): its class declares "
                              "no arcs_form (docs/extending.md, 'Robust per arc')")
        made = _ARCS_FORMS.get(cls)
        if made is None:
            made = _ARCS_FORMS[cls] = _arcs_class(cls, form)
        return made

    def route(self, **options: Any) -> str | ArcRoute:
        """The route of the method's channels: ``"broadcast"``, or in its per-arc form
        (:attr:`arcs`) an :class:`~gossip.core.channel.ArcRoute` with ``options`` (the
        per-arc copies' ``keys``, ``draws``, ``stream``), so that one channel call serves both
        forms: ``Channel(block, "y", memory=a, keys=("h", "gap"), route=self.route(...))``."""
        return ArcRoute(**options) if self.arcs else "broadcast"

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """Step sizes that converge on ``problem`` (one with ``smoothness()``), by keyword.

        ``eta`` follows :attr:`step_rule`; ``topology`` (optional) sharpens the ``"dgd"`` rule
        with its smallest mixing eigenvalue. Only hyper-parameters the constructor takes are
        returned. Algorithms with other needs override this.
        """
        import inspect

        from gossip.problems.factory import default_hparams

        if not cls.trains:
            return {}
        accepted = set(inspect.signature(cls.__init__).parameters)
        eta = default_hparams(problem, estimator)["eta"] * _step_factor(cls.step_rule, topology)
        return {"eta": eta} if "eta" in accepted else {}

    def state_dict(self) -> dict[str, Any]:
        """Run-wide state beyond ``node.state`` (none by default), saved by checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        if state:
            raise ConfigError(f"{self.name} keeps no run-wide state, but the checkpoint holds {sorted(state)}")

    def validate(self, topology: Any, compressor: Compressor) -> None:
        """Raise :class:`ConfigError` for a topology or compressor this algorithm cannot use
        beyond what :attr:`requires` says (a node count, the weights' kind, a hyper-parameter
        against the graph); called by the engine after ``requires.check``, before any node
        exists. It must not change the algorithm."""

    def validate_block(self, block: Block) -> None:
        """Raise :class:`ConfigError` for what this process's nodes cannot run with beyond
        :meth:`validate` (their oracles, their model size against a hyper-parameter); called by
        the engine once the block exists, before :meth:`setup` (which :func:`gossip.wrap` runs
        at the first step), so a bad run is refused when it is built."""

    def setup(self, block: Block) -> None:
        """Allocate ``block.state`` ([m, ...] tensors, row r = node r; checkpointed) and
        ``block.workspace`` (scratch), fill derived defaults into ``block.hparams``, before
        round 1 (nothing by default)."""

    @abstractmethod
    def step(self, block: Block) -> Round:
        """One round for every node of ``block``: tensor ops over its rows, ``yield`` of each
        phase's messages (``block.encode(...)``; the yield gives them back, exchanged), and
        ``block.mix_into`` / ``block.decode_add`` to use them."""

    def activate(self, block: Block, event: Activation) -> None:
        """An asynchronous algorithm's work when node ``event.node``'s clock rings (its row
        ``event.row``): tensor ops on the rows of ``block``, partners and messages through
        ``event`` (:class:`~gossip.core.activation.Activation`)."""
        raise ContractError(f"{self.name} is not asynchronous: it runs in rounds (step)")

    def message_like(self, block: Block, row: int) -> tuple[torch.Tensor, ...]:
        """Tensors shaped like the parts of a message to row ``row`` (a post, or an
        exchange's request; its reply is sized alike): the receiving process sizes its
        buffers by them."""
        raise ContractError(f"{self.name} declares no messages (message_like)")

    def receive(self, block: Block, message: Message) -> None:
        """An asynchronous algorithm's work when ``message`` arrives at its receiver, block row
        ``message.row``: a post (:meth:`Activation.post
        <gossip.core.activation.Activation.post>`), or an exchange's request
        (:meth:`Activation.exchange <gossip.core.activation.Activation.exchange>`), which it
        answers once with :meth:`message.reply <gossip.core.activation.Message.reply>`
        before it changes what the reply carries (``message.parts`` is None when the network
        lost the request: the reply may still reach the sender)."""
        raise ContractError(f"{self.name} receives no messages, yet one arrived")

    def log_fields(self, totals: dict[str, float]) -> dict[str, Any]:
        """The log record's fields from the sums of :attr:`counts` over the nodes (by default
        the sums themselves; a method adds the rates it derives from them)."""
        return dict(totals)

    def hparams(self) -> dict[str, Any]:
        """The constructor's hyper-parameters (the log's config record; ``block.hparams``
        starts from them)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


_ARCS_FORMS: dict[type[Algorithm], type[Algorithm]] = {}
"""Each method's per-arc form (:meth:`Algorithm.with_arcs`), made once."""


def _arcs_class(cls: type[Algorithm], form: ArcsForm) -> type[Algorithm]:
    """``cls`` with its ``arcs`` option on: a subclass that adds no code, only the traits
    ``form`` declares, ``on_loss = "ack"`` and the per-arc stateless check."""
    name = f"{cls.name}-arcs"
    own_validate = cls.validate

    def validate(self: Algorithm, topology: Any, compressor: Compressor) -> None:
        own_validate(self, topology, compressor)
        check_stateless(self.name, compressor)  # one message per arc: one compressor for all

    doc = (f"{cls.__name__} with its ``arcs`` option on (``{name}``): every channel keeps one "
           "copy per arc, moved at both ends only when its message is delivered, so a lost "
           f"message only delays. See docs/algorithms/{name}.md.\n\n{inspect.getdoc(cls)}")
    def __reduce__(self: Algorithm) -> tuple[Any, ...]:  # pickled by its method, not by name
        return _rebuild_arcs, (cls, dict(vars(self)))

    attrs = {"__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}Arcs",
             "__doc__": doc, "name": name, "arcs": True, "arcs_form": None, "on_loss": "ack",
             "state_copies": form.state_copies, "neighbor_copies": form.neighbor_copies,
             "requires": form.requires, "validate": validate, "__reduce__": __reduce__}
    return type(f"{cls.__name__}Arcs", (cls,), attrs)


def _rebuild_arcs(method: type[Algorithm], state: dict[str, Any]) -> Algorithm:
    """An unpickled instance of ``method``'s per-arc form with the attributes ``state``."""
    form = method.with_arcs()
    obj = form.__new__(form)
    obj.__dict__.update(state)
    return obj


_FORMER_NEEDS = frozenset({"static_topology", "symmetric", "needs_oracle", "needs_complete_graph",
                           "takes_compressor"})


class Asynchronous(Algorithm):
    """The base of asynchronous algorithms (:attr:`Algorithm.asynchronous`): they define
    :meth:`activate` and, for the messages it sends, :meth:`receive` and :meth:`message_like`,
    instead of a round."""

    asynchronous = True

    batch_exchanges: ClassVar[bool] = False
    """An ``exchange`` method whose activation is one exchange with its peer and nothing
    else, and whose two ends' updates read only the pair's rows: the event loop then
    applies runs of consecutive exchanges between disjoint pairs of local nodes in one call
    of :meth:`exchange_pairs` (disjoint pairs commute, so the result is the one of the events
    one by one, bit for bit). Its messages are sized alike for every row (``message_like``)."""

    def exchange_pairs(self, block: Block, rows_i: torch.Tensor, rows_j: torch.Tensor,
                       j_heard: torch.Tensor, i_heard: torch.Tensor) -> None:
        """The exchanges of initiators ``rows_i`` with peers ``rows_j`` (block rows, no row
        twice), as :meth:`activate` and the peer's :meth:`receive` would do them one pair after
        another; ``j_heard`` / ``i_heard`` (bool) say whether the peer heard the initiator's
        message and the initiator the reply (only with :attr:`batch_exchanges`)."""
        raise ContractError(f"{self.name} declares no batched exchanges (batch_exchanges)")

    def step(self, block: Block) -> Round:
        raise ContractError(f"{self.name} is asynchronous: it runs on events (activate), not "
                            "rounds; run it through an Engine, which drives its events")

    def rejoin(self, block: Block, node: int, x0: torch.Tensor) -> None:
        """Node ``node`` comes back fresh from churn (``--network churn=...,fresh``), called on
        every process: a process hosting it starts it again from ``x0`` (its initial model);
        methods with more state reset it too (and their copies of it at its neighbors)."""
        if node in block.ids:
            block.x[block.ids.index(node)].copy_(x0)


def _step_factor(rule: str, topology: Any) -> float:
    """The multiple of the base step ``1/L`` that :attr:`Algorithm.step_rule` allows."""
    if rule == "exact":
        return 1.0
    if rule == "tracking":
        return 0.2
    if rule != "dgd":
        raise ConfigError(f"step_rule {rule!r} is not one of 'exact', 'dgd', 'tracking'")
    spectrum = getattr(topology, "spectrum", None)
    lam = getattr(spectrum, "lambda_min", None)
    if lam is None or lam != lam:
        return 0.5
    return min(1.0, 0.9 * (1.0 + float(lam)))


def scheduled(value: float | Callable[[int], float], t: int) -> float:
    """A constant hyper-parameter, or a schedule evaluated at round ``t``."""
    return float(value(t)) if callable(value) else float(value)


def check_range(name: str, value: float, low: float, high: float, hint: str = "", *,
                include_low: bool = False, include_high: bool = True) -> None:
    """Raise :class:`ConfigError` unless ``value`` lies in the interval from ``low`` to
    ``high`` (default ``(low, high]``; ``include_low`` closes it below, ``include_high=False``
    opens it above). A schedule (a callable) is not checked."""
    if callable(value):
        return
    above = value >= low if include_low else value > low
    below = value <= high if include_high else value < high
    if not (above and below) or value != value:
        interval = f"{'[' if include_low else '('}{low}, {high}{']' if include_high else ')'}"
        raise ConfigError(f"{name} = {value} is outside {interval}. {hint}".rstrip())
