"""Gradient oracles: what an algorithm calls for ``∇f_i`` estimates (docs/algorithms/prox-lead.md).

An oracle belongs to one node. ``oracle.grad(x, out)`` returns an estimate of ``∇f_i(x)``; every
random choice (sample indices, the LSVRG refresh coin) comes from the node's ``torch.Generator``,
so the same seed gives the same sequence of samples, in-process or under MPI. Estimator state
(LSVRG reference point, SAGA table) is saved with ``state_dict()`` — tensors and ints only — and
restored with ``load_state_dict()``; the generator's own state belongs to the node, not here.

Estimators (local finite sum ``f_i = (1/m) Σ_l f_{i,l}``, batch ``B`` of ``batch_size`` indices):

* ``full``  — ``g = ∇f_i(x)``.
* ``sgd``   — ``g = (1/|B|) Σ_{l∈B} ∇f_{i,l}(x)``.
* ``lsvrg`` — ``g = (1/|B|) Σ_{l∈B} (∇f_{i,l}(x) − ∇f_{i,l}(w)) + μ`` with ``μ = ∇f_i(w)``; then,
  with probability ``p`` (default ``1/m``), ``w ← x`` and ``μ ← ∇f_i(x)``. ``w`` starts at the
  first ``x`` seen, so the first estimate is exactly ``∇f_i(x)``.
* ``saga``  — table ``φ_l`` of the last gradient of each sample (initialised at the first ``x``
  seen) and its mean ``ψ``: ``g = (1/|B|) Σ_{l∈B} (∇f_{i,l}(x) − φ_l) + ψ``; then
  ``ψ += Σ_{l∈B} (∇f_{i,l}(x) − φ_l)/m`` and ``φ_l ← ∇f_{i,l}(x)``.

Every oracle counts its calls where they happen (:meth:`Oracle.counters`, saved with its state):
``grads`` gradient estimates handed out, ``sample_grads`` per-sample gradients they evaluated (a
full local gradient counts ``m_i``, 1 when ``f_i`` is not a finite sum), ``values`` local loss
values, ``prox`` proximal steps (of ``r`` or of the node's own ``f_i``). The engine logs them
per node next to the bits (docs/experiments.md); an algorithm that evaluates the problem behind
an oracle itself (GT-SARAH) reports what it evaluated with :meth:`Oracle.count`.

Sampling: ``batch_size == 1`` draws one index with ``torch.randint``; larger batches draw distinct
indices (the first ``batch_size`` entries of ``torch.randperm(m)``). LSVRG draws the indices first,
then its coin (``torch.rand``). For GLMs SAGA stores the ``m`` scalars ``φ'(a_lᵀx, b_l)`` rather
than ``m × d`` gradients; the common ``l2·x`` term of the per-sample gradients is then evaluated at
the current ``x`` (it is the same for every sample, so the estimate stays unbiased and only the data
term is variance-reduced).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from gossip.catalog import ESTIMATORS
from gossip.errors import ConfigError

ORACLE_FIELDS = {"grads": "grads_per_node", "sample_grads": "sample_grads_per_node",
                 "values": "values_per_node", "prox": "prox_per_node"}
"""The oracles' counters (:meth:`Oracle.counters`) and their record
fields, in the order they are gathered."""


class Problem(Protocol):
    """What an oracle reads of its problem (:class:`gossip.problems.base.Problem` has it all): a
    problem written from scratch serves the ``full`` oracle with the first group alone, and the
    sampled ones with the finite-sum group too. One with ``linear_model`` set also has the data
    ``A``, ``b``, ``l2`` and ``_dphi`` of :class:`gossip.problems.glm.GLM`."""

    dtype: torch.dtype
    device: torch.device
    regularizer: Any
    linear_model: bool

    def check_node(self, i: int) -> int: ...
    def grad_full(self, i: int, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor: ...

    @property
    def finite_sum(self) -> bool: ...
    def n_samples(self, i: int) -> int | None: ...
    def sample_grads(self, i: int, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...
    def batch_grad(self, i: int, idx: torch.Tensor, x: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor: ...

    # optional, the block path (:meth:`Oracle.block_group`): a problem with
    # ``block_gradients = True`` also has
    # ``grad_full_block(nodes: Sequence[int], X: Tensor, out: Tensor) -> Tensor``


class Oracle(ABC):
    """Node ``node``'s gradient estimator for ``problem``.

    Attributes:
        problem, node, generator: what it was built with.
        sample_grads: how many per-sample gradients it evaluated so far (a full local gradient
            counts ``m_i``); a cost measure for plots, saved in the state dict.
        grads, values, prox: gradient estimates handed out, local loss values, proximal steps
            (:meth:`counters`; saved in the state dict too).
    """

    estimator: ClassVar[str]

    def __init__(self, problem: Problem, node: int, generator: torch.Generator | None = None):
        self.problem = problem
        self.node = problem.check_node(node)
        self.generator = generator
        self.sample_grads = 0
        self.grads = 0
        self.values = 0
        self.prox_steps = 0

    COUNTERS: ClassVar[tuple[str, ...]] = ("grads", "sample_grads", "values", "prox")
    """The names of :meth:`counters`, in the order the engine gathers them."""

    def counters(self) -> dict[str, int]:
        """The calls so far: ``grads`` (gradient estimates), ``sample_grads`` (per-sample
        gradients evaluated), ``values`` (local losses), ``prox`` (proximal steps)."""
        return {"grads": self.grads, "sample_grads": self.sample_grads, "values": self.values,
                "prox": self.prox_steps}

    def count(self, grads: int = 0, sample_grads: int = 0, values: int = 0, prox: int = 0) -> None:
        """Add calls to the counters: what an algorithm that evaluates the problem behind this
        oracle itself (not through :meth:`grad`) reports, so its costs are logged as any
        other's."""
        self.grads += grads
        self.sample_grads += sample_grads
        self.values += values
        self.prox_steps += prox

    @abstractmethod
    def grad(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """An estimate of ``∇f_i(x)``, written into ``out`` when given (must not alias ``x``)."""

    # -- the block path: several nodes' estimates in one batched operation ---------------------
    def block_group(self) -> Hashable | None:
        """Which oracles :meth:`grad_block` serves together with this one (those with an equal
        key, all of this class), or None (the default) when there is no block path and a block
        asks :meth:`grad` node by node. A class returns a key only where its block path gives
        the same bits as :meth:`grad` on each node (and draws the same numbers from each node's
        generator, in the same order), so a block's nodes compute the same whether a process
        holds one of them or all (in process == MPI)."""
        return None

    @classmethod
    def grad_block(cls, oracles: Sequence[Oracle], X: torch.Tensor,
                   out: torch.Tensor) -> torch.Tensor:
        """The estimates of ``oracles`` (equal :meth:`block_group` keys, in the order of the rows)
        at the rows of ``X``, into the rows of ``out`` (must not alias ``X``): row k is
        ``oracles[k].grad(X[k])``, bit for bit, with the same counters and the same draws."""
        raise TypeError(f"{cls.__name__}.grad_block was called, but {cls.__name__} has no block "
                        f"path (its block_group() is None): ask {cls.__name__}.grad node by node, "
                        f"or give the class a block_group() key and a grad_block of the same bits")

    def loss(self, x: torch.Tensor) -> float:
        """``f_i(x)``, the node's whole local loss (a federated round's power-of-choice
        selection ranks its candidates by it)."""
        self.values += 1
        return float(self.problem.local_loss(self.node, x))

    @property
    def has_prox(self) -> bool:
        """True when the problem has a non-smooth regularizer ``r`` (use a proximal algorithm)."""
        return self.problem.regularizer is not None

    def prox(self, v: torch.Tensor, eta: float, out: torch.Tensor | None = None) -> torch.Tensor:
        """``prox_{η r}(v)`` of the problem's regularizer (``out`` may alias ``v``)."""
        if self.problem.regularizer is None:
            raise ConfigError(
                f"{type(self.problem).__name__} has no regularizer, so there is no prox; "
                "check oracle.has_prox first or use a problem with l1 > 0 (Lasso, L1Logistic)"
            )
        self.prox_steps += 1
        return self.problem.regularizer.prox(v, eta, out)

    @property
    def has_local_prox(self) -> bool:
        """True when the problem solves the node's proximal subproblem exactly (its ``f_i`` are
        quadratic: :meth:`local_prox`)."""
        return bool(getattr(self.problem, "quadratic", False))

    def local_prox(self, v: torch.Tensor, eta: float, out: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """``argmin_x f_i(x) + ‖x − v‖²/(2η)`` of the node's own smooth ``f_i``, exact
        (:meth:`gossip.problems.base.Problem.local_prox`; :class:`ConfigError` when ``f_i`` is
        not quadratic). It draws nothing, whatever the estimator."""
        local = getattr(self.problem, "local_prox", None)
        if local is None or not self.has_local_prox:
            raise ConfigError(
                f"{type(self.problem).__name__} has no exact local solve (its f_i are not "
                "quadratic); use a gradient method (dlm, extra, lead) or a quadratic problem")
        self.prox_steps += 1
        return local(self.node, v, eta, out)

    def state_dict(self) -> dict[str, Any]:
        """Estimator state (tensors are the live buffers, not copies; ints)."""
        return {"sample_grads": self.sample_grads, "grads": self.grads, "values": self.values,
                "prox": self.prox_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (values are copied in; a state saved
        before the other counters existed restores them as 0)."""
        self.sample_grads = int(state["sample_grads"])
        self.grads = int(state.get("grads", 0))
        self.values = int(state.get("values", 0))
        self.prox_steps = int(state.get("prox", 0))

    def _out(self, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if out is None:
            return torch.empty_like(x)
        if out.data_ptr() == x.data_ptr():
            raise ConfigError(f"{self.estimator} oracle: out must not alias x")
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(node={self.node}, problem={type(self.problem).__name__})"


class FullGradient(Oracle):
    """``g = ∇f_i(x)`` (deterministic; the generator is not used)."""

    estimator = "full"

    def __init__(self, problem: Problem, node: int, generator: torch.Generator | None = None):
        super().__init__(problem, node, generator)
        self._m = problem.n_samples(self.node) or 1  # per-sample gradients in one
        self._group = (FullGradient, id(problem)) if getattr(problem, "block_gradients", False) \
            else None

    def grad(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        out = self._out(x, out)
        self.problem.grad_full(self.node, x, out)
        self.sample_grads += self._m
        self.grads += 1
        return out

    def block_group(self) -> Hashable | None:
        """The problem's nodes together, where it computes their gradients as one
        (``block_gradients``, read when the oracle is made:
        :meth:`gossip.problems.base.Problem.grad_full_block`)."""
        return self._group

    @classmethod
    def grad_block(cls, oracles, X, out):
        if out.data_ptr() == X.data_ptr():
            raise ConfigError("full oracle: out must not alias x")
        pb = oracles[0].problem
        pb.grad_full_block([o.node for o in oracles], X, out)
        for o in oracles:
            o.sample_grads += o._m
            o.grads += 1
        return out


class FullGradientRows:
    """The ``full`` oracles of a block's nodes on one problem with block gradients, held as
    arrays: the problem's node of every row (``nodes``) and the counters of every row
    (``counts[k, r]``, k in :attr:`Oracle.COUNTERS`' order). An engine of 10⁶ nodes then starts
    without 10⁶ oracle objects (measured: ~10 µs a node to make one, its generator and its
    checks) and asks a whole run of rows in one :meth:`grad_rows`: ``problem.grad_full_block``,
    the bits of :meth:`FullGradient.grad` on each row (the block path's contract).

    A node's oracle, when something reads it (``engine.nodes[i].oracle``: checkpoints, metrics,
    per-node code), is a :class:`FullGradient` of that row (:meth:`oracle`) whose counters are
    this object's entries, so either path counts in one place."""

    estimator = "full"

    def __init__(self, problem: Problem, nodes: Sequence[int] | np.ndarray):
        idx = np.asarray(nodes, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= problem.n_nodes):
            raise ConfigError(f"node indices must be in [0, {problem.n_nodes}) for "
                              f"{type(problem).__name__}, got {int(idx.min())}..{int(idx.max())}")
        if not getattr(problem, "block_gradients", False):
            raise ConfigError(f"{type(problem).__name__} has no block path for its gradients "
                              "(block_gradients is False): make each node's oracle")
        self.problem = problem
        self.nodes = idx
        self.group = (FullGradient, id(problem))
        """The block key of its oracles (:meth:`Oracle.block_group`), the per-node ones' too."""
        if problem.finite_sum:  # per-sample gradients a full gradient counts
            self.m = np.array([problem.n_samples(int(i)) or 1 for i in idx], dtype=np.int64)
        else:
            self.m = np.ones(idx.size, dtype=np.int64)
        self.counts = np.zeros((len(Oracle.COUNTERS), idx.size), dtype=np.int64)
        self._views: dict[int, FullGradient] = {}

    def __len__(self) -> int:
        return int(self.nodes.size)

    def oracle(self, r: int) -> FullGradient:
        """Row ``r``'s oracle (made on first call, then the same object)."""
        view = self._views.get(r)
        if view is None:
            view = self._views[r] = _FullGradientRow(self, r)
        return view

    def owns(self, r: int, oracle: Any) -> bool:
        """Whether ``oracle`` is row ``r``'s own (:meth:`oracle`), not one put in its place."""
        return oracle is not None and self._views.get(r) is oracle

    def grad_rows(self, lo: int, hi: int, X: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Rows ``lo..hi-1``'s gradients at the rows of ``X`` into those of ``out`` (``X`` and
        ``out`` hold those rows only; ``out`` must not alias ``X``), counted."""
        if out.data_ptr() == X.data_ptr():
            raise ConfigError("full oracle: out must not alias x")
        self.problem.grad_full_block(self.nodes[lo:hi], X, out)
        self.counts[0, lo:hi] += 1
        self.counts[1, lo:hi] += self.m[lo:hi]
        return out


def _counter(k: int) -> property:
    def get(self: _FullGradientRow) -> int:
        return int(self._rows.counts[k, self._r])

    def put(self: _FullGradientRow, value: int) -> None:
        self._rows.counts[k, self._r] = value

    return property(get, put, doc=f"This row's entry of ``counts[{k}]``.")


class _FullGradientRow(FullGradient):
    """Row ``r``'s :class:`FullGradient` of a :class:`FullGradientRows`: the same oracle, its
    counters that object's entries. Its generator is None: the full estimator draws nothing
    (the node's own generator is still the node's: ``node.generator``)."""

    grads = _counter(0)
    sample_grads = _counter(1)
    values = _counter(2)
    prox_steps = _counter(3)

    def __init__(self, rows: FullGradientRows, r: int):  # (no Oracle.__init__: it zeroes counters)
        self._rows = rows
        self._r = r
        self.problem = rows.problem
        self.node = int(rows.nodes[r])
        self.generator = None
        self._m = int(rows.m[r])
        self._group = rows.group


class OracleFactory:
    """What ``Engine(oracles=...)`` takes from a problem (:meth:`gossip.problems.base.Problem.oracles`):
    ``factory(i, generator)`` is node i's oracle (:func:`make_oracle`), and :meth:`rows` every
    node of a block at once where the estimator allows (the ``full`` one on a problem with
    ``block_gradients``), which the engine asks first."""

    def __init__(self, problem: Problem, estimator: str = "full", batch_size: int = 1,
                 p: float | None = None):
        self.problem = problem
        self.estimator = estimator
        self.batch_size = batch_size
        self.p = p

    def __call__(self, i: int, generator: torch.Generator | None = None) -> Oracle:
        return make_oracle(self.problem, i, generator, self.estimator, self.batch_size, self.p)

    def rows(self, nodes: Sequence[int]) -> FullGradientRows | None:
        """The oracles of ``nodes`` (a block's ids, in row order) as one object, or None when
        each node needs its own (a sampled estimator draws from its node's generator; a problem
        without block gradients computes node by node)."""
        if self.estimator != "full" or self.p is not None \
                or not getattr(self.problem, "block_gradients", False):
            return None
        return FullGradientRows(self.problem, nodes)


class _Sampled(Oracle):
    """Common part of the stochastic estimators: drawing mini-batch indices."""

    def __init__(self, problem: Problem, node: int, generator: torch.Generator, batch_size: int):
        super().__init__(problem, node, generator)
        self.m = int(problem.n_samples(self.node))
        self.batch_size = int(batch_size)

    def sample(self) -> torch.Tensor:
        """The next mini-batch of sample indices (on the problem's device)."""
        gen = self.generator
        if self.batch_size == 1:
            idx = torch.randint(self.m, (1,), generator=gen, device=gen.device)
        else:
            idx = torch.randperm(self.m, generator=gen, device=gen.device)[: self.batch_size]
        return idx.to(self.problem.device)

    def grad(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.grad_at(x, self.sample(), out)

    @abstractmethod
    def grad_at(
        self, x: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The estimate for the given indices (and the state update that goes with it)."""


class SGD(_Sampled):
    """``g = (1/|B|) Σ_{l∈B} ∇f_{i,l}(x)``."""

    estimator = "sgd"

    def grad_at(self, x, idx, out=None):
        out = self._out(x, out)
        self.problem.batch_grad(self.node, idx, x, out)
        self.sample_grads += idx.numel()
        self.grads += 1
        return out


class LSVRG(_Sampled):
    """Loopless SVRG (see the module docstring); ``p`` defaults to ``1/m``."""

    estimator = "lsvrg"

    def __init__(self, problem, node, generator, batch_size, p: float | None = None):
        super().__init__(problem, node, generator, batch_size)
        self.p = 1.0 / self.m if p is None else float(p)
        if not 0.0 < self.p <= 1.0:
            raise ConfigError(f"the LSVRG refresh probability p must be in (0, 1], got {p} (default "
                               f"1/m = {1.0 / self.m:g} for node {self.node})", node=self.node)
        self.w: torch.Tensor | None = None
        self.mu: torch.Tensor | None = None
        self._tmp: torch.Tensor | None = None

    def _refresh(self, x: torch.Tensor) -> None:
        if self.w is None:
            self.w = x.detach().clone()
            self.mu = torch.empty_like(x)
        else:
            self.w.copy_(x)
        self.problem.grad_full(self.node, self.w, self.mu)
        self.sample_grads += self.m

    def grad(self, x, out=None):
        idx = self.sample()
        coin = torch.rand((), generator=self.generator, device=self.generator.device)
        return self.grad_at(x, idx, out, refresh=bool(coin < self.p))

    def grad_at(self, x, idx, out=None, refresh: bool = False):
        out = self._out(x, out)
        if self.w is None:
            self._refresh(x)
        pb = self.problem
        if pb.linear_model:
            # one gather: A_B^T (φ'(A_B x) − φ'(A_B w))/|B| + μ + l2 (x − w)
            rows = pb.A[self.node].index_select(0, idx)
            bb = pb.b[self.node].index_select(0, idx)
            c = pb._dphi(torch.mv(rows, x), bb).sub_(pb._dphi(torch.mv(rows, self.w), bb))
            torch.mv(rows.T, c, out=out)
            out.mul_(1.0 / idx.numel()).add_(self.mu)
            if pb.l2:
                out.add_(x, alpha=pb.l2).add_(self.w, alpha=-pb.l2)
        else:
            if self._tmp is None:
                self._tmp = torch.empty_like(x)
            pb.batch_grad(self.node, idx, x, out)
            out.sub_(pb.batch_grad(self.node, idx, self.w, self._tmp)).add_(self.mu)
        self.sample_grads += 2 * idx.numel()
        self.grads += 1
        if refresh:
            self._refresh(x)
        return out

    def state_dict(self):
        state = super().state_dict()
        state["initialized"] = int(self.w is not None)
        if self.w is not None:
            state["w"], state["mu"] = self.w, self.mu
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if int(state["initialized"]):
            if self.w is None:
                self.w = torch.empty_like(state["w"], device=self.problem.device,
                                          dtype=self.problem.dtype)
                self.mu = torch.empty_like(self.w)
            self.w.copy_(state["w"])
            self.mu.copy_(state["mu"])
        else:
            self.w = self.mu = None


class SAGA(_Sampled):
    """SAGA (see the module docstring): ``m`` scalars for GLMs, an ``m × d`` table otherwise."""

    estimator = "saga"

    def __init__(self, problem, node, generator, batch_size):
        super().__init__(problem, node, generator, batch_size)
        self.table: torch.Tensor | None = None  # (m,) coefficients for GLMs, (m, d) otherwise
        self.mean: torch.Tensor | None = None  # ψ (for GLMs: the data part (1/m) Aᵀ table)

    def _init(self, x: torch.Tensor) -> None:
        pb = self.problem
        if pb.linear_model:
            self.table = pb.coefficients(self.node, x).clone()
            self.mean = torch.mv(pb.A[self.node].T, self.table).mul_(1.0 / self.m)
        else:
            idx = torch.arange(self.m, device=pb.device)
            self.table = pb.sample_grads(self.node, idx, x).clone()
            self.mean = self.table.mean(dim=0)
        self.sample_grads += self.m

    def table_shape(self) -> tuple[int, ...]:
        """The table's shape: ``(m,)`` coefficients for GLMs, ``(m, d)`` gradients otherwise."""
        pb = self.problem
        return (self.m,) if pb.linear_model else (self.m, int(pb.dim))

    def start(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Fill the table at ``x`` (every sample's gradient; in place when ``table`` and ``mean``
        are already buffers, e.g. an algorithm's checkpointed state) and return ``∇f_i(x)``: the
        table's mean ``ψ`` (plus ``l2·x`` for GLMs). A full local gradient: ``m`` sample
        gradients. Where a method starts from ``z_{i,l} = x⁰`` (GT-SAGA) and the first
        estimate must be the exact local gradient without a draw."""
        out = self._out(x, out)
        table, mean = self.table, self.mean
        self._init(x)
        if table is not None and mean is not None:
            self.table, self.mean = table.copy_(self.table), mean.copy_(self.mean)
        out.copy_(self.mean)
        self.grads += 1
        pb = self.problem
        if pb.linear_model and pb.l2:
            out.add_(x, alpha=pb.l2)
        return out

    def grad_at(self, x, idx, out=None):
        out = self._out(x, out)
        if self.table is None:
            self._init(x)
        pb = self.problem
        B = idx.numel()
        if pb.linear_model:
            rows = pb.A[self.node].index_select(0, idx)
            c_new = pb._dphi(torch.mv(rows, x), pb.b[self.node].index_select(0, idx))
            delta = c_new - self.table.index_select(0, idx)
            v = torch.mv(rows.T, delta)  # Σ_{l∈B} (∇f_l(x) − φ_l), data part
            torch.add(self.mean, v, alpha=1.0 / B, out=out)
            if pb.l2:
                out.add_(x, alpha=pb.l2)
            self.mean.add_(v, alpha=1.0 / self.m)
            self.table.index_copy_(0, idx, c_new)
        else:
            g = pb.sample_grads(self.node, idx, x)
            delta = g - self.table.index_select(0, idx)
            v = delta.sum(dim=0)
            torch.add(self.mean, v, alpha=1.0 / B, out=out)
            self.mean.add_(v, alpha=1.0 / self.m)
            self.table.index_copy_(0, idx, g)
        self.sample_grads += B
        self.grads += 1
        return out

    def state_dict(self):
        state = super().state_dict()
        state["initialized"] = int(self.table is not None)
        if self.table is not None:
            state["table"], state["mean"] = self.table, self.mean
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if int(state["initialized"]):
            dev, dt = self.problem.device, self.problem.dtype
            if self.table is None or self.table.shape != state["table"].shape:
                self.table = torch.empty(state["table"].shape, device=dev, dtype=dt)
                self.mean = torch.empty(state["mean"].shape, device=dev, dtype=dt)
            self.table.copy_(state["table"])
            self.mean.copy_(state["mean"])
        else:
            self.table = self.mean = None


def make_oracle(
    problem: Problem,
    node: int,
    generator: torch.Generator | None = None,
    estimator: str = "full",
    batch_size: int = 1,
    p: float | None = None,
) -> Oracle:
    """Build node ``node``'s oracle; see :meth:`Problem.oracle` for the arguments and errors."""
    node = problem.check_node(node)
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown gradient estimator {estimator!r}; choose one of {ESTIMATORS}",
                           node=node)
    if p is not None and estimator != "lsvrg":
        raise ConfigError(f"p is the LSVRG refresh probability; estimator {estimator!r} takes none "
                           "(drop p, or use estimator='lsvrg')", node=node)
    if estimator == "full":
        return FullGradient(problem, node, generator)
    if not problem.finite_sum:
        raise ConfigError(
            f"estimator {estimator!r} samples from a finite sum, but {type(problem).__name__} is "
            "not one (it has no per-sample losses); use estimator='full'", node=node,
        )
    m = problem.n_samples(node)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= m:
        raise ConfigError(
            f"batch_size must be an int in [1, m_i] = [1, {m}] for node {node}, got {batch_size!r}",
            node=node,
        )
    if not isinstance(generator, torch.Generator):
        raise ConfigError(
            f"estimator {estimator!r} needs the node's torch.Generator for its sampling, "
            f"got {generator!r}; pass generator=torch.Generator().manual_seed(...)", node=node,
        )
    if estimator == "sgd":
        return SGD(problem, node, generator, batch_size)
    if estimator == "lsvrg":
        return LSVRG(problem, node, generator, batch_size, p)
    return SAGA(problem, node, generator, batch_size)
