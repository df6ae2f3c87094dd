"""All-reduce on the complete graph, as rounds of :class:`Exchange`, and the shared Adam helpers.

The all-reduce family (1-bit Adam, 0/1 Adam, 1-bit LAMB, Signum with majority vote, Adasum)
keeps every node's model and optimizer state identical: each round ends with the same averaged
quantity on every node. We build the collective from the engine's per-destination exchanges,
so it runs unchanged in one process and under ``mpiexec`` and its bytes are counted where they
are handed over.

:class:`ChunkedAllReduce` is a reduce-scatter followed by an all-gather. The flat input of
``D`` entries is zero-padded to ``D'`` and cut into ``n`` chunks of ``c = D'/n``; node ``j``
*serves* chunk ``j``::

    phase 1  node i sends chunk j of its (compressed) input to node j        (n−1 messages)
             node j averages its chunk over the n inputs, in node order
    phase 2  node j sends its averaged (compressed) chunk to every node      (n−1 messages)
             every node assembles the n chunks: the same vector everywhere

With ``codec="none"`` the chunks travel in full precision: ``2(n−1)·D'/n`` values per node, the
volume of a ring all-reduce. With a 1-bit codec (two-stage compression with worker and server
error feedback, the collective of 1-bit Adam), node i keeps a worker error ``e_i`` (``D'``
entries) and a server error ``s_i`` (its chunk, ``c`` entries)::

    z_i = pad(u_i) + e_i;   a_i = scale(z_i);   σ_i = sgn(z_i) (sgn(0) = +1);   e_i ← z_i − a_i σ_i
    phase 1: chunk j of σ_i (c bits) and a_i go to node j
    node j:  r_j = (1/n) Σ_i a_i σ_i[chunk j] + s_j;  b_j = scale(r_j);  τ_j = sgn(r_j)
             s_j ← r_j − b_j τ_j
    phase 2: (τ_j, b_j) go to every node;  ū[chunk j] = b_j τ_j

``scale`` is ``‖z‖₂/√len`` for ``sign_l2`` (norm preserving, DeepSpeed's choice) or
``‖z‖₁/len`` for ``sign_l1`` (the ``sign`` compressor's).

``codec="vote"`` is signSGD's majority vote on the same routing: phase 1 carries the signs only
(``c`` bits), node j returns ``sgn(Σ_i sgn(u_i))`` on its chunk, and a tie (possible for even n
only) gives 0, sent as a second bit plane (so ``2c`` bits back for even n, ``c`` for odd n).
No scales, no error feedback. For 1-bit codecs ``D'`` is a multiple
of ``n·lcm(n, 8)`` so that every chunk packs into whole bytes; the padding entries take part in
the scales (as in DeepSpeed). Per node and call that is ``2(n−1)(c/8 + itemsize)`` bytes, about
2 bits per coordinate. Scales travel in the working dtype (4 bytes in float32).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import torch

from gossip.algorithms.base import Algorithm, ConfigError, Exchange, Inbox, Node
from gossip.compress import bits
from gossip.compress.checks import Workspace

CODECS = ("none", "sign_l1", "sign_l2", "vote")


def sign_scale(z: torch.Tensor, codec: str) -> torch.Tensor:
    """The scale of ``scale·sgn(z)``: ``‖z‖₂/√len`` (``sign_l2``) or ``‖z‖₁/len`` (``sign_l1``)."""
    if codec == "sign_l2":
        return torch.linalg.vector_norm(z) / math.sqrt(z.numel())
    return z.abs().sum() / z.numel()


class ChunkedAllReduce:
    """The mean of a flat vector over all nodes, by reduce-scatter + all-gather (module doc).

    One instance serves every node of the process; each node's error buffers live in its
    ``node.state`` under ``key`` (``{key}_worker_error``, ``{key}_server_error``), so they are
    checkpointed; send buffers are kept here, per node.

    Args:
        n: number of nodes.
        numel: entries of the vector reduced (``D``).
        codec: ``none`` (full precision), ``sign_l1`` or ``sign_l2`` (1 bit per entry with
            worker and server error feedback), ``vote`` (majority vote of the signs).
        key: prefix of the state entries (two collectives on one node need two keys).
    """

    def __init__(self, n: int, numel: int, codec: str = "sign_l2", key: str = "ar"):
        if codec not in CODECS:
            raise ConfigError(f"all-reduce codec {codec!r} is not one of {', '.join(CODECS)}")
        self.n, self.numel, self.codec, self.key = n, numel, codec, key
        unit = n * math.lcm(n, 8) if self.compressed else n
        self.padded = max(unit, -(-numel // unit) * unit)
        self.chunk = self.padded // n
        self._work: dict[int, dict[str, torch.Tensor]] = {}
        self._ws = Workspace()

    @property
    def compressed(self) -> bool:
        return self.codec != "none"

    def nbytes(self, dtype: torch.dtype) -> int:
        """Bytes one node sends per call (both phases)."""
        return (self.n - 1) * (self._phase_nbytes(dtype, 1) + self._phase_nbytes(dtype, 2))

    def _phase_nbytes(self, dtype: torch.dtype, phase: int) -> int:
        """Bytes of one message of ``phase`` (1: to a chunk's server, 2: from it)."""
        item = torch.empty((), dtype=dtype).element_size()
        if self.codec == "vote":
            return self.chunk // 8 * (2 if phase == 2 and self.n % 2 == 0 else 1)
        return self.chunk // 8 + item if self.compressed else self.chunk * item

    def setup(self, node: Node) -> None:
        """Allocate node's error buffers (zero) in ``node.state`` and its send buffers."""
        x = node.x
        if self.codec in ("sign_l1", "sign_l2"):
            node.state[f"{self.key}_worker_error"] = x.new_zeros(self.padded)
            node.state[f"{self.key}_server_error"] = x.new_zeros(self.chunk)
        self._work[node.id] = {
            "z": x.new_zeros(self.padded),
            "sent": torch.empty((self.n, self._phase_nbytes(x.dtype, 1)), dtype=torch.uint8,
                                device=x.device),
            "packed": torch.empty(self.padded // 8, dtype=torch.uint8, device=x.device),
            "r": x.new_empty(self.chunk),
            "back": torch.empty(self._phase_nbytes(x.dtype, 2), dtype=torch.uint8, device=x.device),
            "tie": torch.empty(self.chunk, dtype=torch.bool, device=x.device),
        }

    def reset(self, node: Node) -> None:
        """Zero the error buffers (when the meaning of the reduced quantity changes)."""
        if self.codec in ("sign_l1", "sign_l2"):
            node.state[f"{self.key}_worker_error"].zero_()
            node.state[f"{self.key}_server_error"].zero_()

    def reduce(self, node: Node, u: torch.Tensor, out: torch.Tensor) -> Generator[Exchange, Inbox, None]:
        """``out ← mean_i u_i`` (approximately, with a 1-bit codec; the vote with ``vote``).

        Two exchanges; ``out`` may be ``u``. Use as ``yield from allreduce.reduce(node, u, out)``.
        """
        w = self._work[node.id]
        z, sent, c, me, nb = w["z"], w["sent"], self.chunk, node.id, self.chunk // 8
        z[: self.numel].copy_(u.reshape(-1))
        z[self.numel :].zero_()  # the padding (z held the last result)
        if self.codec == "vote":
            self._pack(z, w["packed"])
            sent.copy_(w["packed"].view(self.n, nb))
        elif self.compressed:
            err = node.state[f"{self.key}_worker_error"]
            z.add_(err)
            a = sign_scale(z, self.codec)
            self._pack(z, w["packed"])
            for j in range(self.n):
                _put_scale(sent[j], a)
                sent[j, -nb:].copy_(w["packed"][j * nb : (j + 1) * nb])
            self._unpack(w["packed"], err)  # ±1
            torch.sub(z, err.mul_(a), out=err)  # e ← z − a σ
        else:
            sent.view(z.dtype).copy_(z.view(self.n, c))
        inbox = yield Exchange({j: sent[j] for j in range(self.n) if j != me}, sent.shape[1])
        r = w["r"].zero_()
        for i in range(self.n):  # node order, own chunk included
            msg = sent[me] if i == me else inbox[i]
            if self.codec == "vote":
                r.add_(self._signs(msg, r.dtype))
            elif self.compressed:
                r.add_(self._signs(msg[-nb:], r.dtype), alpha=float(_get_scale(msg, r.dtype)))
            else:
                r.add_(msg.view(r.dtype))
        back = w["back"]
        if self.codec == "vote":  # sgn of the sum of signs; a tie gives 0 (even n only)
            self._pack(r, back[:nb])
            if self.n % 2 == 0:
                self._pack(torch.eq(r, 0, out=w["tie"]).to(r.dtype).neg_(), back[nb:])
        elif self.compressed:
            s = node.state[f"{self.key}_server_error"]
            r.div_(self.n).add_(s)
            b = sign_scale(r, self.codec)
            _put_scale(back, b)
            self._pack(r, back[-nb:])
            torch.sub(r, self._signs(back[-nb:], r.dtype).mul_(b), out=s)
        else:
            back.view(r.dtype).copy_(r.div_(self.n))
        inbox = yield Exchange.broadcast(back)
        full = z  # the padded result, chunk by chunk
        for j in range(self.n):
            msg = back if j == me else inbox[j]
            part = full[j * c : (j + 1) * c]
            if self.codec == "vote":
                part.copy_(self._signs(msg[:nb], r.dtype))
                if self.n % 2 == 0:  # zero the ties: σ·(1 − tie)
                    part.mul_(self._signs(msg[nb:], r.dtype).add_(1.0).mul_(0.5))
            elif self.compressed:
                torch.mul(self._signs(msg[-nb:], r.dtype), _get_scale(msg, r.dtype), out=part)
            else:
                part.copy_(msg.view(r.dtype))
        out.reshape(-1).copy_(full[: self.numel])

    # -- bits --------------------------------------------------------------------------------
    def _pack(self, x: torch.Tensor, out: torch.Tensor) -> None:
        bits.pack_negative(x, out, self._ws)

    def _unpack(self, packed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        table = bits.pm1_table(out.dtype, out.device)
        out.view(-1, 8).copy_(table[packed.long()])
        return out

    def _signs(self, packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        tmp = self._ws.get("signs", packed.numel() * 8, dtype, packed.device)
        return self._unpack(packed, tmp)


def _put_scale(buf: torch.Tensor, scale: torch.Tensor) -> None:
    item = scale.element_size()
    buf[:item].copy_(scale.reshape(1).view(torch.uint8))


def _get_scale(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    item = torch.empty((), dtype=dtype).element_size()
    return buf[:item].clone().view(dtype)[0]


class AllReduceAlgorithm(Algorithm):
    """Base of the complete-graph methods: they own their optimizer and keep nodes identical.

    They take the plain gradient (``trains``, ``needs_oracle``; no local ``torch.optim``
    optimizer) and need the complete graph (``needs_complete_graph``, checked by the engine);
    the gossip compressor must be ``none`` because they compress inside their own collective
    (see ``codec``).
    """

    trains = True
    needs_oracle = True
    needs_complete_graph = True
    takes_compressor = False
    takes_optimizer = False
    step_schedule = True
    codec_hint = "choose the all-reduce's 1-bit scale with codec=sign_l2|sign_l1"

    _fp: ChunkedAllReduce | None = None
    _ar: ChunkedAllReduce | None = None

    def setup_collectives(self, node: Node) -> None:
        """Give ``node`` its buffers in the full-precision (``_fp``) and the ``codec``-compressed
        (``_ar``) all-reduce, built once for the run's node count and model size."""
        if self._ar is None:
            n, d = node_count(node), node.x.numel()
            self._fp = ChunkedAllReduce(n, d, "none", key="fp")
            self._ar = ChunkedAllReduce(n, d, self.codec, key="ar")
        self._fp.setup(node)
        self._ar.setup(node)

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta`` and ``eps`` sized from the problem (:func:`adaptive_hparams`, with ``eps``)."""
        return adaptive_hparams(cls, problem, with_eps=True)

    def validate(self, topology: Any, compressor: Any) -> None:
        spec = getattr(compressor, "spec", "none")
        if spec != "none":
            raise ConfigError(
                f"{self.name} compresses inside its own all-reduce and takes no gossip compressor "
                f"(got '{spec}'): use --compressor none; {self.codec_hint}"
            )


# -- Adam moments, shared by the adaptive methods ---------------------------------------------


def adam_moments_(m: torch.Tensor, v: torch.Tensor | None, g: torch.Tensor, beta1: float,
                  beta2: float) -> None:
    """``m ← β1 m + (1−β1) g`` and (unless ``v`` is None) ``v ← β2 v + (1−β2) g²``, in place."""
    m.mul_(beta1).add_(g, alpha=1.0 - beta1)
    if v is not None:
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)


def preconditioned(m: torch.Tensor, v: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    """``out = m / (√v + ε)`` (no bias correction, ε outside the root, as DeepSpeed)."""
    torch.sqrt(v, out=out).add_(eps)
    return torch.div(m, out, out=out)


def adaptive_hparams(cls: type[Algorithm], problem: Any, *, with_eps: bool = False) -> dict[str, Any]:
    """A step for Adam-like updates on ``problem`` (one with ``smoothness()`` and ``grad_full``).

    Adaptive steps do not scale with ``1/L``: Adam, Signum and their kin move every coordinate
    by about ``η`` a round, whatever the gradient's size. We size ``η`` from the problem instead,
    as a twentieth of the per-coordinate size of a safe gradient step at the start::

        r = RMS(∇f(x0)) = ‖(1/n) Σ_i ∇f_i(x0)‖ / √d;   η = r / (20 L)

    With ``with_eps`` (the frozen-variance methods) also ``ε = r/20 = η L``: where the (frozen)
    ``√v`` has fallen well below ``ε`` the update is a gradient step of at most ``η/ε = 1/L``,
    so the 1-bit noise of coordinates with a tiny ``v`` cannot blow up (with ``ε = 1e-8`` it
    does). Only what the constructor takes is returned; nothing when ``∇f(x0) = 0``.
    """
    import inspect

    x0 = problem.initial_point()
    grad = sum(problem.grad_full(i, x0) for i in range(problem.n_nodes)) / problem.n_nodes
    rms = float(grad.square().mean().sqrt())
    if not 0.0 < rms < float("inf"):
        return {}
    hp = {"eta": rms / (20.0 * problem.smoothness().L)}
    if with_eps:
        hp["eps"] = rms / 20.0
    accepted = set(inspect.signature(cls.__init__).parameters)
    return {k: v for k, v in hp.items() if k in accepted}


def check_codec(codec: str) -> None:
    """The 1-bit all-reduce codecs an optimizer may choose (``vote`` is Signum's own)."""
    if codec not in ("none", "sign_l1", "sign_l2"):
        raise ConfigError(f"codec = {codec!r}: choose sign_l2 (‖z‖₂/√d scale, DeepSpeed's), sign_l1 "
                          "(‖z‖₁/d) or none (full precision)")


def check_warmup(name: str, rounds: int) -> None:
    """The frozen-variance methods need at least one full-precision round to estimate ``v``."""
    if int(rounds) < 1:
        raise ConfigError(f"{name} = {rounds}: at least 1 warm-up round is needed to estimate v")


def check_betas(beta1: float, beta2: float) -> None:
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= b < 1.0:
            raise ConfigError(f"{name} = {b} must be in [0, 1)")


def node_count(node: Node) -> int:
    """n on the complete graph: the node's neighbors plus itself."""
    return len(node.view.out_neighbors) + 1
