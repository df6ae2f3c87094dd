"""A noisy channel (``--network noise=V``, docs/network.md): every delivered message of a
synchronous round reaches its receiver as its decoded values plus independent Gaussian noise.

**Where the noise is.** Receiver i's copy of sender j's message in phase k of round t is
``C(q_j) + σ·z_ji``, with ``C(q_j)`` the decoded values (``d`` of them: the message's row
before encoding) and ``z_ji`` standard normals drawn from (seed, arc j → i, round t, phase k)
(:class:`gossip.network.NoiseDraws`). Every use of that message in the round sees the same
noisy values: :meth:`~gossip.core.block.Block.mix_into` adds ``w_ij·(C(q_j) + σ z_ji)`` (the
weights of the plan it mixes with, its ``scale`` and ``alpha``), and
:meth:`~gossip.core.block.Block.decode_received` (one message per arc) ``w_e·(C(q_e) + σ z_e)``.
The sender's own rows (its own term, its own copy of what it sent) carry no noise: they never
crossed the channel. The bytes on the wire do not change (``bits_per_node`` is the noiseless
run's); a lost message carries none (it is not delivered).

As the noise is added to the decoded values, it is dense whatever the compressor: a top-k
message's receiver gets noise on every coordinate, as a receiver that decodes into a d-vector
and then hears it through an analog channel would. Raw message rows an algorithm lays out
itself (``block.message_rows``: flags, PowerGossip's sketches, push-sum's weights, the
all-reduces' chunks) have no decoded values to perturb and are refused in one line when the
phase is sent.

The noise terms are added after the noiseless mix, slot by slot of the plan (neighbors in
sorted order, one addition per receiving row and slot), so the result is the same bits in one
process and under MPI.
"""

from __future__ import annotations

from typing import Any

import torch

from gossip.core.cache import IdentityCache
from gossip.core.routing import ArcPlan, MixPlan
from gossip.core.staging import PackedRows, Rows
from gossip.errors import ConfigError
from gossip.network.draws import NoiseDraws, arc_keys
from gossip.network.spec import Network


class ChannelNoise:
    """The run's noisy channel: :meth:`attach` gives a phase's :class:`Rows` (and a packed
    phase's parts) the :class:`MessageNoise` a receiver's decode adds."""

    def __init__(self, network: Network, seed: int, ids: list[int], name: str):
        self.network = network
        self.std = network.noise.std
        self.seed = seed
        self.ids = ids
        self.name = name
        self._draws = IdentityCache()

    def slot_draws(self, plan: MixPlan) -> list[NoiseDraws]:
        """One :class:`NoiseDraws` per slot of ``plan`` (its arcs ``sender → receiver``)."""
        def build() -> list[NoiseDraws]:
            out = []
            for src, dst, _ in plan.slots:
                rows = range(plan.m) if dst is None else dst.tolist()
                arcs = [(plan.sender_of[s], self.ids[r]) for s, r in zip(src.tolist(), rows)]
                out.append(NoiseDraws(self.seed, arc_keys(arcs)))
            return out

        return self._draws.get(plan, build, "slots")

    def arc_draws(self, route: ArcPlan) -> NoiseDraws:
        """The :class:`NoiseDraws` of ``route.incoming`` (an arc phase's received messages)."""
        return self._draws.get(route, lambda: NoiseDraws(self.seed, arc_keys(route.incoming)),
                               "incoming")

    def attach(self, phase: Rows, t: int, index: int) -> None:
        """Give phase ``index`` of round ``t`` its noise (refusing raw rows, module doc)."""
        parts = phase.parts if isinstance(phase, PackedRows) else [phase]
        raw = [p for p in parts if p.compressor is None or p.like is None]
        if raw:
            raise ConfigError(
                f"--network {self.network.spec()}: {self.name} sends raw message rows it lays "
                "out itself (flags, sketches, weights, chunks) in round "
                f"{t}, phase {index}; noise= perturbs decoded message values and has no meaning "
                "for those: run it without noise=")
        sizes = [p.like.numel() for p in parts]
        total, offset = sum(sizes), 0
        shared: dict[Any, torch.Tensor] = {}
        for p, d in zip(parts, sizes):
            p.noise = MessageNoise(self, t, index, total, offset, d, shared)
            offset += d


class MessageNoise:
    """The noise of one phase's messages (one part of a packed phase: values
    ``offset .. offset + d`` of the phase's ``total`` drawn per arc), added by the block's
    decodes of received messages (module doc)."""

    def __init__(self, channel: ChannelNoise, t: int, phase: int, total: int, offset: int,
                 d: int, shared: dict[Any, torch.Tensor]):
        self.channel, self.t, self.phase = channel, t, phase
        self.total, self.offset, self.d = total, offset, d
        self._shared = shared  # normals by draws object, shared by a packed phase's parts

    def _noise(self, draws: NoiseDraws) -> torch.Tensor:
        """[arcs, d] σ·z of this part (drawn once per phase and set of arcs)."""
        z = self._shared.get(draws)
        if z is None:
            z = self._shared[draws] = draws.normals(self.t, self.phase, self.total).mul_(
                self.channel.std)
        return z[:, self.offset : self.offset + self.d]

    def add_mixed(self, out: torch.Tensor, plan: MixPlan, factor: float) -> None:
        """``out[i] += factor · Σ_j w_ij σ z_ji`` over the neighbor terms of ``plan``, slot by
        slot (what :meth:`~gossip.core.block.Block.mix_into` adds to its noiseless sum)."""
        for (_, dst, w), draws in zip(plan.slots, self.channel.slot_draws(plan)):
            if w.numel() == 0:
                continue
            term = self._noise(draws).to(out.device).mul((w * factor).unsqueeze(1))
            term = term.to(out.dtype)
            if dst is None:
                out.add_(term)
            else:
                out.index_add_(0, dst, term)

    def add_received(self, out: torch.Tensor, route: ArcPlan, weight: Any,
                     keep: torch.Tensor | None, dst: torch.Tensor | None) -> None:
        """``out[dst[e]] += weight[e] · σ z_e`` for the incoming arcs ``keep`` (None: every
        one; rows ``dst``, None: ``keep`` itself) of an arc phase (what
        :meth:`~gossip.core.block.Block.decode_received` adds)."""
        z = self._noise(self.channel.arc_draws(route)).to(out.device)
        if keep is not None:
            z = z.index_select(0, keep)
        if isinstance(weight, torch.Tensor):
            w = weight.reshape(-1).to(z.device, torch.float64)
            term = z.mul(w.unsqueeze(1) if w.numel() > 1 else w)
        else:
            term = z.mul(float(weight))
        term = term.to(out.dtype).reshape(z.shape[0], *out.shape[1:])
        rows = dst if dst is not None else (keep if keep is not None else None)
        if rows is None:
            out.add_(term)
        else:
            out.index_add_(0, rows, term)


__all__ = ["ChannelNoise", "MessageNoise"]
