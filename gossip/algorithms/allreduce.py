"""All-reduce on the complete graph, as block phases, and the shared Adam helpers.

The all-reduce family (1-bit Adam, 0/1 Adam, 1-bit LAMB, Signum with majority vote, Adasum)
keeps every node's model and optimizer state identical: each round ends with the same averaged
quantity on every node. We build the collective from the engine's block phases (one message per
arc, :meth:`gossip.core.block.Block.arc_plan`, then one message per node), so it runs unchanged in
one process and under ``mpiexec``, for all of a process's nodes at once (the rows of a
:class:`~gossip.core.block.Block`), and its bytes are counted where they are handed over.

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

The codec is a registered compressor (:func:`gossip.compress.make`), the same the gossip methods
take: ``a_i σ_i`` is its message of ``z_i`` and phase 1 sends chunk j of that message
(:meth:`gossip.compress.Codec.split_rows`: chunk j of the bits, the scale in each), the server
encodes ``r_j`` with it, and both sides decode through it. Any compressor whose messages cut
into chunks (``splits``) serves; error feedback is on for the lossy ones with a bounded error.

``codec="vote"`` is signSGD's majority vote on the same routing: phase 1 carries the signs only
(``c`` bits), node j returns ``sgn(Σ_i sgn(u_i))`` on its chunk, and a tie (possible for even n
only) gives 0, sent as a second bit plane (so ``2c`` bits back for even n, ``c`` for odd n).
No scales, no error feedback: the ballots are the ``vote`` compressor, the result
``vote:ties`` for even n. For 1-bit codecs ``D'`` is a multiple
of ``n·lcm(n, 8)`` so that every chunk packs into whole bytes; the padding entries take part in
the scales (as in DeepSpeed). Per node and call that is ``2(n−1)(c/8 + itemsize)`` bytes, about
2 bits per coordinate. Scales travel in the working dtype (4 bytes in float32).

Messages are the compressor's bodies without its 8-byte header (the routing fixes every
size): a phase-1 message is ``[a_i][chunk j of σ_i]`` (the scale's bytes in the working
dtype, then the packed signs; bit k set for a negative entry), ``[chunk j of σ_i]`` for
``vote``, the chunk's values for ``none``; a phase-2 message ``[b_j][τ_j]``, ``[τ_j][tie
plane]`` (``vote``, the tie plane for even n only) or the averaged chunk (``none``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gossip.compress import GRAIN_SIZE, Compressor, Vote, make
from gossip.core.algorithm import Algorithm, Round
from gossip.core.cache import IdentityCache
from gossip.core.requirements import Graph, Requirements
from gossip.errors import CompressionError, ConfigError


def per_row(X: torch.Tensor, one: Callable[[torch.Tensor], torch.Tensor],
            rows: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``[one(X[r]) for r]`` as an [m] tensor, bit for bit: ``rows(X)`` (one reduction along
    dim 1) on the CPU, where each row then reduces in the order it reduces alone, except when a
    row alone would split across threads (at least torch's grain size, several threads); there
    and on CUDA (whose kernels pick their order from the shape), one reduction per row."""
    if X.is_cpu and (X.shape[1] < GRAIN_SIZE or torch.get_num_threads() == 1):
        return rows(X)
    return torch.stack([one(X[r]) for r in range(X.shape[0])])


def norm_rows(X: torch.Tensor) -> torch.Tensor:
    """``X[r].norm()`` of every row ([m], bit for bit)."""
    return per_row(X, torch.linalg.vector_norm, lambda V: torch.linalg.vector_norm(V, dim=1))


def codec_compressor(codec: str | Compressor) -> Compressor:
    """The all-reduce's compressor from the registry (a spec such as ``sign_l2``, or one
    built already), refused with a :class:`ConfigError` unless its messages split into the
    messages of their chunks (:attr:`gossip.compress.Compressor.splits`)."""
    if isinstance(codec, Compressor):
        comp = codec
    else:
        try:
            comp = make(str(codec))
        except CompressionError as exc:
            raise ConfigError(f"all-reduce codec {codec!r}: {exc}") from None
    if not comp.splits:
        raise ConfigError(f"all-reduce codec {comp.spec!r} cannot travel in chunks: its message "
                          "does not cut into the messages of its chunks; choose an entry-wise "
                          "compressor (none, fp16, bf16, sign_l1 = sign, sign_l2, vote)")
    return comp


class ChunkedAllReduce:
    """The mean of a flat vector over all nodes, by reduce-scatter + all-gather (module doc).

    One instance serves the block of the process (:meth:`reduce_block`: every local node at
    once, as rows). The error buffers live in ``block.state`` under ``key``
    (``{key}_worker_error`` [m, D'], ``{key}_server_error`` [m, c]), so each node's
    ``node.state`` holds its own and checkpoints keep them; work buffers are kept here.

    Args:
        n: number of nodes.
        numel: entries of the vector reduced (``D``).
        codec: a registered compressor whose messages split into chunks (a spec or an
            instance): ``none`` (full precision), ``sign_l1`` / ``sign_l2`` (1 bit per entry
            with worker and server error feedback), ``vote`` (majority vote of the signs),
            ``fp16`` / ``bf16`` (with error feedback).
        key: prefix of the state entries (two collectives on one node need two keys).
    """

    def __init__(self, n: int, numel: int, codec: str | Compressor = "sign_l2", key: str = "ar"):
        worker = codec_compressor(codec)
        self.n, self.numel, self.key = n, numel, key
        self.codec = worker.spec
        # what the all-reduce sends is the compressor's body alone (no header; sizes are
        # fixed by the routing), and a diverged run is caught on the models, as before
        worker.check_finite = False
        server = worker
        if isinstance(worker, Vote) and not worker.ties and n % 2 == 0:
            server = make(f"{worker.spec}:ties")  # an even number of ballots may tie
            server.check_finite = False
        self.worker, self.server = worker, server
        unit = n * math.lcm(n, 8) if self.compressed else n
        self.padded = max(unit, -(-numel // unit) * unit)
        self.chunk = self.padded // n
        self._work: dict[str, torch.Tensor] = {}
        self._routes = IdentityCache(limit=4)  # per round plan

    @property
    def compressed(self) -> bool:
        return not self.worker.is_identity

    @property
    def error_feedback(self) -> bool:
        """Worker and server error feedback: for a lossy compressor whose error is bounded
        relative to its input (the scaled signs, the 16-bit casts); not for the identity, nor
        for the vote's unscaled ballots."""
        return self.compressed and self.worker.bounded_variance

    def nbytes(self, dtype: torch.dtype) -> int:
        """Bytes one node sends per call (both phases)."""
        return (self.n - 1) * (self._phase_nbytes(dtype, 1) + self._phase_nbytes(dtype, 2))

    def _phase_nbytes(self, dtype: torch.dtype, phase: int) -> int:
        """Bytes of one message of ``phase`` (1: to a chunk's server, 2: from it): the body of
        the compressor's message of one chunk."""
        comp = self.worker if phase == 1 else self.server
        return comp.body_nbytes((self.chunk,), dtype)

    def setup(self, block: Any) -> None:
        """The block's error buffers (zero) in ``block.state`` (error feedback only)."""
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
        """``out[r] ← mean_i u_i`` for every row (approximately, with a lossy codec; the vote
        with ``vote``): every node gets the same vector.

        Two phases; ``U`` and ``out`` are [m, D] (``out`` may be ``U``). Use as
        ``yield from allreduce.reduce_block(block, U, out)``. Each row's float operations are
        those of a node alone: its server sums the n contributions in node order, its own
        included."""
        n, c, m = self.n, self.chunk, block.m
        worker, server, ef = self.worker, self.server, self.error_feedback
        dtype, dev = U.dtype, U.device
        nb1, nb2 = self._phase_nbytes(dtype, 1), self._phase_nbytes(dtype, 2)
        rt = self._route(block)
        Z = self._buf("z", (m, self.padded), dtype, dev)
        Z[:, : self.numel].copy_(U)
        Z[:, self.numel :].zero_()
        # phase 1: the worker's message of z_i, written as the messages of its n chunks (its
        # scale in each); sent[r·n + j] is node r's message to the server of chunk j. A
        # compressor that sends the values as they are sends them from Z itself.
        if ef:
            E = block.state[f"{self.key}_worker_error"]
            Z.add_(E)
        sent = Z.view(torch.uint8).view(m, n, nb1) if worker.sends_values_in_place \
            else self._buf("sent", (m, n, nb1), torch.uint8, dev)
        sent = worker.encode_split_rows(Z, n, out=sent).view(m * n, nb1)
        if ef:  # e ← z − C(z)
            torch.sub(Z, worker.decode_bodies(sent, E.view(m * n, c)).view(m, -1), out=E)
        rows = block.message_rows(nb1, rt["arcs"])
        rows.mine().copy_(sent.index_select(0, rt["to_arc"]))
        yield rows
        got = self._buf("got", (m * n, nb1), torch.uint8, dev)
        got.index_copy_(0, rt["from_arc"], block.received_arcs(rows))
        got.index_copy_(0, rt["own"], sent.index_select(0, rt["own"]))
        got = got.view(m, n, nb1)
        R = self._buf("r", (m, c), dtype, dev).zero_()
        for i in range(n):  # node order, own chunk included
            worker.decode_add_bodies_(R, got[:, i])
        R.div_(n)
        # phase 2: the server's message of its averaged chunk, to every node, written
        # straight into the block's staging rows
        if ef:
            S = block.state[f"{self.key}_server_error"]
            R.add_(S)
        back = block.message_rows(nb2)  # one message per node, to every other node
        mine = server.encode_split_rows(R, 1, out=back.mine().unsqueeze(1)).view(m, nb2)
        if ef:  # s ← r − C(r)
            torch.sub(R, server.decode_bodies(mine, S), out=S)
        yield back
        for j in range(n):  # server j's message to each row, decoded into chunk j
            server.decode_bodies(back.gather(rt["from"][j], None), Z[:, j * c : (j + 1) * c])
        out.copy_(Z[:, : self.numel])

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
    """The all-reduce codec of an optimizer with error feedback: a registered compressor that
    splits into chunks and whose error is bounded (``vote``, unscaled, is Signum's own)."""
    try:
        comp = codec_compressor(codec)
    except ConfigError as exc:
        comp, why = None, str(exc)
    if comp is not None and not comp.bounded_variance:
        why = f"{comp.spec} is not bounded relative to its input, so error feedback cannot use it"
    elif comp is not None:
        return
    raise ConfigError(f"codec = {codec!r}: choose sign_l2 (‖z‖₂/√d scale, DeepSpeed's), sign_l1 "
                      f"(‖z‖₁/d, also 'sign'), none (full precision) or fp16/bf16 ({why})")


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
