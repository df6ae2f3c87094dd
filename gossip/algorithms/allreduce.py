"""All-reduce on the complete graph, as block phases, and the shared Adam helpers.

The all-reduce family (1-bit Adam, 0/1 Adam, 1-bit LAMB, Signum with majority vote, Adasum)
keeps every node's model and optimizer state identical: each round ends with the same averaged
quantity on every node. We build the collective from the engine's block phases (one message per
arc, :meth:`gossip.engine.block.Block.arc_plan`, then one message per node), so it runs unchanged in
one process and under ``mpiexec``, for all of a process's nodes at once (the rows of a
:class:`~gossip.engine.block.Block`), and its bytes are counted where they are handed over.

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

Messages: a phase-1 message is ``[a_i][chunk j of σ_i]`` (the scale's bytes in the working
dtype, then the packed signs; bit k set for a negative entry), ``[chunk j of σ_i]`` for
``vote``, the chunk's values for ``none``; a phase-2 message ``[b_j][τ_j]``, ``[τ_j][tie
plane]`` (``vote``, the tie plane for even n only) or the averaged chunk (``none``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.base import Algorithm, Round
from gossip.algorithms.requirements import Graph, Requirements
from gossip.compress import bits
from gossip.compress import rows as _rows
from gossip.engine.cache import IdentityCache
from gossip.errors import ConfigError

CODECS = ("none", "sign_l1", "sign_l2", "vote")


def sign_scale(z: torch.Tensor, codec: str) -> torch.Tensor:
    """The scale of ``scale·sgn(z)``: ``‖z‖₂/√len`` (``sign_l2``) or ``‖z‖₁/len`` (``sign_l1``)."""
    if codec == "sign_l2":
        return torch.linalg.vector_norm(z) / math.sqrt(z.numel())
    return z.abs().sum() / z.numel()


def per_row(X: torch.Tensor, one: Callable[[torch.Tensor], torch.Tensor],
            rows: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``[one(X[r]) for r]`` as an [m] tensor, bit for bit: ``rows(X)`` (one reduction along
    dim 1) on the CPU, where each row then reduces in the order it reduces alone, except when a
    row alone would split across threads (at least torch's grain size, several threads); there
    and on CUDA (whose kernels pick their order from the shape), one reduction per row."""
    if X.is_cpu and (X.shape[1] < _rows.GRAIN_SIZE or torch.get_num_threads() == 1):
        return rows(X)
    return torch.stack([one(X[r]) for r in range(X.shape[0])])


def sign_scale_rows(Z: torch.Tensor, codec: str) -> torch.Tensor:
    """:func:`sign_scale` of every row of ``Z`` ([m], bit for bit the single-row values)."""
    d = Z.shape[1]
    if codec == "sign_l2":
        norms = per_row(Z, torch.linalg.vector_norm, lambda X: torch.linalg.vector_norm(X, dim=1))
        return norms / math.sqrt(d)
    return per_row(Z, lambda z: z.abs().sum(), lambda X: X.abs().sum(1)) / d


def norm_rows(X: torch.Tensor) -> torch.Tensor:
    """``X[r].norm()`` of every row ([m], bit for bit)."""
    return per_row(X, torch.linalg.vector_norm, lambda V: torch.linalg.vector_norm(V, dim=1))


class ChunkedAllReduce:
    """The mean of a flat vector over all nodes, by reduce-scatter + all-gather (module doc).

    One instance serves the block of the process (:meth:`reduce_block`: every local node at
    once, as rows). The error buffers live in ``block.state`` under ``key``
    (``{key}_worker_error`` [m, D'], ``{key}_server_error`` [m, c]), so each node's
    ``node.state`` holds its own and checkpoints keep them; work buffers are kept here.

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
        self._work: dict[str, torch.Tensor] = {}
        self._routes = IdentityCache(limit=4)  # per round plan

    @property
    def compressed(self) -> bool:
        return self.codec != "none"

    @property
    def error_feedback(self) -> bool:
        return self.codec in ("sign_l1", "sign_l2")

    def nbytes(self, dtype: torch.dtype) -> int:
        """Bytes one node sends per call (both phases)."""
        return (self.n - 1) * (self._phase_nbytes(dtype, 1) + self._phase_nbytes(dtype, 2))

    def _phase_nbytes(self, dtype: torch.dtype, phase: int) -> int:
        """Bytes of one message of ``phase`` (1: to a chunk's server, 2: from it)."""
        item = torch.empty((), dtype=dtype).element_size()
        if self.codec == "vote":
            return self.chunk // 8 * (2 if phase == 2 and self.n % 2 == 0 else 1)
        return self.chunk // 8 + item if self.compressed else self.chunk * item

    def setup(self, block: Any) -> None:
        """The block's error buffers (zero) in ``block.state`` (1-bit codecs only)."""
        if self.error_feedback:
            x = block.x
            block.state[f"{self.key}_worker_error"] = x.new_zeros((block.m, self.padded))
            block.state[f"{self.key}_server_error"] = x.new_zeros((block.m, self.chunk))

    def reset_block(self, block: Any) -> None:
        """Zero the error buffers (when the meaning of the reduced quantity changes)."""
        if self.error_feedback:
            block.state[f"{self.key}_worker_error"].zero_()
            block.state[f"{self.key}_server_error"].zero_()

    def reduce_block(self, block: Any, U: torch.Tensor, out: torch.Tensor) -> Round:
        """``out[r] ← mean_i u_i`` for every row (approximately, with a 1-bit codec; the vote
        with ``vote``): every node gets the same vector.

        Two phases; ``U`` and ``out`` are [m, D] (``out`` may be ``U``). Use as
        ``yield from allreduce.reduce_block(block, U, out)``. Each row's float operations are
        those of a node alone: its server sums the n contributions in node order, its own
        included."""
        n, c, m, item = self.n, self.chunk, block.m, U.element_size()
        dtype, dev = U.dtype, U.device
        nb, nb1, nb2 = c // 8, self._phase_nbytes(dtype, 1), self._phase_nbytes(dtype, 2)
        rt = self._route(block)
        Z = self._buf("z", (m, self.padded), dtype, dev)
        Z[:, : self.numel].copy_(U)
        Z[:, self.numel :].zero_()
        # phase 1: sent[r·n + j] is node r's message to the server of chunk j (its own included)
        if self.codec == "vote":
            packed = self._buf("packed", (m, self.padded // 8), torch.uint8, dev)
            _rows.pack_rows(Z < 0, self.padded, packed)
            sent = packed.view(m * n, nb)
        elif self.compressed:
            E = block.state[f"{self.key}_worker_error"]
            Z.add_(E)
            a = sign_scale_rows(Z, self.codec).view(m, 1)
            packed = self._buf("packed", (m, self.padded // 8), torch.uint8, dev)
            _rows.pack_rows(Z < 0, self.padded, packed)
            sent3 = self._buf("sent", (m, n, nb1), torch.uint8, dev)
            sent3[:, :, :item].copy_(a.view(torch.uint8).view(m, 1, item).expand(m, n, item))
            sent3[:, :, item:].copy_(packed.view(m, n, nb))
            torch.sub(Z, self._pm1(packed, E).mul_(a), out=E)  # e ← z − a σ
            sent = sent3.view(m * n, nb1)
        else:
            sent = Z.view(torch.uint8).view(m * n, nb1)
        rows = block.message_rows(nb1, rt["arcs"])
        rows.mine().copy_(sent.index_select(0, rt["to_arc"]))
        yield rows
        got = self._buf("got", (m * n, nb1), torch.uint8, dev)
        got.index_copy_(0, rt["from_arc"], block.received_arcs(rows))
        got.index_copy_(0, rt["own"], sent.index_select(0, rt["own"]))
        got = got.view(m, n, nb1)
        R = self._buf("r", (m, c), dtype, dev).zero_()
        signs = self._buf("signs", (m, c), dtype, dev)
        if self.codec == "vote":
            for i in range(n):  # node order, own chunk included
                R.add_(self._pm1(got[:, i], signs))
        elif self.compressed:
            scales = got[:, :, :item].contiguous().view(dtype).view(m, n)
            for i in range(n):
                R.add_(self._pm1(got[:, i, item:], signs).mul_(scales[:, i : i + 1]))
        else:
            for i in range(n):
                R.add_(got[:, i].view(dtype))
        back = block.message_rows(nb2)  # one message per node, to every other node
        mine = back.mine()
        if self.codec == "vote":  # sgn of the sum of signs; a tie gives 0 (even n only)
            _rows.pack_rows(R < 0, c, mine[:, :nb])
            if n % 2 == 0:
                _rows.pack_rows(R == 0, c, mine[:, nb:])
        elif self.compressed:
            S = block.state[f"{self.key}_server_error"]
            R.div_(n).add_(S)
            b = sign_scale_rows(R, self.codec).view(m, 1)
            mine[:, :item].copy_(b.view(torch.uint8))
            _rows.pack_rows(R < 0, c, mine[:, item:])
            torch.sub(R, self._pm1(mine[:, item:], signs).mul_(b), out=S)
        else:
            mine.view(dtype).copy_(R.div_(n))
        yield back
        full = Z  # the padded result, chunk by chunk
        for j in range(n):
            msg = back.gather(rt["from"][j], None)  # [m, nb2]: server j's message to each row
            part = full[:, j * c : (j + 1) * c]
            if self.codec == "vote":
                part.copy_(self._pm1(msg[:, :nb], signs))
                if n % 2 == 0:  # zero the ties: σ·(1 − tie)
                    part.mul_(self._pm1(msg[:, nb:], signs).add_(1.0).mul_(0.5))
            elif self.compressed:
                scale = msg[:, :item].contiguous().view(dtype)
                torch.mul(self._pm1(msg[:, item:], signs), scale, out=part)
            else:
                part.copy_(msg.view(dtype))
        out.copy_(full[:, : self.numel])

    # -- routing and buffers ---------------------------------------------------------------------
    def _route(self, block: Any) -> dict[str, Any]:
        """Index tensors of the two phases for the block's nodes (cached per round plan).

        ``arcs``: the plan of phase 1 (every arc of the complete graph into or out of the
        block); ``to_arc`` / ``from_arc``: the ``sent`` / ``got`` rows (``r·n + j``) of its own
        and incoming arcs; ``own``: each node's message to itself; ``from[j]``: the staging rows
        of server j's phase-2 message to every local node."""
        return self._routes.get(block.plan, lambda: self._build_route(block))

    def _build_route(self, block: Any) -> dict[str, Any]:
        n, ids, plan = self.n, block.ids, block.plan
        dev = block.x.device
        row_of = {i: r for r, i in enumerate(ids)}
        arcs = block.arc_plan()
        staging = {(j, i): s for j, i, s in plan.remote_in}
        long = lambda v: torch.tensor(v, dtype=torch.int64, device=dev)  # noqa: E731
        return {
            "arcs": arcs,
            "to_arc": long([row_of[i] * n + j for i, j in arcs.arcs]),
            "from_arc": long([row_of[j] * n + i for i, j in arcs.incoming]),
            "own": long([r * n + i for r, i in enumerate(ids)]),
            "from": [long([row_of[j] if j in row_of else staging[(j, i)] for i in ids])
                      for j in range(n)],
        }

    def _buf(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
        t = self._work.get(name)
        if t is None or t.shape != shape or t.dtype != dtype or t.device != device:
            t = self._work[name] = torch.empty(shape, dtype=dtype, device=device)
        return t

    def _pm1(self, packed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` ([m, 8k]) = ±1 from the packed rows ``packed`` ([m, k]; set bit -> −1)."""
        table = bits.pm1_table(out.dtype, out.device)
        m, k = packed.shape
        torch.index_select(table, 0, packed.reshape(-1).to(torch.int32), out=out.view(m * k, 8))
        return out


class AllReduceAlgorithm(Algorithm):
    """Base of the complete-graph methods: they own their optimizer and keep nodes identical.

    They take the plain gradient (``trains``, ``requires.gradients``; no local ``torch.optim``
    optimizer) and need the complete graph (``requires.graph.complete``, checked by the engine);
    the gossip compressor must be ``none`` because they compress inside their own collective
    (see ``codec``).
    """

    trains = True
    requires = Requirements(
        graph=Graph(complete=True), gradients=True, compressor="identity",
        compressor_message="{name} compresses inside its own all-reduce and takes no gossip "
                           "compressor (got '{spec}'): use --compressor none; choose the "
                           "all-reduce's 1-bit scale with codec=sign_l2|sign_l1")
    takes_optimizer = False
    step_schedule = True

    def setup_collectives(self, block: Any) -> None:
        """The full-precision (``block.workspace["fp"]``) and the ``codec``-compressed
        (``block.workspace["ar"]``) all-reduce for the run's node count and model size, and
        their error buffers in ``block.state``."""
        n, d = node_count(block), block.x.shape[1]
        for key, codec in (("fp", "none"), ("ar", self.codec)):
            collective = block.workspace[key] = ChunkedAllReduce(n, d, codec, key=key)
            collective.setup(block)

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta`` and ``eps`` sized from the problem (:func:`adaptive_hparams`, with ``eps``)."""
        return adaptive_hparams(cls, problem, with_eps=True)


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


def node_count(block: Any) -> int:
    """n on the complete graph: a node's neighbors plus itself."""
    return len(block.nodes[0].view.out_neighbors) + 1
