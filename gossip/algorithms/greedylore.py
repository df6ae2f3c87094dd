"""Low-rank compression of each weight matrix on the all-reduce: GreedyLore and PowerSGD.

Data parallelism on the complete graph (the all-reduce family, :mod:`gossip.algorithms.allreduce`):
every node ends each round with the same approximation ``ḡ`` of the mean gradient and hands it
to its optimizer (:meth:`Block.local_step`: the node's ``torch.optim`` optimizer in training,
``x ← x − η ḡ`` otherwise), so the nodes stay identical. Each matrix-shaped tensor of the
model's layout, viewed as ``M = T.reshape(T.shape[0], -1)`` (a × b, the ``lowrank``
compressor's view, :meth:`gossip.compress.lowrank.LowRank.dims`), travels as rank-``r``
factors with error feedback; 1-D tensors, and matrices the factors would not shrink by at least
``min_compression``, travel in full. Two rules pick the subspace (``subspace``):

``greedy`` (GreedyLore, Chen et al. 2025, as the authors' team's ``subspace_hook.py``): let
``s = min(a, b)``, ``L = max(a, b)`` and ``A`` the matrix seen from its short side (``M`` when
``a < b``, else ``Mᵀ``; s × L). Every ``refresh`` rounds a full-precision all-reduce gives
``Ḡ``, whose SVD gives an orthonormal basis ``B`` of the short side (s × s, kept); the error
memory is reset. In between::

    A_i = G_i + E_i                                  (EF14)
    c_ij = ⟨(Bᵀ A_i)_j, z_j⟩    z_j ~ N(0, I_L), the same on every node (a shared stream)
    σ_j = (mean_i c_ij)²        one all-reduce of s numbers per matrix
    P = the r columns of B with the largest σ_j (ties: the lower index)
    R_i = Pᵀ A_i (r × L);  E_i ← A_i − P R_i;   ḡ = P · mean_i R_i

``power`` (PowerSGD, Vogels et al. 2019, one warm-started power step as the ``lowrank``
compressor's, lifted to the all-reduce as torch's ``powerSGD_hook``)::

    A_i = G_i + E_i;  P̄ = mean_i A_i Q;  P̂ = orth(P̄);  Q̄ = mean_i A_iᵀ P̂
    ḡ = P̂ Q̄ᵀ;   E_i ← A_i − ḡ;   Q ← Q̄  (warm start; redrawn from the shared stream if ≈ 0)

Rounds ``t ≤ start`` reduce the raw gradients in full precision (no compression, no memory).
Round ``start + 1`` opens the compressed phase; with ``refresh = τ > 0`` the rounds
``start + 1 + jτ`` are full-precision rounds that reset the memory (and, for ``greedy``, make the
basis; ``greedy`` needs ``τ ≥ 1``).

Every all-reduce is the full-precision :class:`~gossip.algorithms.allreduce.ChunkedAllReduce`
(reduce-scatter + all-gather, sums in node order). A compressed round runs two: ``greedy`` the
scores, then the factors ``R`` with the uncompressed entries; ``power`` the ``P`` factors with
the uncompressed entries, then the ``Q`` factors. ``B``, ``P``, ``Q`` and the probes never
travel: every node computes them from the same reduced numbers and the same stream.

Bitwise placement independence (the same numbers in one process and under ``mpiexec``): the
products run per node on operands whose rows start 64-byte aligned (BLAS rounds by size and
alignment), and what is the same on every node (the SVD, the selection, Gram–Schmidt, ``ḡ``) is
computed once per block from its first row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from gossip.algorithms.allreduce import AllReduceAlgorithm, ChunkedAllReduce, node_count
from gossip.compress.lowrank import COLLAPSE, LowRank, orthonormalize_rows_
from gossip.core.algorithm import Algorithm, Round, check_range, scheduled
from gossip.core.block import Block
from gossip.errors import ConfigError
from gossip.rng import Stream

SUBSPACES = ("greedy", "power")
SHARED = "lowrank-allreduce"
"""The stream every node draws the probes and warm-start factors from (one key per run)."""
_ALIGN = 64  # bytes: where a fresh torch tensor starts


@dataclass(frozen=True)
class Matrix:
    """One compressed tensor: ``M`` = the layout's entries ``[offset, offset + a·b)`` as a × b;
    ``left``: its short side is the rows (``greedy`` works on ``M``, else on ``Mᵀ``); the
    offsets of its pieces in the flat vectors of the rule (``basis``/``scores``/``factors`` for
    ``greedy``, ``p``/``q`` for ``power``)."""

    offset: int
    a: int
    b: int
    rank: int
    basis: int = 0
    scores: int = 0
    factors: int = 0
    p: int = 0
    q: int = 0

    @property
    def left(self) -> bool:
        return self.a < self.b

    @property
    def short(self) -> int:
        return min(self.a, self.b)

    @property
    def long(self) -> int:
        return max(self.a, self.b)


@dataclass(frozen=True)
class Plan:
    """Which entries of the flat model travel how, and the sizes of the flat vectors.

    ``dense``: ``(offset, size)`` runs of entries reduced in full; they sit at the end of the
    first factor message (``factors`` for ``greedy``, ``p`` for ``power``), from ``dense_at``."""

    matrices: tuple[Matrix, ...]
    dense: tuple[tuple[int, int], ...]
    basis: int
    scores: int
    factors: int
    p: int
    q: int

    @property
    def dense_numel(self) -> int:
        return sum(size for _, size in self.dense)


def make_plan(shapes: list[tuple[int, tuple[int, ...]]], rank: int, subspace: str,
              min_compression: float) -> Plan:
    """The plan of a model whose tensors are ``(offset, shape)``: a tensor with ndim > 1 is
    compressed when its factors times ``min_compression`` are fewer numbers than its entries
    (``greedy`` sends ``r·max(a, b)``, ``power`` ``r·(a + b)``)."""
    view = LowRank(f"lowrank:{rank}", rank)
    mats, dense = [], []
    basis = scores = factors = p = q = 0
    for offset, shape in shapes:
        dims, size = view.dims(shape), math.prod(shape)
        if dims is not None:
            a, b, r = dims
            sent = r * max(a, b) if subspace == "greedy" else r * (a + b)
            if sent * min_compression < a * b:
                mats.append(Matrix(offset, a, b, r, basis, scores, factors, p, q))
                s_ = min(a, b)
                basis, scores, factors = basis + s_ * s_, scores + s_, factors + r * max(a, b)
                p, q = p + r * a, q + r * b
                continue
        if dense and dense[-1][0] + dense[-1][1] == offset:
            dense[-1] = (dense[-1][0], dense[-1][1] + size)
        else:
            dense.append((offset, size))
    return Plan(tuple(mats), tuple(dense), basis, scores, factors, p, q)


class GreedyLore(AllReduceAlgorithm):
    r"""GreedyLore on the complete graph: greedy low-rank subspaces with EF14 (module doc).

    Per compressed matrix (short side s, long side L), between full-precision refresh rounds::

        A_i = G_i + E_i;   σ_j = (mean_i ⟨(Bᵀ A_i)_j, z_j⟩)²;   P = top-r columns of B by σ
        R_i = Pᵀ A_i;   E_i ← A_i − P R_i;   ḡ = P mean_i R_i;   then the optimizer step with ḡ

    ``subspace="power"`` is PowerSGD's rule on the same machinery (:class:`PowerSGD` presets it).
    See docs/algorithms/greedylore.md.

    Args:
        eta: step size of ``x ← x − η ḡ`` (a number or a schedule); in training the node's
            optimizer (``--optimizer``, ``--lr``) steps instead.
        rank: r, capped at each matrix's short side. Default 8.
        refresh: τ, rounds between full-precision rounds with a memory reset (and, for
            ``greedy``, a new SVD basis); 0: never (``power`` only). Default 200.
        start: rounds of plain full-precision all-reduce before compression. Default 10.
        min_compression: ρ, a matrix is compressed only when ``ρ·(numbers sent) < a·b``
            (0: every matrix). Default 2.
        subspace: ``greedy`` (GreedyLore) or ``power`` (PowerSGD).
    """

    name = "greedylore"
    takes_optimizer = True  # ḡ goes to the node's optimizer (MSGD, Adam): every node the same
    needs_layout = True
    state_copies = 10
    requires = replace(
        AllReduceAlgorithm.requires,
        compressor_message="{name} compresses inside its own all-reduce and takes no gossip "
                           "compressor (got '{spec}'): use --compressor none and set its rank "
                           "(--hparam rank=R)")

    def __init__(self, eta: float | Callable[[int], float] = 0.1, rank: int = 8, refresh: int = 200,
                 start: int = 10, min_compression: float = 2.0, subspace: str = "greedy"):
        check_range("eta", eta, 0.0, float("inf"))
        if subspace not in SUBSPACES:
            raise ConfigError(f"subspace = {subspace!r}: choose 'greedy' (GreedyLore's scored SVD "
                              "basis) or 'power' (PowerSGD's power step)")
        if int(rank) != rank or int(rank) < 1:
            raise ConfigError(f"rank = {rank} must be an integer >= 1")
        if int(refresh) != refresh or int(refresh) < 0:
            raise ConfigError(f"refresh = {refresh} must be an integer >= 0 (0: never)")
        if subspace == "greedy" and int(refresh) < 1:
            raise ConfigError(f"refresh = {refresh}: the greedy subspace needs its SVD basis, "
                              "made at a full-precision round every `refresh` rounds: give refresh >= 1")
        if int(start) != start or int(start) < 0:
            raise ConfigError(f"start = {start} must be an integer >= 0")
        check_range("min_compression", min_compression, 0.0, float("inf"), include_low=True)
        self.eta, self.rank, self.refresh, self.start = eta, int(rank), int(refresh), int(start)
        self.min_compression, self.subspace = float(min_compression), subspace

    @classmethod
    def suggest_hparams(cls, problem: Any, estimator: str = "full",
                        topology: Any = None) -> dict[str, Any]:
        """``eta`` by the default step rule (a gradient method, not an adaptive one)."""
        return Algorithm.suggest_hparams.__func__(cls, problem, estimator, topology)

    # -- setup ----------------------------------------------------------------------------------
    def setup(self, block: Block) -> None:
        x, ws, n = block.x, block.workspace, node_count(block)
        d = x.shape[1]
        layout = block.nodes[0].layout if block.nodes else None
        shapes = [(0, (d,))] if layout is None else list(zip(layout.offsets, layout.shapes))
        plan = ws["plan"] = make_plan(shapes, self.rank, self.subspace, self.min_compression)
        ws["fp"] = ChunkedAllReduce(n, d, "none", key="fp")
        greedy = self.subspace == "greedy"
        first, second = ((plan.scores, plan.factors + plan.dense_numel) if greedy
                         else (plan.p + plan.dense_numel, plan.q))
        if plan.matrices:
            ws["first"] = ChunkedAllReduce(n, first, "none", key="first")
            ws["second"] = ChunkedAllReduce(n, second, "none", key="second")
        ws["grad"] = torch.zeros_like(x)  # scratch, never checkpointed
        ws["shared"] = Stream(block.seed, [0], SHARED)
        ws["scratch"] = {}
        block.state["error"] = torch.zeros_like(x)  # E_i (0 on the entries reduced in full)
        if greedy:
            block.state["basis"] = x.new_zeros((block.m, plan.basis))
        else:
            q = block.state["q"] = x.new_zeros((block.m, plan.q))  # Qᵀ of every matrix, r × b
            rng = ws["shared"]
            rng.begin_round(0)
            for mat in plan.matrices:
                q[:, mat.q : mat.q + mat.rank * mat.b].copy_(self._draw(rng, mat.rank * mat.b, x))

    # -- the round ------------------------------------------------------------------------------
    def step(self, block: Block) -> Round:
        ws, st = block.workspace, block.state
        g = block.gradients(ws["grad"])
        plan, k = ws["plan"], block.round - self.start - 1
        if k < 0 or not plan.matrices or (self.refresh and k % self.refresh == 0):
            yield from ws["fp"].reduce_block(block, g, g)  # ḡ = mean_i G_i, exact
            if k >= 0 and plan.matrices:  # a refresh: memory reset, greedy's new basis
                st["error"].zero_()
                if self.subspace == "greedy":
                    self._new_bases(block, g)
        else:
            ws["shared"].begin_round(block.round)
            a = self._rows(block, "a", g.shape[1])
            torch.add(g, st["error"], out=a)  # A_i = G_i + E_i
            rule = self._greedy if self.subspace == "greedy" else self._power
            yield from rule(block, a, g)
        block.local_step(g, scheduled(self.eta, block.round))

    def _greedy(self, block: Block, A: torch.Tensor, out: torch.Tensor) -> Round:
        """One compressed GreedyLore round: ``out ← ḡ`` on every row, ``E`` updated."""
        ws, st, plan, m = block.workspace, block.state, block.workspace["plan"], block.m
        E, basis = st["error"], st["basis"]
        scores = self._rows(block, "scores", plan.scores)
        bases = {}
        for mat in plan.matrices:  # c_ij = ⟨(Bᵀ A_i)_j, z_j⟩ for every row
            s, L = mat.short, mat.long
            B = self._shared(block, ("B", mat.offset), (s, s), A)
            B.copy_(basis[0, mat.basis : mat.basis + s * s].view(s, s))
            bases[mat.offset] = B
            z = self._draw(ws["shared"], s * L, A).view(s, L)
            Y = self._shared(block, ("Y", mat.offset), (s, L), A)
            for r in range(m):
                torch.mm(B.t(), self._short_view(A[r], mat), out=Y)
                torch.sum(Y.mul_(z), 1, out=scores[r, mat.scores : mat.scores + s])
        yield from ws["first"].reduce_block(block, scores, scores)
        factors = self._rows(block, "factors", plan.factors + plan.dense_numel)
        chosen = {}
        for mat in plan.matrices:
            s, L, rk = mat.short, mat.long, mat.rank
            sigma = scores[0, mat.scores : mat.scores + s].square()
            order = torch.sort(sigma, descending=True, stable=True).indices[:rk]
            P = chosen[mat.offset] = self._shared(block, ("P", mat.offset), (s, rk), A)
            torch.index_select(bases[mat.offset], 1, order, out=P)
            D = self._shared(block, ("D", mat.offset), (s, L), A)
            for r in range(m):
                Ai = self._short_view(A[r], mat)
                R = factors[r, mat.factors : mat.factors + rk * L].view(rk, L)
                torch.mm(P.t(), Ai, out=R)  # R_i = Pᵀ A_i
                torch.mm(P, R, out=D)  # D_i = P R_i
                torch.sub(Ai, D, out=self._short_view(E[r], mat))  # E_i ← A_i − D_i
        self._pack_dense(plan, A, factors, plan.factors)
        yield from ws["second"].reduce_block(block, factors, factors)
        for mat in plan.matrices:  # ḡ = P R̄ (the same on every row)
            s, L, rk = mat.short, mat.long, mat.rank
            D = self._shared(block, ("D", mat.offset), (s, L), A)
            R = self._shared(block, ("R", mat.offset), (rk, L), A)
            R.copy_(factors[0, mat.factors : mat.factors + rk * L].view(rk, L))
            torch.mm(chosen[mat.offset], R, out=D)
            self._set_rows(out, mat, D if mat.left else D.t())
        self._unpack_dense(plan, factors, plan.factors, out)

    def _power(self, block: Block, A: torch.Tensor, out: torch.Tensor) -> Round:
        """One compressed PowerSGD round: ``out ← ḡ`` on every row, ``E`` and ``Q`` updated."""
        ws, st, plan, m = block.workspace, block.state, block.workspace["plan"], block.m
        E, Qs = st["error"], st["q"]
        first = self._rows(block, "p", plan.p + plan.dense_numel)
        for mat in plan.matrices:  # Pᵀ_i = Qᵀ A_iᵀ (the lowrank compressor's (Qᵀ Mᵀ)ᵀ form)
            a, b, rk = mat.a, mat.b, mat.rank
            Qt = self._shared(block, ("Qt", mat.offset), (rk, b), A)
            Qt.copy_(Qs[0, mat.q : mat.q + rk * b].view(rk, b))
            for r in range(m):
                torch.mm(Qt, self._matrix(A[r], mat).t(), out=first[r, mat.p : mat.p + rk * a].view(rk, a))
        self._pack_dense(plan, A, first, plan.p)
        yield from ws["first"].reduce_block(block, first, first)
        second = self._rows(block, "q", plan.q)
        pts = {}
        for mat in plan.matrices:  # P̂ = orth(P̄);  Qᵀ_i = P̂ᵀ A_i
            a, b, rk = mat.a, mat.b, mat.rank
            Pt = pts[mat.offset] = self._shared(block, ("Pt", mat.offset), (rk, a), A)
            Pt.copy_(first[0, mat.p : mat.p + rk * a].view(rk, a))
            orthonormalize_rows_(Pt)
            for r in range(m):
                torch.mm(Pt, self._matrix(A[r], mat), out=second[r, mat.q : mat.q + rk * b].view(rk, b))
        yield from ws["second"].reduce_block(block, second, second)
        for mat in plan.matrices:  # ḡ = P̂ Q̄ᵀ;  E_i ← A_i − ḡ;  Q ← Q̄
            a, b, rk = mat.a, mat.b, mat.rank
            Qt = self._shared(block, ("Qt", mat.offset), (rk, b), A)
            Qt.copy_(second[0, mat.q : mat.q + rk * b].view(rk, b))
            G = self._shared(block, ("G", mat.offset), (a, b), A)
            torch.mm(pts[mat.offset].t(), Qt, out=G)
            self._set_rows(out, mat, G)
            for r in range(m):
                torch.sub(self._matrix(A[r], mat), G, out=self._matrix(E[r], mat))
            if float(torch.linalg.vector_norm(Qt)) < COLLAPSE:  # redraw, as lowrank does
                Qt.copy_(self._draw(ws["shared"], rk * b, A).view(rk, b))
            Qs[:, mat.q : mat.q + rk * b].copy_(Qt.view(1, -1))
        self._unpack_dense(plan, first, plan.p, out)

    def _new_bases(self, block: Block, g: torch.Tensor) -> None:
        """Greedy's basis of every matrix: the left singular vectors of ``Ḡ`` seen from its
        short side (the same on every row: computed from the first)."""
        basis = block.state["basis"]
        for mat in block.workspace["plan"].matrices:
            s = mat.short
            Gbar = self._shared(block, ("Gbar", mat.offset), (s, mat.long), g)
            Gbar.copy_(self._short_view(g[0], mat))
            U = torch.linalg.svd(Gbar, full_matrices=False).U  # s × s
            basis[:, mat.basis : mat.basis + s * s].copy_(U.reshape(1, -1))

    # -- views and buffers ------------------------------------------------------------------------
    @staticmethod
    def _matrix(row: torch.Tensor, mat: Matrix) -> torch.Tensor:
        return row[mat.offset : mat.offset + mat.a * mat.b].view(mat.a, mat.b)

    @classmethod
    def _short_view(cls, row: torch.Tensor, mat: Matrix) -> torch.Tensor:
        """The matrix seen from its short side (s × L): ``M`` or ``Mᵀ``."""
        M = cls._matrix(row, mat)
        return M if mat.left else M.t()

    @classmethod
    def _set_rows(cls, out: torch.Tensor, mat: Matrix, value: torch.Tensor) -> None:
        """Every row's matrix ← ``value`` (a × b)."""
        out[:, mat.offset : mat.offset + mat.a * mat.b].view(-1, mat.a, mat.b).copy_(value)

    @staticmethod
    def _pack_dense(plan: Plan, A: torch.Tensor, dst: torch.Tensor, at: int) -> None:
        for offset, size in plan.dense:
            dst[:, at : at + size].copy_(A[:, offset : offset + size])
            at += size

    @staticmethod
    def _unpack_dense(plan: Plan, src: torch.Tensor, at: int, out: torch.Tensor) -> None:
        for offset, size in plan.dense:
            out[:, offset : offset + size].copy_(src[:, at : at + size])
            at += size

    @staticmethod
    def _draw(rng: Stream, count: int, like: torch.Tensor) -> torch.Tensor:
        """``count`` standard normals from the shared stream (one call), as a fresh tensor."""
        return rng.normal(count, dtype=like.dtype, device=like.device)[0].contiguous()

    @staticmethod
    def _shared(block: Block, key: Any, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A work tensor for what is the same on every row (fresh tensors start 64-byte
        aligned), kept per key."""
        work = block.workspace["scratch"]
        t = work.get(key)
        if t is None or tuple(t.shape) != tuple(shape) or t.dtype != like.dtype:
            t = work[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return t

    def _rows(self, block: Block, name: str, width: int) -> torch.Tensor:
        """An [m, width] work tensor of the block's dtype whose rows start 64-byte aligned, as
        a node's own buffer does (the per-node products then round alike everywhere)."""
        x, work = block.x, block.workspace["scratch"]
        t = work.get(("rows", name))
        if t is None or t.shape[1] != width:
            item = x.element_size()
            pitch = max(1, -(-width * item // _ALIGN) * _ALIGN // item)
            t = work[("rows", name)] = torch.empty((x.shape[0], pitch), dtype=x.dtype,
                                                   device=x.device)[:, :width]
        return t


class PowerSGD(GreedyLore):
    r"""PowerSGD on the complete graph: :class:`GreedyLore`'s machinery with
    ``subspace="power"`` (one warm-started power step per round, EF on ``A_i − P̂ Q̄ᵀ``)::

        A_i = G_i + E_i;  P̂ = orth(mean_i A_i Q);  Q ← mean_i A_iᵀ P̂;  ḡ = P̂ Qᵀ;  E_i ← A_i − ḡ

    A preset: the rank defaults to 1 (torch's ``powerSGD_hook``), no refresh rounds. See
    docs/algorithms/greedylore.md.

    Args:
        eta, start, min_compression: as :class:`GreedyLore`'s.
        rank: r. Default 1.
        refresh: τ, rounds between full-precision rounds that reset the memory (the warm start
            is kept); 0 (default): never.
        subspace: ``power`` (``greedy`` is :class:`GreedyLore`).
    """

    name = "powersgd"

    def __init__(self, eta: float | Callable[[int], float] = 0.1, rank: int = 1, refresh: int = 0,
                 start: int = 10, min_compression: float = 2.0, subspace: str = "power"):
        super().__init__(eta, rank, refresh, start, min_compression, subspace)
