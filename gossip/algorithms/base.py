"""What an algorithm is: per-node state plus a round written as a generator.

A round yields :class:`Exchange` messages and receives the inbox back, so the code reads like
the paper's update and never touches a transport::

    q = node.compressor.encode(node.x - x_hat, node.rng)
    inbox = yield Exchange.broadcast(q.to_bytes(), capacity)
    for j, buf in inbox.items():          # sorted by sender id
        node.compressor.decode_add_(s, node.compressor.from_bytes(buf, s), node.weight(j))

Every node of a run yields the same number of exchanges per round.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gossip.errors import GossipError
from gossip.rng import Stream

if TYPE_CHECKING:
    from gossip.compress.base import Compressor
    from gossip.layout import Layout


class ConfigError(GossipError, ValueError):
    """An algorithm was configured with values it cannot run with (named in the message)."""


@dataclass
class Exchange:
    """One message phase: bytes to each out-neighbor, bytes from each in-neighbor.

    ``send`` is one uint8 buffer for every out-neighbor (a broadcast) or a mapping
    ``{neighbor id: buffer}``. ``capacity`` bounds what any in-neighbor may send in this
    phase (it sizes MPI receive buffers; a larger message is an error, never a truncation).
    """

    send: torch.Tensor | Mapping[int, torch.Tensor]
    capacity: int

    @classmethod
    def broadcast(cls, buf: torch.Tensor, capacity: int | None = None) -> Exchange:
        return cls(buf, buf.numel() if capacity is None else capacity)

    def buffer_for(self, j: int) -> torch.Tensor:
        return self.send[j] if isinstance(self.send, Mapping) else self.send


Inbox = dict[int, torch.Tensor]
"""Sender id -> received uint8 buffer, in sorted sender order; valid until the next yield."""


@dataclass
class Node:
    """Everything one node's round may read or change.

    ``x`` is the node's flat model (its shape is described by ``layout``), ``state`` holds the
    algorithm's tensors (tensors or lists of tensors only: checkpoints copy them in place).
    Randomness: ``rng`` is the node's :class:`gossip.rng.Stream` (counter-based, keyed by
    (run seed, node, round, call): pass it to ``compressor.encode``), :meth:`stream_rng` gives
    the stream of a named extra message stream, and :meth:`edge_rng` randomness shared with
    neighbor ``j`` (keyed by the unordered edge: both ends draw the same numbers). The engine
    calls :meth:`begin_round` every round, which is all these streams need to be
    reproducible (no state to checkpoint). ``generator`` (a ``torch.Generator``) stays for the
    oracle's sampling. ``oracle`` gives gradients (None for pure consensus). ``compressor``
    encodes the node's main stream of messages; an algorithm that sends a second stream (a
    gradient tracker) gets its own instance from :meth:`stream_compressor`, so stateful
    compressors never mix streams and checkpoints save every one.
    """

    id: int
    x: torch.Tensor
    layout: Layout
    view: Any  # topologies.NodeView of the current round
    compressor: Compressor
    generator: torch.Generator
    edge_seed: Any = None  # callable (j) -> int, seed shared with neighbor j (legacy; unused here)
    oracle: Any = None
    round: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    new_compressor: Callable[[], Compressor] | None = None
    compressors: dict[str, Compressor] = field(default_factory=dict)
    seed: int = 0  # the run seed: every Stream of the node derives from it
    rng: Stream | None = None
    _rngs: dict[str, Stream] = field(default_factory=dict)
    _edge_rngs: dict[int, Stream] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rng is None:
            self.rng = Stream(self.seed, (self.id,), 0)
            self.rng.begin_round(self.round)

    def stream_compressor(self, stream: str) -> Compressor:
        """A compressor of the run's kind for the message stream ``stream`` (one per name)."""
        comp = self.compressors.get(stream)
        if comp is None:
            if self.new_compressor is None:
                raise ConfigError(f"node {self.id} has no compressor factory for stream {stream!r}")
            comp = self.compressors[stream] = self.new_compressor()
        return comp

    def stream_rng(self, stream: str) -> Stream:
        """The node's random stream for the message stream ``stream`` (one per name; the
        randomness to give ``stream_compressor(stream).encode``)."""
        rng = self._rngs.get(stream)
        if rng is None:
            rng = self._rngs[stream] = Stream(self.seed, (self.id,), stream)
            rng.begin_round(self.round)
        return rng

    def edge_rng(self, j: int) -> Stream:
        """The stream this node shares with neighbor ``j``: keyed by the unordered edge
        {id, j}, so both ends draw the same numbers when they make the same calls."""
        rng = self._edge_rngs.get(j)
        if rng is None:
            lo, hi = min(self.id, j), max(self.id, j)
            rng = self._edge_rngs[j] = Stream(self.seed, (lo << 32 | hi,), "edge")
            rng.begin_round(self.round)
        return rng

    def begin_round(self, t: int) -> None:
        """Enter round ``t``: sets ``round`` and the round of every stream of the node."""
        self.round = t
        self.rng.begin_round(t)
        for rng in self._rngs.values():
            rng.begin_round(t)
        for rng in self._edge_rngs.values():
            rng.begin_round(t)

    def weight(self, j: int) -> float:
        """``w_ij``: the weight this node gives to neighbor ``j``'s value (or its own)."""
        if j == self.id:
            return self.view.self_weight
        return self.view.weight_of(j)


RoundGenerator = Generator[Exchange, Inbox, None]
BlockRound = Generator[Any, Any, None]
"""A block round: yields :class:`gossip.block.Rows` and receives them back, exchanged."""


class Algorithm(ABC):
    """A decentralized algorithm: ``setup`` allocates a node's state, ``step`` runs one round.

    Class attributes say what the algorithm needs, so the engine refuses bad runs up front:
    ``static_topology`` (keeps neighbor state, so the graph cannot change between rounds),
    ``symmetric`` (needs ``W = Wᵀ``), ``needs_oracle`` (uses gradients), ``needs_complete_graph``
    (an all-reduce: every node talks to every other one). Scripts read the
    capabilities (``trains``, ``takes_optimizer``, ``tunable``, :meth:`suggest_hparams`), never
    lists of names, so a registered algorithm of a user's gets the same treatment.

    Per-node tensors live in ``node.state``; anything else an algorithm keeps between rounds
    belongs in :meth:`state_dict` (the :class:`gossip.stateful.Stateful` protocol). A page per
    algorithm in ``docs/algorithms/`` gives its update, messages and state;
    ``docs/extending.md`` shows how to write one.
    """

    name: ClassVar[str]
    static_topology: ClassVar[bool] = True
    symmetric: ClassVar[bool] = True
    needs_oracle: ClassVar[bool] = False
    needs_complete_graph: ClassVar[bool] = False
    """Runs a collective in which every node talks to every other one (an all-reduce), so it
    needs the static complete graph (``--topology complete``): the engine refuses any other
    before a message is sent, and tests and tools that pick a graph pick that one for it."""
    trains: ClassVar[bool] = False
    """Uses gradients when the node has an oracle, so it can train a model or solve a problem."""
    takes_compressor: ClassVar[bool] = True
    """Sends its messages through ``node.compressor``; ``False``: it takes only ``'none'`` (it
    compresses by itself, as the all-reduce methods and PowerGossip, or mixes exact models), so
    scripts whose default compressor is another one give it ``'none'`` unless one is asked for."""
    takes_optimizer: ClassVar[bool] = False
    """Its local step goes through :func:`local_step`, so a node's ``torch.optim`` optimizer
    (momentum, Adam, weight decay) applies; otherwise it uses the plain gradient with ``eta``."""
    tunable: ClassVar[tuple[str, ...]] = ()
    """Hyper-parameters that ``--gamma auto`` may search on a grid (e.g. ``("gamma",)``)."""
    step_schedule: ClassVar[bool] = False
    """Its ``eta`` may be a schedule ``eta(t)`` (learning-rate warm-up, decay); otherwise constant."""
    needs_layout: ClassVar[bool] = False
    """Works per matrix-shaped tensor of the model, so it always gets the model's layout."""
    step_rule: ClassVar[str] = "tracking"
    """How :meth:`suggest_hparams` picks ``eta`` from the base step ``1/L`` (``1/(6 L_max)`` for
    sampled gradients): ``"exact"`` — primal-dual methods that converge with it (LEAD);
    ``"dgd"`` — the model mixes and steps, stable only for ``η < (1 + λ_min(W))/L``, so the
    base step times ``min(1, 0.9 (1 + λ_min))`` (½ without a topology); ``"tracking"`` —
    gradient tracking, a fifth of it. The default is the cautious ``"tracking"``, so a new
    algorithm that does not say otherwise still gets a step that converges."""

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
        """Raise :class:`ConfigError` for a topology or compressor this algorithm cannot use."""

    def setup(self, node: Node) -> None:
        """Allocate and initialise ``node.state`` (called once, before round 1)."""
        raise ConfigError(_NO_ROUND.format(name=type(self).__name__))

    def step(self, node: Node) -> RoundGenerator:
        """One round for ``node``: local work, yields of :class:`Exchange`, mixing."""
        raise ConfigError(_NO_ROUND.format(name=type(self).__name__))

    # -- blocks: all of a process's nodes at once (gossip/block.py) -------------------------
    def setup_block(self, block: Any) -> None:
        """Allocate ``block.state`` ([m, ...] tensors, row r = node r) before round 1."""

    def block_step(self, block: Any) -> BlockRound:
        """One round for every node of ``block`` (a :class:`gossip.block.Block`): tensor ops
        over its rows, ``yield block.encode(...)`` per message phase (the yield returns the
        phase's messages), ``block.mix_into`` to mix. Algorithms that define it run as blocks:
        one vectorized round per process instead of one generator per node."""
        raise ConfigError(_NO_ROUND.format(name=type(self).__name__))

    @classmethod
    def runs_blocks(cls) -> bool:
        """True when the algorithm defines :meth:`block_step` (the engine then uses it)."""
        return cls.block_step is not Algorithm.block_step

    def hparams(self) -> dict[str, Any]:
        """Hyper-parameters for the log's config record."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


_NO_ROUND = ("{name} defines neither a per-node round (setup, step) nor a block round "
             "(setup_block, block_step); docs/extending.md shows both")


def check_complete(name: str, topology: Any, hint: str = "use --topology complete") -> None:
    """Raise :class:`ConfigError` unless every node is linked to every other one, in every round."""
    if getattr(topology, "time_varying", False):
        raise ConfigError(f"{name} is an all-reduce method and needs the static complete graph: {hint}")
    view_of = topology.at_round(1).view
    for i in range(topology.n):
        if len(view_of(i).out_neighbors) != topology.n - 1:
            raise ConfigError(
                f"{name} is an all-reduce method: every node talks to every other one, but node "
                f"{i} of '{topology.name}' has {len(view_of(i).out_neighbors)} of "
                f"{topology.n - 1} neighbors; {hint}"
            )


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


def send_payload(
    node: Node, payload: Any, like: torch.Tensor, compressor: Compressor | None = None
) -> Exchange:
    """An exchange broadcasting ``payload``; neighbors may send up to the compressor's bound."""
    return Exchange(payload.to_bytes(), (compressor or node.compressor).max_nbytes(like))


def mix_into(
    node: Node,
    out: torch.Tensor,
    own: Any | None,
    inbox: Inbox,
    *,
    own_weight: float | None = None,
    scale: float = 1.0,
    compressor: Compressor | None = None,
) -> torch.Tensor:
    """``out += scale·(w_ii·C(own) + Σ_j w_ij·C(q_j))``, decoding each message, sorted by sender.

    ``own`` is this node's own payload (skipped when None); ``own_weight`` overrides ``w_ii``;
    ``compressor`` overrides the node's (for messages sent uncompressed).
    """
    comp = compressor or node.compressor
    if own is not None:
        w_own = node.view.self_weight if own_weight is None else own_weight
        comp.decode_add_(out, own, scale * w_own)
    for j in sorted(inbox):
        comp.decode_add_(out, received(comp, inbox, j, out), scale * node.weight(j))
    return out


def received(comp: Compressor, inbox: Inbox, j: int, like: torch.Tensor) -> Any:
    """``comp.from_bytes`` of neighbor ``j``'s message for a tensor like ``like``.

    A refused message (NaN/Inf values, a corrupt header or body) raises the
    :class:`~gossip.compress.base.CompressionError` with ``sender = j``, so the engine's error
    names the node (and rank) that sent it rather than blaming the receiver.
    """
    from gossip.compress.base import CompressionError

    try:
        return comp.from_bytes(inbox[j], like)
    except CompressionError as exc:
        exc.sender = j
        raise


def local_step(node: Node, grad: torch.Tensor, eta: float) -> None:
    """``x_i ← x_i − η g``, or the node's own optimizer step on ``g`` when its oracle has one.

    Training oracles (momentum, Nesterov, Adam, weight decay…) expose ``apply_step(x, g, t)``;
    plain problem oracles do not, and get the SGD step.
    """
    apply = getattr(node.oracle, "apply_step", None)
    if apply is not None:
        apply(node.x, grad, node.round)
    else:
        node.x.add_(grad, alpha=-eta)


def scheduled(value: float | Callable[[int], float], t: int) -> float:
    """A constant hyper-parameter, or a schedule evaluated at round ``t``."""
    return float(value(t)) if callable(value) else float(value)


def check_range(name: str, value: float, low: float, high: float, hint: str = "") -> None:
    """Raise :class:`ConfigError` unless ``low < value <= high``."""
    if callable(value):
        return
    if not (low < value <= high) or value != value:
        raise ConfigError(f"{name} = {value} is outside ({low}, {high}]. {hint}".rstrip())


_LEN = 8  # bytes of each part-length field in a packed message


def pack(parts: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """Several byte buffers as one message: ``[count][len_1]…[len_k][bytes_1]…[bytes_k]``.

    The small header (8 bytes a field) travels and is counted like everything else.
    """
    device = parts[0].device
    header = torch.tensor([len(parts)] + [p.numel() for p in parts], dtype=torch.int64)
    total = header.numel() * _LEN + sum(p.numel() for p in parts)
    if out is None or out.numel() != total:
        out = torch.empty(total, dtype=torch.uint8, device=device)
    out[: header.numel() * _LEN].copy_(header.view(torch.uint8))
    pos = header.numel() * _LEN
    for p in parts:
        out[pos : pos + p.numel()].copy_(p)
        pos += p.numel()
    return out


def packed_capacity(capacities: list[int]) -> int:
    """The largest packed message for parts of at most these sizes."""
    return (len(capacities) + 1) * _LEN + sum(capacities)


def unpack_inbox(inbox: Inbox, count: int, capacities: list[int]) -> list[Inbox]:
    """Split every neighbor's :func:`pack`-ed message: one inbox per part, sorted by sender.

    A malformed message raises :class:`~gossip.compress.base.CompressionError` with ``sender``
    set, so the engine names the node that sent it (as :func:`received` does).
    """
    from gossip.compress.base import CompressionError

    parts: list[Inbox] = [{} for _ in range(count)]
    for j in sorted(inbox):
        try:
            split = unpack(inbox[j], count, capacities)
        except CompressionError as exc:
            exc.sender = j
            raise
        for part, buf in zip(parts, split):
            part[j] = buf
    return parts


def unpack(buf: torch.Tensor, count: int, capacities: list[int]) -> list[torch.Tensor]:
    """Split a :func:`pack`-ed message, checking the header against what may be sent."""
    from gossip.compress.base import CompressionError

    head = (count + 1) * _LEN
    if buf.numel() < head:
        raise CompressionError(f"packed message of {buf.numel()} bytes is shorter than its header")
    header = buf[:head].cpu().clone().view(torch.int64).tolist()
    if header[0] != count:
        raise CompressionError(f"packed message holds {header[0]} parts, expected {count}")
    sizes = header[1:]
    if any(s < 0 or s > c for s, c in zip(sizes, capacities)) or head + sum(sizes) != buf.numel():
        raise CompressionError(
            f"packed message part sizes {sizes} do not fit the bounds {capacities} / length "
            f"{buf.numel()}"
        )
    out, pos = [], head
    for s in sizes:
        out.append(buf[pos : pos + s])
        pos += s
    return out
