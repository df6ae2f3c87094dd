"""The server–clients phases of a federated round on a star: node 0 the server, 1..n−1 clients.

A federated algorithm is an ordinary :class:`~gossip.algorithms.Algorithm` on the star graph:
its round has two phases routed by arcs (:meth:`~gossip.core.block.Block.arc_plan`), so the
engine, the transports, byte counts, logs and checkpoints serve it unchanged::

    S = link.begin()                         # this round's clients, the same on every process
    inbox = yield link.broadcast(v)          # downlink: the server's v to every client of S
    link.receive(inbox, out)                 # out[r] = v for the block's sampled clients
    ... local work on the rows link.rows ...
    inbox = yield link.upload(U)             # uplink: C(u_i − h_i) from every client of S
    u_bar = link.average(inbox)              # on the server: (1/|S|) Σ_{i∈S} û_i

Only the arcs of sampled clients carry a message, so an unsampled client sends nothing and
its bits do not grow; the server sends |S| downlink messages. The sample comes from a
counter-based stream keyed by (seed, round) (:class:`ClientSampler`), so every process draws the
same clients without a message. The downlink is exact (the ``none`` compressor), or compressed
against an EF21 copy per client (``downlink``: the server keeps ``ĥ_i``, what client i knows,
sends ``C(v − ĥ_i)`` and both add it: what a compressor drops is sent in a later round, and a
client sampled after a long absence starts from its copy, not the model); the uplink
uses the run's compressor, with an EF21 memory per client (``memory="ef21"``): client i keeps
``h_i``, sends ``c_i = C(u_i − h_i)`` and sets ``h_i ← h_i + c_i``; the server keeps the same
``h_i`` of every client (per arc, ``block.arc_state``) and averages the new ``h_i`` of the
sampled ones, so what the compressor dropped goes out in a later round.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from gossip.compress import make
from gossip.errors import ConfigError, GossipError
from gossip.layout import Layout
from gossip.rng import Stream

SAMPLINGS = ("uniform", "replacement", "weighted", "fair")
"""``uniform``: k distinct clients, every k-subset equally likely; ``replacement``: k draws,
uniform and independent (a client drawn twice counts twice in the average); ``weighted``: k
independent draws with probability proportional to the client's weight (its data size: Li et
al.'s scheme, with the plain average of the draws an unbiased estimate of the weighted one);
``fair``: the k clients least recently drawn (never drawn first), ties broken by uniform keys:
every client is drawn once in every ⌈N/k⌉ rounds when all are online (our fairness rule:
least recently selected, docs/algorithms/fedavg.md)."""


class ClientSampler:
    """The clients of round t, from a stream keyed by (seed, round): identical on every process.

    Args:
        seed: the run seed.
        clients: number of clients N (nodes 1..N).
        per_round: clients drawn per round k (1 <= k <= N).
        sampling: ``"uniform"`` (without replacement) or ``"replacement"``.
        availability: probability that a client is online in a round (an independent
            Bernoulli trace per client and round); the k are drawn among the online ones (all
            of them when fewer are online).
        weights: one positive weight per client (``weighted`` only; its data size).
    """

    def __init__(self, seed: int, clients: int, per_round: int, sampling: str = "uniform",
                 availability: float = 1.0, weights: Any = None):
        if sampling not in SAMPLINGS:
            raise ConfigError(f"sampling {sampling!r} is not one of {', '.join(SAMPLINGS)}")
        if not 1 <= per_round <= clients:
            raise ConfigError(f"clients_per_round = {per_round} but the star has {clients} "
                              f"clients: give 1..{clients} (or more nodes)")
        self.weights = None
        if sampling == "weighted":
            w = np.asarray(weights if weights is not None else [], dtype=np.float64).reshape(-1)
            if w.size != clients or not (np.all(np.isfinite(w)) and np.all(w > 0)):
                raise ConfigError(f"sampling 'weighted' needs client_weights: {clients} positive "
                                  f"numbers (the clients' data sizes), got {w.size}")
            self.weights = w
        self.clients, self.per_round, self.sampling = clients, per_round, sampling
        self.availability = availability
        self.stream = Stream(seed, [0], "clients")
        self._last = np.zeros(clients, dtype=np.int64)  # fair: the round each was last drawn
        self._upto, self._pick = 0, []

    def sample(self, t: int) -> list[int]:
        """Round ``t``'s clients (ids 1..N, sorted, repeated when drawn twice). ``fair``
        depends on the rounds before: they are replayed (from their keyed draws) when ``t``
        is not the next round, so a resumed run draws what the uninterrupted one did."""
        if self.sampling != "fair":
            return self._draw(t)
        if t == self._upto:
            return list(self._pick)
        if t < self._upto:
            self._last[:], self._upto = 0, 0
        while self._upto < t:
            self._upto += 1
            self._pick = self._draw(self._upto)
            self._last[np.asarray(self._pick, dtype=np.int64) - 1] = self._upto
        return list(self._pick)

    def _draw(self, t: int) -> list[int]:
        s = self.stream
        s.begin_round(t)
        online = np.arange(1, self.clients + 1)
        if self.availability < 1.0:
            up = s.uniform(self.clients, dtype=torch.float64).numpy()[0] < self.availability
            online = online[up]
        if online.size == 0:
            return []
        k = min(self.per_round, online.size)
        if self.sampling == "uniform":
            keys = s.uniform(online.size, dtype=torch.float64).numpy()[0]
            chosen = online[np.argsort(keys, kind="stable")[:k]]
        elif self.sampling == "fair":  # oldest last draw first, then the uniform keys
            keys = s.uniform(online.size, dtype=torch.float64).numpy()[0]
            chosen = online[np.lexsort((keys, self._last[online - 1]))[:k]]
        elif self.sampling == "replacement":
            u = s.uniform(k, dtype=torch.float64).numpy()[0]
            chosen = online[np.minimum((u * online.size).astype(np.int64), online.size - 1)]
        else:  # inverse CDF of the online clients' weights, summed in id order
            u = s.uniform(k, dtype=torch.float64).numpy()[0]
            cdf = np.cumsum(self.weights[online - 1])
            at = np.searchsorted(cdf, u * cdf[-1], side="right")
            chosen = online[np.minimum(at, online.size - 1)]
        return sorted(int(i) for i in chosen)


class StarLink:
    """The two phases of a federated round for one block (module docstring).

    Build it in ``setup`` and keep it in ``block.workspace``.

    Args:
        block: the block (:class:`~gossip.core.block.Block`) of a star run.
        name: prefix of its state keys and random streams.
        sampler: the round's clients.
        up_dim, down_dim: entries of the uplink and downlink vectors.
        memory: ``None`` (``û_i = C(u_i)``) or ``"ef21"`` (the client memories above).
        downlink: a stateless compressor spec for the downlink (None: exact).
        down_start: every node's downlink vector before round 1 (the downlink copies' start).
        uplink: a compressor instance for the uplink, applied as it is to each whole
            ``up_dim`` row (a method that sparsifies several stacked vectors together);
            None: the run's compressor.
    """

    def __init__(self, block: Any, name: str, sampler: ClientSampler, up_dim: int, down_dim: int,
                 memory: str | None = None, downlink: str | None = None,
                 down_start: torch.Tensor | None = None, uplink: Any = None):
        if memory not in (None, "ef21"):
            raise ConfigError(f"uplink memory {memory!r} is not None or 'ef21'")
        self.block, self.name, self.sampler = block, name, sampler
        self.up_dim, self.down_dim, self.memory = up_dim, down_dim, memory
        self.exact = make("none")
        self.uplink = uplink if uplink is not None else self._compressor(block, block.compressor,
                                                                         up_dim)
        self.row_of = {i: r for r, i in enumerate(block.ids)}
        self.server_row: int | None = self.row_of.get(0)
        self.downlink = None
        if downlink is not None and not make(downlink).is_identity:
            self.downlink = self._compressor(block, make(downlink), down_dim)
            self._down_copies(down_start)
        self.sample: list[int] = []
        self.rows: list[int] = []
        """The block's rows of this round's (distinct) sampled clients, in id order."""
        self._bufs: dict[str, torch.Tensor] = {}
        x = block.x
        if memory is not None:
            every = block.arc_plan([(i, 0) for i in range(1, sampler.clients + 1)])
            self._own_arc = {i: a for a, (i, _) in enumerate(every.arcs)}
            for key, arcs, incoming in ((f"{name}.h", every.arcs, False),
                                        (f"{name}.h_server", every.incoming, True)):
                block.arc_state[key] = x.new_zeros((len(arcs), up_dim))
                block.arc_routes[key] = (every, incoming)

    @staticmethod
    def _compressor(block: Any, comp: Any, dim: int) -> Any:
        """``comp`` for a message of ``dim`` entries: per tensor of the model's layout, repeated
        when a message holds several models (SCAFFOLD's (Δy, Δc)), when the run compresses
        per tensor; ``comp`` itself for a flat model."""
        d = block.x.shape[1]
        layout = block.nodes[0].layout if block.nodes else None
        flat = layout is None or len(layout.shapes) == 1 and len(layout.shapes[0]) == 1
        if comp is block.compressor and (flat or dim == d):
            return comp
        if dim % d:
            raise ConfigError(f"a message of {dim} entries is not a whole number of models of {d}")
        try:
            return make(comp.spec, None if flat else Layout(list(layout.shapes) * (dim // d)))
        except GossipError as exc:
            raise ConfigError(f"a message of {dim // d} models needs the compressor "
                              f"'{comp.spec}' per tensor of the repeated layout: {exc}") from None

    def _down_copies(self, start: torch.Tensor | None) -> None:
        """The downlink's EF21 copies, per arc ``0 → i``: the server's of what client i knows
        (``{name}.down``) and client i's own (``{name}.down_client``), both starting at
        ``start`` (every node's downlink vector before round 1: one model for all)."""
        block, name = self.block, self.name
        every = block.arc_plan([(0, i) for i in range(1, self.sampler.clients + 1)])
        self._down_in = {i: e for e, (_, i) in enumerate(every.incoming)}
        for key, arcs, incoming, rows in (
                (f"{name}.down", every.arcs, False, [self.server_row] * len(every.arcs)),
                (f"{name}.down_client", every.incoming, True,
                 [self.row_of[i] for _, i in every.incoming])):
            copies = block.x.new_zeros((len(arcs), self.down_dim))
            if start is not None and rows:
                copies.copy_(start[torch.tensor(rows, dtype=torch.int64, device=copies.device)])
            block.arc_state[key] = copies
            block.arc_routes[key] = (every, incoming)

    def begin(self) -> list[int]:
        """Draw this round's clients (with repetition under ``replacement``)."""
        self.sample = self.sampler.sample(self.block.round)
        chosen = sorted(set(self.sample))
        self.distinct = chosen
        self.rows = [self.row_of[i] for i in chosen if i in self.row_of]
        return self.sample

    def _buf(self, key: str, rows: int, cols: int) -> torch.Tensor:
        x = self.block.x
        t = self._bufs.get(key)
        if t is None or t.shape != (rows, cols):
            t = self._bufs[key] = x.new_empty((rows, cols))
        return t

    # -- downlink ------------------------------------------------------------------------------
    def broadcast(self, v: torch.Tensor | None) -> Any:
        """The downlink rows: the server's ``v`` ([down_dim]; None where the block has no
        server) to every sampled client, exact; with a downlink compressor ``C(v − ĥ_i)``
        against the server's copy ``ĥ_i`` of what client i knows, and ``ĥ_i += C(v − ĥ_i)``."""
        block = self.block
        route = block.arc_plan([(0, i) for i in self.distinct])
        E = len(route.arcs)
        V = self._buf("down", E, self.down_dim)
        if E:
            V.copy_(v.expand(E, -1))
        if self.downlink is None:
            return block.encode(V, self.exact, route=route)
        H = block.arc_state[f"{self.name}.down"]
        sel = torch.tensor([i - 1 for _, i in route.arcs], dtype=torch.int64, device=V.device)
        if E:
            V.sub_(H.index_select(0, sel))
        rows = block.encode(V, self.downlink, block.arc_rng(route, f"{self.name}.down"),
                            route=route)
        if E:
            moved = H.index_select(0, sel)
            block.decode_add(moved, rows)
            H.index_copy_(0, sel, moved)
        return rows

    def receive(self, inbox: Any, out: torch.Tensor) -> None:
        """``out[r] = v`` for every row of a sampled client of the block (with a downlink
        compressor: the client's copy ``ĥ_i += C(v − ĥ_i)``, what it knows of ``v``)."""
        route = inbox.route
        if not route.incoming:
            return
        if self.downlink is None:
            out.index_fill_(0, route.in_dst, 0.0)
            self.block.decode_received(out, inbox, dst=route.in_dst)
            return
        H = self.block.arc_state[f"{self.name}.down_client"]
        sel = torch.tensor([self._down_in[i] for _, i in route.incoming], dtype=torch.int64,
                           device=H.device)
        self.block.decode_received(H, inbox, dst=sel)
        out.index_copy_(0, route.in_dst, H.index_select(0, sel))

    # -- power-of-choice: the candidates' losses up, the server's choice down -----------------
    def report(self, values: torch.Tensor) -> Any:
        """Candidates → server: one exact entry per sampled client of the block (``values`` is
        [m, 1]; only those rows are read), its local loss at the model that came down."""
        block = self.block
        route = block.arc_plan([(i, 0) for i in self.distinct])
        idx = torch.tensor([self.row_of[i] for i, _ in route.arcs], dtype=torch.int64,
                           device=values.device)
        Z = self._buf("report", len(route.arcs), 1)
        torch.index_select(values, 0, idx, out=Z)
        return block.encode(Z, self.exact, route=route)

    def reported(self, inbox: Any) -> dict[int, float]:
        """On the server: each candidate's value, by client id."""
        route = inbox.route
        got = self._buf("reported", len(route.incoming), 1).zero_()
        self.block.decode_received(got, inbox)
        return {i: float(got[e, 0]) for e, (i, _) in enumerate(route.incoming)}

    def announce(self, chosen: list[int] | None) -> Any:
        """Server → candidates: 1 to a chosen candidate, 0 to the others (``chosen``: None where
        the block has no server)."""
        block = self.block
        route = block.arc_plan([(0, i) for i in self.distinct])
        V = self._buf("announce", len(route.arcs), 1)
        keep = set(chosen or ())
        for e, (_, i) in enumerate(route.arcs):
            V[e, 0] = 1.0 if i in keep else 0.0
        return block.encode(V, self.exact, route=route)

    def narrow(self, inbox: Any, chosen: list[int] | None) -> None:
        """This round's clients become the chosen candidates, each once: ``chosen`` on the
        server's process, the flags that came down elsewhere (a process knows its own
        clients' choice; the uplink's route needs no more)."""
        if chosen is not None:
            keep = set(chosen)
        else:
            route = inbox.route
            got = self._buf("flags", len(route.incoming), 1).zero_()
            if route.incoming:
                self.block.decode_received(got, inbox)
            keep = {i for e, (_, i) in enumerate(route.incoming) if float(got[e, 0]) > 0.5}
        self.sample = sorted(keep)
        self.distinct = list(self.sample)
        self.rows = [self.row_of[i] for i in self.distinct if i in self.row_of]

    # -- uplink --------------------------------------------------------------------------------
    def upload(self, U: torch.Tensor, senders: list[int] | None = None) -> Any:
        """The uplink rows: ``C(u_i − h_i)`` (``C(u_i)`` without memory) for every sampled
        client of the block (``U`` is [m, up_dim]; only those rows are read). ``senders``: the
        sampled clients that send this round (default all; a lazily aggregated method's
        uploaders, known on the server and on each sender's own process)."""
        block = self.block
        route = block.arc_plan([(i, 0) for i in (self.distinct if senders is None else senders)])
        idx = torch.tensor([self.row_of[i] for i, _ in route.arcs], dtype=torch.int64,
                           device=U.device)
        Z = self._buf("up", len(route.arcs), self.up_dim)
        torch.index_select(U, 0, idx, out=Z)
        if self.memory is not None:
            H, sel = block.arc_state[f"{self.name}.h"], self._arcs(route.arcs)
            Z.sub_(H.index_select(0, sel))
        rows = block.encode(Z, self.uplink, block.arc_rng(route, f"{self.name}.up"),
                            route=route)
        if self.memory is not None and len(route.arcs):  # h_i ← h_i + c_i, what the server adds
            moved = H.index_select(0, sel)
            block.decode_add(moved, rows)
            H.index_copy_(0, sel, moved)
        self._sent = (rows, idx)
        return rows

    def delivered(self, out: torch.Tensor) -> None:
        """``out[r] = û_r``, what the server adds for each of the block's sampled clients (its
        new ``h_i`` with memory, else ``C(u_i)``), after :meth:`upload`: SCAFFOLD's clients
        move their control variates by it, so the server's ``c`` stays their mean."""
        rows, idx = self._sent
        if not idx.numel():
            return
        if self.memory is not None:
            got = self.block.arc_state[f"{self.name}.h"].index_select(0, self._arcs(rows.route.arcs))
        else:
            got = self.block.decode(rows, self._buf("own_up", idx.numel(), self.up_dim))
        out.index_copy_(0, idx, got)

    def client_memory(self, i: int) -> torch.Tensor:
        """Client i's uplink memory ``h_i`` (on its own process; ``memory="ef21"``): what the
        server holds of it."""
        return self.block.arc_state[f"{self.name}.h"][self._own_arc[i]]

    def server_memories(self) -> torch.Tensor:
        """On the server: every client's ``h_i`` as the server holds it ([N, up_dim], client
        1 first; ``memory="ef21"``)."""
        return self.block.arc_state[f"{self.name}.h_server"]

    def _arcs(self, arcs: list[tuple[int, int]]) -> torch.Tensor:
        return torch.tensor([self._own_arc[i] for i, _ in arcs], dtype=torch.int64,
                            device=self.block.x.device)

    def average(self, inbox: Any, weights: Any = None) -> torch.Tensor | None:
        """On the server: ``(1/|S|) Σ_{i∈S} û_i``, clients in id order, each as often as drawn
        (``û_i = h_i`` after the update with memory); with ``weights`` (one per client, e.g.
        its data size n_i) ``Σ_{i∈S} n_i û_i / Σ_{i∈S} n_i`` instead (McMahan et al.'s
        average). None elsewhere or for an empty sample."""
        if self.server_row is None or not self.sample:
            return None
        route = inbox.route
        got = self._buf("got_up", len(route.incoming), self.up_dim).zero_()
        self.block.decode_received(got, inbox)
        senders = [i for i, _ in route.incoming]
        if self.memory is not None:  # the server's copies of the senders' h_i
            Hs = self.block.arc_state[f"{self.name}.h_server"]
            sel = torch.tensor([i - 1 for i in senders], dtype=torch.int64, device=got.device)
            got.add_(Hs.index_select(0, sel))
            Hs.index_copy_(0, sel, got)
        acc = self._buf("avg", 1, self.up_dim).zero_()[0]
        count = {i: float(self.sample.count(i)) for i in senders}
        if weights is not None:
            count = {i: c * float(weights[i - 1]) for i, c in count.items()}
        for e, i in enumerate(senders):
            acc.add_(got[e], alpha=count[i])
        return acc.div_(len(self.sample) if weights is None else math.fsum(count.values()))
