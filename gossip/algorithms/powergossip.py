"""PowerGossip (Vogels, Karimireddy, Jaggi NeurIPS'20; docs/algorithms/powergossip.md).

For every edge {i, j} and every matrix-shaped tensor M (``T.reshape(T.shape[0], -1)``), both
ends keep the same factors P (m×r), Q (k×r) of the edge difference ``D = M_a − M_b``
(a = max(i, j)). Rounds alternate: odd rounds orthonormalise Q and exchange ``u_i = M_i Q̂``,
even rounds orthonormalise P and exchange ``u_i = M_iᵀ P̂``. Because the sketch is linear,
``u_a − u_b`` is the sketch of D on both ends, and each node moves by the shared projection::

    M_i ← M_i − γ Σ_j w_ij (u_i − u_j) Q̂ᵀ          (odd)    M_i − γ Σ_j w_ij P̂ (u_i − u_j)ᵀ  (even)

The new factor is kept (warm start), so consecutive rounds run a power iteration on the slowly
changing difference; without warm start the input factor is redrawn from the edge's shared
stream every round (keyed by the edge, what ``node.edge_rng(j)`` draws: both ends draw the
same). With gradients (a training run) the node computes its gradient at the pre-gossip model,
gossips, then takes its local step (D-PSGD order). Tensors with ndim ≤ 1 are gossiped exactly
(rate 1). No extra hyper-parameter: γ = 1 works untuned (the optimal over-relaxation
2/((1−λ₂)+β) is faster).
Differences from the reference code: no skipped first step; a factor that collapses below
1e-12 (the edge reached consensus) is redrawn from the edge stream instead of staying 0.

Runs as a block (gossip/core/block.py) with one message per arc: the factors are per-arc state
(``block.arc_state["P{j}"]``, a list over the layout's matrices of [A, rows, r] tensors, a
row per arc (i, j) the block sends; node i's ``state["P{j}"]`` is its list for edge {i, j},
as before). Draws, norms, the Gram–Schmidt divisions, differences and the vectors' mixing run
batched over arcs; the matrix products (sketches, updates, Gram–Schmidt projections) run per
arc on 64-byte aligned operands, because a batched product (``bmm``) rounds differently from
the per-edge one (MKL's kernels depend on size and alignment), which would make the bits
depend on how many arcs a process holds.

Under message loss (``on_loss = "edge"``, docs/network.md): an edge whose message of a power
step is lost either way sits that step out at both ends (the engine's delivered plan says so
in ``out_delivered``, the same at both ends): neither end moves by it and its output factor
keeps its previous value, so Σ_i M_i is kept exactly and both ends keep the same factors; its
input factor is orthonormalized as in any step (both ends do it), and the next step starts its
power iteration from the older factors. There is no error feedback to keep consistent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gossip.algorithms.arcs import OutArcs, aligned_arcs
from gossip.core.algorithm import Algorithm, Round, check_range, scheduled
from gossip.core.block import Block
from gossip.core.requirements import Requirements
from gossip.errors import ConfigError

EPS = 1e-8


class PowerGossip(Algorithm):
    """PowerGossip: per-edge, warm-started rank-r power steps on the model differences.

    Odd steps send ``M_i Q̂`` and move ``M_i −= γ Σ_j w_ij (u_i − u_j) Q̂ᵀ``, even steps the
    same with ``P̂`` on the other side. See docs/algorithms/powergossip.md.

    Args:
        gamma: mixing step (1 works untuned). Default 1.
        rank: rank r of the per-edge factors. Default 1.
        iterations: power steps (message exchanges) per round. Default 1.
        warm_start: keep the factors between steps (False: redraw them). Default True.
        eps: Gram–Schmidt guard. Default 1e-8.
        eta: local step size or schedule (training uses the node's optimizer). Default 0.
    """
    name = "powergossip"
    on_loss = "edge"  # an edge moves both ends by ± the same projection, or neither
    state_copies = 4
    neighbor_copies = 1
    trains = True
    takes_optimizer = True
    step_schedule = True
    step_rule = "dgd"
    needs_layout = True
    requires = Requirements(
        compressor="identity",
        compressor_message="PowerGossip compresses with its own per-edge low-rank sketch: set its "
                           "rank (--rank R) and leave the compressor at 'none'")

    def __init__(self, gamma: float = 1.0, rank: int = 1, iterations: int = 1,
                 warm_start: bool = True, eps: float = EPS,
                 eta: float | Callable[[int], float] = 0.0):
        check_range("gamma", gamma, 0.0, 2.0, "Stable for 0 < gamma < 2/beta; 1 needs no tuning.")
        if int(rank) < 1:
            raise ConfigError(f"rank = {rank}: PowerGossip's rank must be at least 1")
        if int(iterations) < 1:
            raise ConfigError(f"iterations = {iterations}: at least one power step per round")
        self.gamma = gamma
        self.rank = int(rank)
        self.iterations = int(iterations)
        self.warm_start = bool(warm_start)
        self.eps = float(eps)
        self.eta = eta

    def setup(self, block: Block) -> None:
        work = block.workspace["edges"] = _Edges(block, self)
        x, arcs = block.x, work.arcs
        rng = block.arc_rng(arcs.route, "edge", undirected=True)  # both ends of an edge
        count = len(arcs.route.arcs)  # draw the same factors

        def draw(rows: int, r: int) -> torch.Tensor:
            f = aligned_arcs(count, (rows, r), x.dtype, x.device)
            return f.copy_(rng.normal(rows * r, dtype=x.dtype, device=x.device).view(f.shape))

        ps = [draw(rows, r) for (rows, _), r in zip(work.shapes, work.ranks)]
        qs = [draw(cols, r) for (_, cols), r in zip(work.shapes, work.ranks)]
        block.arc_state["P{j}"] = ps  # node i's state["P{j}"]: its list of factors for edge {i, j}
        block.arc_state["Q{j}"] = qs
        if block.has_oracle:
            block.workspace["grad"] = torch.empty_like(x)

    def step(self, block: Block) -> Round:
        grad = None
        if block.has_oracle:  # PowerGossip inside D-PSGD: gradient at the pre-gossip x
            grad = block.gradients(block.workspace["grad"])
        for k in range(self.iterations):
            yield from self._power_step(block, (block.round - 1) * self.iterations + k + 1)
        if grad is not None:
            block.local_step(grad, scheduled(self.eta, block.round))

    def _power_step(self, block: Block, step: int) -> Round:
        work = block.workspace["edges"]
        arcs, x = work.arcs, block.x
        right = step % 2 == 1  # odd: sketch with Q (u = M Q̂); even: with P (u = Mᵀ P̂)
        bases = block.arc_state["Q{j}" if right else "P{j}"]
        targets = block.arc_state["P{j}" if right else "Q{j}"]
        mats, vecs = work.views(x)
        src, weight = work.src, work.weight
        for f in bases:
            collapsed = None
            if self.warm_start:
                norms = torch.linalg.vector_norm(f.flatten(1), dim=1)
                collapsed = norms.to("cpu", torch.float64) < 1e-12
            work.redraw(block, f, collapsed)
            orthonormalize_arcs(f, self.eps)
        # the message of arc (i, j): u = M_i b (or (bᵀ M_i)ᵀ) of every matrix, then the vectors,
        # as exact floats; the products run per arc on 64-byte aligned operands, as the
        # per-edge products of a node would (BLAS kernels round by size and alignment)
        sizes = [(rows if right else cols) * r for (rows, cols), r in zip(work.shapes, work.ranks)]
        sizes += [v.shape[1] for v in vecs]
        rows_ = block.message_rows(sum(sizes) * x.element_size(), arcs.route)
        sent = rows_.mine().view(x.dtype)
        parts, pos = [], 0
        for n in sizes:
            parts.append((pos, n))
            pos += n
        for idx, (M, f) in enumerate(zip(mats, bases)):
            pos, n = parts[idx]
            dst = sent[:, pos : pos + n].view(f.shape[0], -1, f.shape[2])
            for a, i in enumerate(src):
                dst[a].copy_(M[i] @ f[a] if right else (f[a].T @ M[i]).T)
        for v, (pos, n) in zip(vecs, parts[len(mats) :]):
            sent[:, pos : pos + n].copy_(v.index_select(0, arcs.src))
        inbox = yield rows_
        got = block.received_arcs(inbox).view(x.dtype)  # row a: from j along arc (j, i)
        live = rows_.route.out_delivered  # under loss: the edges both of whose messages arrived
        live_list = None if live is None else live.tolist()
        moved = [(a, i) for a, i in enumerate(src) if live is None or live_list[a]]
        for idx, (M, b, g) in enumerate(zip(mats, bases, targets)):
            pos, n = parts[idx]
            mine = sent[:, pos : pos + n].view(b.shape[0], -1, b.shape[2])
            theirs = got[:, pos : pos + n].view(mine.shape)
            upd = work.update(idx, M)
            if right:  # diff = u_i − u_j = σ (u_a − u_b);  P ← σ diff;  ΔM_i += w diff Q̂ᵀ
                diff = work.scratch(("d", idx), mine.shape, x)
                torch.sub(mine, theirs, out=diff)
                _set_factors(g, diff, work.sign, live)
                for a, i in moved:
                    upd[i].add_(diff[a] @ b[a].T, alpha=weight[a])
            else:  # the transpose of diff, laid out as the per-edge (bᵀ M)ᵀ − u_j makes it
                diff_t = work.scratch(("t", idx), (mine.shape[0], mine.shape[2], mine.shape[1]), x)
                torch.sub(mine.transpose(1, 2), theirs.transpose(1, 2), out=diff_t)
                _set_factors(g, diff_t.transpose(1, 2), work.sign, live)
                for a, i in moved:
                    upd[i].add_(b[a] @ diff_t[a], alpha=weight[a])
            M.sub_(upd, alpha=self.gamma)
        for idx, (v, (pos, n)) in enumerate(zip(vecs, parts[len(mats) :])):
            upd = work.update(len(mats) + idx, v)
            diff = sent[:, pos : pos + n] - got[:, pos : pos + n]
            if live is not None:  # a skipped edge adds +0 (its received row may be anything)
                diff = torch.where(live.view(-1, 1), diff, torch.zeros_like(diff))
            arcs.add_to_senders(upd, diff, arcs.weight)
            v.sub_(upd)


def _set_factors(g: torch.Tensor, diff: torch.Tensor, sign: torch.Tensor,
                 live: torch.Tensor | None) -> None:
    """``g[a] = σ_a diff[a]``: the new output factor of every arc (``live``: of the arcs whose
    edge took part in the step; the others keep theirs)."""
    if live is None:
        g.copy_(diff).mul_(sign)
    else:
        g.copy_(torch.where(live.view(-1, 1, 1), diff * sign, g))


def orthonormalize_arcs(f: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Gram–Schmidt on the columns of every ``f[a]`` ([A, n, r]; each ``f[a]`` contiguous and
    64-byte aligned, as a factor of its own), in place: ``col /= ‖col‖ + eps``, then project it
    out of the later columns. Bit for bit as on each factor alone: the column norms and the projections'
    elementwise parts run batched (a norm over a row of the batch adds in the order of the
    single column's), the ``col @ rest`` products per arc (BLAS rounds by size and alignment)."""
    r = f.shape[2]
    for c in range(r):
        col = f[:, :, c]
        col.div_(torch.linalg.vector_norm(col, dim=1, keepdim=True).add_(eps))
        if c + 1 < r and f.shape[0]:
            rest = f[:, :, c + 1 :]
            proj = torch.stack([col[a] @ rest[a] for a in range(f.shape[0])])
            rest.sub_(col.unsqueeze(2) * proj.unsqueeze(1))  # torch.outer's products
    return f


class _Edges:
    """A block's arcs as PowerGossip uses them: each arc's sender row, weight w_ij and sign σ
    (+1 when i > j), the layout's matrices and vectors, the per-arc draw counts of the round
    (each edge's stream advances per draw, as ``node.edge_rng(j)``'s does), and scratch."""

    def __init__(self, block: Block, alg: PowerGossip):
        self.arcs = arcs = OutArcs(block)
        arcs.require_symmetric(alg.name)
        x = block.x
        self.src = arcs.src.tolist()
        self.weight = arcs.weight.tolist()
        self.sign = torch.where(arcs.lower, -1.0, 1.0).to(x.dtype).view(-1, 1, 1)
        layout = block.nodes[0].layout if block.nodes else None
        self.mat_at, self.vec_at, self.shapes = [], [], []
        for off, size, shape in zip(layout.offsets, layout.sizes, layout.shapes) if layout else ():
            if len(shape) > 1:
                self.mat_at.append((off, size, shape[0]))
                self.shapes.append((shape[0], size // shape[0]))
            else:
                self.vec_at.append((off, size))
        self.ranks = [min(alg.rank, *sh) for sh in self.shapes]
        self._round = -1
        self._draws = torch.zeros(len(arcs.route.arcs), dtype=torch.int64)
        self._scratch: dict[Any, torch.Tensor] = {}

    def views(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The block's matrices ([m, rows, cols] views of x) and vectors ([m, n] views)."""
        mats = [x[:, o : o + s].view(x.shape[0], rows, -1) for o, s, rows in self.mat_at]
        return mats, [x[:, o : o + s] for o, s in self.vec_at]

    def redraw(self, block: Block, f: torch.Tensor, collapsed: torch.Tensor | None) -> None:
        """Redraw the factors of the arcs ``collapsed`` ([A] bool; None: every arc) from their
        edges' streams, each at its own count of draws this round."""
        if self._round != block.round:
            self._round = block.round
            self._draws.zero_()
        sel = (torch.arange(f.shape[0]) if collapsed is None else collapsed.nonzero().view(-1))
        if not sel.numel():
            return
        rng = block.arc_rng(self.arcs.route, "edge", undirected=True)
        n = f[0].numel()
        for call in torch.unique(self._draws[sel]).tolist():  # one batched draw per count
            rows = sel[self._draws[sel] == call]
            rng.call = call
            drawn = rng.normal(n, dtype=f.dtype, device=f.device).view(f.shape)
            if rows.numel() == f.shape[0]:
                f.copy_(drawn)
            else:
                rows = rows.to(f.device)
                f[rows] = drawn[rows]
        self._draws[sel] += 1

    def update(self, idx: int, like: torch.Tensor) -> torch.Tensor:
        """A zeroed [m, ...] accumulator of the nodes' moves of tensor ``idx``."""
        return self.scratch(("u", idx), like.shape, like).zero_()

    def scratch(self, key: Any, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        t = self._scratch.get(key)
        if t is None or tuple(t.shape) != tuple(shape):
            t = self._scratch[key] = aligned_arcs(shape[0], tuple(shape[1:]), like.dtype,
                                                  like.device)
        return t
