"""Gradient oracles of a PyTorch model: what the algorithms call on a training node.

A node owns a copy of the user's module whose parameters are views into the node's flat model
``x`` (:func:`gossip.training.flat.bind`), its mini-batch stream, and — for algorithms with a
local step — its ``torch.optim`` optimizer and scheduler built on those parameters::

    g = oracle.grad(x, out)        # next mini-batch: forward, backward, gradient into ``out``
    oracle.apply_step(x, g, t)     # optimizer.step() with the grads = views of g (writes into x)

:class:`ModelOracle` has only ``grad`` (LEAD, BEER and the other algorithms that take the
gradient directly, docs/algorithms/lead.md); :class:`OptimizerOracle` adds ``apply_step``, which
D-PSGD, CHOCO-SGD, DeepSqueeze and PowerGossip call instead of ``x -= eta·g``
(:func:`gossip.core.algorithm.local_step`). :class:`BackwardOracle` and
:class:`BackwardOptimizerOracle` are their twins for :func:`gossip.wrap`: no batches, the
gradient is the one the user's ``loss.backward()`` left in ``.grad`` (docs/wrap.md).

Randomness: mini-batches come from the node's own seeded loader, and each node keeps its own
state of torch's global generator (swapped in around forward/backward), so a model with dropout
draws the same numbers in process and under MPI.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from gossip.errors import CheckpointError, DivergenceError, WrapError
from gossip.rng import quantize_seed
from gossip.training import flat
from gossip.training.precision import LossScaler, MasterWeights, QuantizedCompute, autocast_dtype, quantize_mode

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ModelOracle:
    """Stochastic gradients of ``loss_fn(module(inputs), targets)`` at a flat model.

    Args:
        module: this node's own module (already of the run's dtype and device).
        batches: endless iterator of ``(inputs, targets)`` mini-batches.
        loss_fn: mean loss of a batch (default cross-entropy).
        buffers: the flat model also holds the module's float buffers (their gradient is 0).
        l2: add ``l2·x`` to the gradient of every parameter (weight decay for algorithms
            without an optimizer).
        rng_seed: seed of the node's private state of torch's global generator.
        autocast: ``"bf16"`` / ``"fp16"``: forward and backward under ``torch.autocast`` in that
            type, ``x`` and the gradient float32 (fp16 with a dynamic loss scale,
            :mod:`gossip.training.precision`); None: in the model's dtype.
        quantize: ``"int8"`` / ``"int8-sr"``: the module's linear and convolution layers
            compute in 8 bits (:class:`~gossip.training.precision.QuantizedCompute`; ``-sr``
            rounds activations and gradients stochastically, drawing from a generator seeded
            from ``rng_seed``); None: off.

    Attributes:
        samples: samples seen so far; ``loss_sum`` / ``loss_count``: running sums since the last
            :meth:`pop_loss` (for the logged train loss); ``loss_reference``: the run's first
            logged train loss, the trainer's divergence reference (kept here so that it is
            saved with checkpoints).
    """

    def __init__(
        self,
        module: nn.Module,
        batches: Iterator[Any],
        loss_fn: LossFn | None = None,
        *,
        buffers: bool = False,
        l2: float = 0.0,
        rng_seed: int = 0,
        autocast: str | None = None,
        quantize: str | None = None,
    ):
        self.module = module
        self.batches = batches
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        self.buffers = buffers
        self.l2 = float(l2)
        self.params = flat.parameters(module)
        self.trainable = [p for p in self.params if p.requires_grad]
        self._tensors = flat.tensors(module, buffers)
        self._n_params = sum(p.numel() for p in self.params)
        ref = self.params[0] if self.params else self._tensors[0]
        self.device, self.dtype = ref.device, ref.dtype
        self.autocast = autocast_dtype(autocast, self.dtype, self.device)
        fp16 = self.autocast == torch.float16 or (self.autocast is None and self.dtype == torch.float16)
        self.scaler = LossScaler() if fp16 else None  # float16's gradients need a loss scale
        self.quantized: QuantizedCompute | None = None
        """The 8-bit compute of the node's layers, or None."""
        mode = quantize_mode(quantize, self.dtype, autocast)
        if mode is not None:
            self.quantized = QuantizedCompute(mode, quantize_seed(rng_seed), self.device)
            self.quantized.install(module)
        param_ids = {id(p) for p in self.params}
        self._has_grad = [id(t) in param_ids and t.requires_grad for t in self._tensors]
        self._zeros = {id(t): torch.zeros_like(t).reshape(-1)
                       for t, has in zip(self._tensors, self._has_grad, strict=True) if not has}
        self._bound: torch.Tensor | None = None
        self.samples = 0
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.loss_count = 0
        self.loss_reference: float | None = None
        with torch.random.fork_rng(devices=self._cuda()):
            torch.manual_seed(rng_seed)
            self._rng = self._get_rng()

    # -- binding -----------------------------------------------------------------------------
    def bind(self, x: torch.Tensor) -> None:
        """Point the module's parameters (and buffers) into ``x`` (no-op when already bound
        to that memory: the engine hands a new view of the same row every round)."""
        if not _same_memory(self._bound, x):
            flat.bind(self.module, x, self.buffers)
            self._bound = x

    # -- the oracle protocol -----------------------------------------------------------------
    def grad(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The gradient on the next mini-batch at ``x``, written into ``out``."""
        self.bind(x)
        inputs, targets = next(self.batches)
        inputs = _to(inputs, self.device, self.dtype)
        targets = _to(targets, self.device, None)
        self.module.train()
        if out is None:
            out = torch.empty_like(x)
        saved = self._get_rng()
        try:
            while True:  # once, unless an fp16 gradient overflowed its loss scale
                self._set_rng(self._rng)  # a recomputed batch draws the same numbers
                loss, grads = self._forward_backward(inputs, targets)
                self._flatten(grads, out)
                if self.scaler is None or self._unscale(loss, out):
                    break
        finally:
            self._rng = self._get_rng()
            self._set_rng(saved)
        self._add_l2(x, out)
        bs = int(targets.shape[0]) if targets.dim() else 1
        self.samples += bs
        self.loss_sum += loss.detach().to(torch.float64) * bs
        self.loss_count += bs
        return out

    def loss(self, x: torch.Tensor) -> float:
        """The mean loss of the next mini-batch at ``x``, forward only (a federated round's
        power-of-choice selection ranks its candidates by it: Cho et al.'s cpow-d estimate);
        the batch is drawn from the node's stream as a gradient's would be."""
        self.bind(x)
        inputs, targets = next(self.batches)
        inputs = _to(inputs, self.device, self.dtype)
        targets = _to(targets, self.device, None)
        cast = (contextlib.nullcontext() if self.autocast is None
                else torch.autocast(self.device.type, dtype=self.autocast))
        self.module.train()
        saved = self._get_rng()
        try:
            self._set_rng(self._rng)
            with torch.no_grad(), cast:
                value = float(self.loss_fn(self.module(inputs), targets))
        finally:
            self._rng = self._get_rng()
            self._set_rng(saved)
        return value

    def _write(self, grads: Sequence[torch.Tensor | None], x: torch.Tensor,
               out: torch.Tensor | None) -> torch.Tensor:
        """The flat gradient: ``grads`` (one per trainable parameter, None for an unused one)
        in flat order, 0 for the buffers and frozen parameters, plus ``l2·x``; into ``out``."""
        if out is None:
            out = torch.empty_like(x)
        self._flatten(grads, out)
        self._add_l2(x, out)
        return out

    def _add_l2(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out += l2·x`` on the parameters (weight decay of an oracle without an optimizer)."""
        if self.l2:
            out[: self._n_params].add_(x[: self._n_params], alpha=self.l2)

    def _forward_backward(self, inputs: Any, targets: Any) -> tuple[torch.Tensor, tuple[Any, ...]]:
        """The batch's loss and the gradients of the trainable tensors (under autocast, of
        the loss times the fp16 scale, when the oracle has one)."""
        cast = (contextlib.nullcontext() if self.autocast is None
                else torch.autocast(self.device.type, dtype=self.autocast))
        with torch.enable_grad():
            with cast:
                loss = self.loss_fn(self.module(inputs), targets)
            scaled = loss if self.scaler is None else loss.float() * self.scaler.scale
            grads = torch.autograd.grad(scaled, self.trainable, allow_unused=True)
        return loss, grads

    def _flatten(self, grads: tuple[Any, ...], out: torch.Tensor) -> None:
        """Concatenate the gradients into ``out`` in the flat model's order (0 for tensors
        without one)."""
        it = iter(grads)
        parts = []
        for t, has in zip(self._tensors, self._has_grad, strict=True):
            g = next(it) if has else None
            parts.append(g.reshape(-1) if g is not None else self._zero(t))
        torch.cat(parts, out=out)

    def _unscale(self, loss: torch.Tensor, out: torch.Tensor) -> bool:
        """Divide the fp16-scaled gradient in ``out`` by the scale (a power of two: exact);
        False when it overflowed and must be recomputed at the halved scale. A loss that is
        itself NaN/Inf (no scale helps) raises :class:`DivergenceError` saying so."""
        assert self.scaler is not None
        if not bool(torch.isfinite(loss.detach()).all()):
            how = "autocast='fp16'" if self.autocast is not None else "a float16 model"
            fix = "autocast='bf16'" if self.autocast is not None else "a bfloat16 model"
            raise DivergenceError(
                f"{how}: the loss of this mini-batch is NaN/Inf: the activations exceed fp16's "
                f"range (±65504) or the run diverged; use {fix} or lower the learning rate")
        out.mul_(1.0 / self.scaler.scale)
        return self.scaler.update(bool(torch.isfinite(out).all()))

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs besides ``x``: the batch stream's position, the
        node's generator state, the loss sums since the last log, the buffers that are not
        in ``x`` (local BatchNorm statistics) and the fp16 loss scale. Tensors, numbers, lists
        and dicts only."""
        stream = getattr(self.batches, "state_dict", None)
        return {
            "stream": stream() if stream is not None else None,
            "rng": list(self._rng),
            "samples": self.samples,
            "loss_sum": self.loss_sum.clone(),
            "loss_count": self.loss_count,
            "loss_reference": self.loss_reference,
            "local_buffers": [b.detach().clone() for b in self._local_buffers()],
            "loss_scale": self.scaler.state_dict() if self.scaler is not None else None,
            "quantize": self.quantized.state_dict() if self.quantized is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state.get("stream") is not None:
            self.batches.load_state_dict(state["stream"])  # type: ignore[attr-defined]
        self._rng = tuple(t.clone() for t in state["rng"])
        self.samples = int(state["samples"])
        self.loss_sum.copy_(state["loss_sum"])
        self.loss_count = int(state["loss_count"])
        self.loss_reference = state.get("loss_reference")
        if self.scaler is not None and state.get("loss_scale") is not None:
            self.scaler.load_state_dict(state["loss_scale"])
        if self.quantized is not None:
            if state.get("quantize") is None:
                raise CheckpointError(f"the checkpoint was trained without quantize, this run has "
                                      f"quantize={self.quantized.mode!r}: resume with the same setting")
            self.quantized.load_state_dict(state["quantize"])
        with torch.no_grad():
            for b, saved in zip(self._local_buffers(), state["local_buffers"], strict=True):
                b.copy_(saved)

    def _local_buffers(self) -> list[torch.Tensor]:
        in_x = {id(t) for t in self._tensors}
        return [b for b in self.module.buffers() if id(b) not in in_x]

    def pop_loss(self) -> tuple[float, int]:
        """(sum of per-sample losses, samples) since the last call; resets both."""
        out = (float(self.loss_sum), self.loss_count)
        self.loss_sum.zero_()
        self.loss_count = 0
        return out

    # -- helpers -----------------------------------------------------------------------------
    def _zero(self, t: torch.Tensor) -> torch.Tensor:
        z = self._zeros.get(id(t))
        if z is None:
            z = self._zeros[id(t)] = torch.zeros_like(t).reshape(-1)
        return z

    def _cuda(self) -> list[int]:
        return [self.device.index or 0] if self.device.type == "cuda" else []

    def _get_rng(self) -> tuple[torch.Tensor, ...]:
        states = [torch.get_rng_state()]
        if self.device.type == "cuda":
            states.append(torch.cuda.get_rng_state(self.device))
        return tuple(states)

    def _set_rng(self, states: tuple[torch.Tensor, ...]) -> None:
        torch.set_rng_state(states[0])
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(states[1], self.device)


class OptimizerOracle(ModelOracle):
    """A :class:`ModelOracle` whose node steps with its own ``torch.optim`` optimizer.

    Args:
        optimizer: built on ``module.parameters()`` (momentum, Nesterov, Adam, weight decay…).
        scheduler: optional ``torch.optim.lr_scheduler`` on it, stepped once per round.
        schedule_by_round: instead of stepping the scheduler after every optimizer step, bring
            it to the round ``t`` a step is taken in (``t − 1`` scheduler steps) before the
            step. For asynchronous algorithms, whose nodes take a varying number of steps per
            round (a sweep of n activations: a straggler fewer, the others more), so that every
            node's rate follows the run's sweeps, as the algorithms' own ``eta(t)`` does
            (docs/asynchronous.md). With one step per round the two agree.
    """

    def __init__(self, module: nn.Module, batches: Iterator[Any], optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, loss_fn: LossFn | None = None, *, buffers: bool = False,
                 rng_seed: int = 0, autocast: str | None = None, quantize: str | None = None,
                 master: MasterWeights | None = None, schedule_by_round: bool = False):
        super().__init__(module, batches, loss_fn, buffers=buffers, rng_seed=rng_seed,
                         autocast=autocast, quantize=quantize)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.schedule_by_round = schedule_by_round
        self.master = master
        """float32 master weights the optimizer steps (a half-precision model), or None."""
        self._grad_src: torch.Tensor | None = None

    def apply_step(self, x: torch.Tensor, g: torch.Tensor, t: int) -> None:
        """``optimizer.step()`` on ``x`` with gradient ``g`` (round ``t``; through the master
        weights when the node has them), then the scheduler (``schedule_by_round``: the
        scheduler first brought to round ``t``)."""
        self.bind(x)
        by_round = self.scheduler is not None and self.schedule_by_round
        if by_round and self.scheduler.last_epoch < t - 1:  # LambdaLR & co.: factor(t − 1)
            with warnings.catch_warnings():  # a node whose first step is after round 1
                warnings.filterwarnings("ignore", "Detected call of `lr_scheduler")
                while self.scheduler.last_epoch < t - 1:
                    self.scheduler.step()
        if self.master is not None:
            n = self.master.numel
            self.master.step(x[:n], g[:n], self.optimizer)
        elif g is not self._grad_src:
            views = flat.split(g, self._tensors)
            for p, view, has in zip(self._tensors, views, self._has_grad, strict=True):
                if has:
                    p.grad = view
            self._grad_src = g
        if self.master is None:
            self.optimizer.step()
        if self.scheduler is not None and not by_round:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """The :class:`ModelOracle` state plus the optimizer's and the scheduler's."""
        state = super().state_dict()
        state["optimizer"] = self.optimizer.state_dict()
        state["scheduler"] = self.scheduler.state_dict() if self.scheduler is not None else None
        state["master"] = self.master.state_dict() if self.master is not None else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.master is not None:
            self.master.load_state_dict(state["master"])

    @property
    def lr(self) -> float:
        """The current learning rate of the first parameter group."""
        return float(self.optimizer.param_groups[0]["lr"])


class _Handed:
    """What :class:`BackwardOracle` and :class:`BackwardOptimizerOracle` share: the gradient of
    a round is the one ``loss.backward()`` left in the module's ``.grad`` (:func:`gossip.wrap`).

    :meth:`arm` (called by ``opt.step()``) keeps a copy of the node's row of ``x``, the point
    the user's backward saw; :meth:`grad` hands the gradient over once, and only at that point
    (to the algorithm's setup at the first step when it asks, else to the round): an algorithm
    that asks for a gradient twice in a round or after it moved ``x`` would get the gradient of
    another point, and is refused with a :class:`~gossip.errors.WrapError` naming the algorithm.
    """

    algorithm: str
    trainable: list[nn.Parameter]
    _bound: torch.Tensor | None
    _armed: bool
    _version: int
    _snapshots: bool = True
    _at: torch.Tensor | None = None
    _handed: list[torch.Tensor | None] | None

    def arm(self) -> None:
        """A gradient is pending: ``loss.backward()`` was run at the current ``x``. Its version
        counter is noted (an in-place write to ``x`` changes it), and while writes that keep
        its bits (a message header written beside a model that lives in message rows) have
        been seen to change it, a copy of the row too."""
        row = self._bound
        assert row is not None, "bind the oracle to its row of x first"
        self._version = row._version
        if self._snapshots:
            if self._at is None:
                self._at = torch.empty_like(row)
            self._at.copy_(row)
        self._armed = True

    @property
    def armed(self) -> bool:
        """A gradient is pending that no round has taken yet."""
        return self._armed

    def disarm(self) -> None:
        """The round is over: a gradient it did not take is not handed to the next one."""
        self._armed = False

    def grad(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The user's gradient in flat order into ``out`` (once per ``opt.step()``)."""
        if not self._armed:
            when = "outside opt.step()" if self._handed is None else "a second time in one round"
            raise WrapError(_refusal(self.algorithm, f"asks for a gradient {when}"))
        if self._moved(x):
            raise WrapError(_refusal(self.algorithm, "asks for the gradient at another point "
                                     "than the model loss.backward() saw"))
        self._armed = False
        self._handed = [p.grad for p in self.trainable]
        if self.trainable and all(g is None for g in self._handed):
            raise WrapError("opt.step() found no gradient in the model: call loss.backward() "
                            "before opt.step() (and opt.zero_grad() before the next backward)")
        if out is not None and self._in_place(out):
            return out  # the backward accumulated into out's views: nothing to copy
        return self._write(self._handed, x, out)  # type: ignore[attr-defined]

    def _moved(self, x: torch.Tensor) -> bool:
        """``x`` is not, bit for bit, the row the backward saw. An unchanged version counter
        of the row proves that it is (and the next rounds keep no copy); after a write the
        bits of the copy decide. A write in a round without a copy (an algorithm whose rounds
        differ) cannot be judged: copies are kept again from the next round on."""
        row = self._bound
        if row._version == self._version:
            self._snapshots = False
            return x.data_ptr() != row.data_ptr() and not _same_bits(x, row)
        if not self._snapshots:
            self._snapshots = True
            return False
        return not _same_bits(x, self._at)

    def _in_place(self, out: torch.Tensor) -> bool:
        """The gradients already sit in ``out`` (:class:`BackwardOptimizerOracle`'s views)."""
        return False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the module's gradients, as ``optimizer.zero_grad(set_to_none)``."""
        for p in self.params:  # type: ignore[attr-defined]  (the module's, fixed when wrapped)
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
                continue
            if p.grad.grad_fn is not None:  # as torch.optim's: a view cannot detach in place
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()


def _refusal(algorithm: str, what: str) -> str:
    return (f"{algorithm} {what}, so it cannot use the gradient your loss.backward() computed: "
            "train it with gossip.DecentralizedTrainer (which computes gradients where the "
            "algorithm asks), or wrap one of the algorithms docs/wrap.md lists")


class BackwardOracle(_Handed, ModelOracle):
    """A node of :func:`gossip.wrap` without a local optimizer: the algorithm takes the
    gradient ``loss.backward()`` left in ``module``'s ``.grad`` (plus ``l2·x``) directly."""

    def __init__(self, module: nn.Module, *, algorithm: str, buffers: bool = False,
                 l2: float = 0.0, quantize: str | None = None, rng_seed: int = 0):
        ModelOracle.__init__(self, module, iter(()), buffers=buffers, l2=l2, quantize=quantize,
                             rng_seed=rng_seed)
        self.algorithm = algorithm
        self._armed, self._version, self._handed = False, -1, None


class BackwardOptimizerOracle(_Handed, OptimizerOracle):
    """A node of :func:`gossip.wrap` whose local step is the user's ``torch.optim`` optimizer,
    stepped on the gradient ``loss.backward()`` left in ``module``'s ``.grad``.

    After a step the parameters' ``.grad`` are views into the flat gradient the round took
    (the same values the backward wrote). ``zero_grad()`` drops them (``set_to_none``, the
    default): the next backward's gradients are new tensors, copied into the round's flat
    gradient (one pass; zeroed views cost a zeroing pass and an adding backward). With
    ``zero_grad(set_to_none=False)`` they are zeroed in place, the backward accumulates into
    them, and nothing is copied (as DDP's ``gradient_as_bucket_view``)."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, *, algorithm: str,
                 buffers: bool = False, master: MasterWeights | None = None,
                 quantize: str | None = None, rng_seed: int = 0):
        OptimizerOracle.__init__(self, module, iter(()), optimizer, buffers=buffers, master=master,
                                 quantize=quantize, rng_seed=rng_seed)
        self.algorithm = algorithm
        self._armed, self._version, self._handed = False, -1, None
        self._views: list[torch.Tensor] | None = None  # .grad as views into the last round's g
        self._views_of: torch.Tensor | None = None

    def apply_step(self, x: torch.Tensor, g: torch.Tensor, t: int) -> None:
        """The optimizer's step on ``g``; afterwards the parameters' ``.grad`` hold again what
        ``loss.backward()`` wrote, as views into ``g`` where every tensor of the flat model is
        a trainable parameter (else the tensors the backward wrote)."""
        views = self._views_into(g)  # made once per memory of g, not per step
        if views is None:
            self._grad_src = None
            try:
                super().apply_step(x, g, t)
            finally:
                if self._handed is not None:
                    for p, handed in zip(self.trainable, self._handed, strict=True):
                        p.grad = handed
            return
        for p, view in zip(self.trainable, views, strict=True):
            if p.grad is not view:  # (already the view after zero_grad(set_to_none=False))
                p.grad = view
        self._grad_src = g  # the optimizer steps on them: nothing more to split; they stay
        super().apply_step(x, g, t)

    def _views_into(self, g: torch.Tensor) -> list[torch.Tensor] | None:
        """Views of ``g`` shaped as the parameters; None where they cannot serve as ``.grad``
        (frozen tensors or buffers in the flat model, float32 master weights)."""
        if self.master is not None or not all(self._has_grad) or g.dim() != 1:
            return None
        if not _same_memory(self._views_of, g):
            self._views = flat.split(g, self._tensors)
            self._views_of = g
        return self._views

    def _in_place(self, out: torch.Tensor) -> bool:
        """Write the gradients into ``out`` where they are not there already (``.grad`` being
        the views into ``out`` of the last step); False when ``out`` is not that memory."""
        views = self._views
        if views is None or not _same_memory(self._views_of, out):
            return False
        into, grads = [], []
        for g, view in zip(self._handed, views, strict=True):  # type: ignore[arg-type]
            if g is None:
                view.zero_()  # an unused parameter's gradient is 0
            elif g.data_ptr() != view.data_ptr():
                into.append(view)
                grads.append(g)
        if grads:
            torch._foreach_copy_(into, grads)  # one call for every parameter's copy
        return True



def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN included)."""
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _same_memory(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are the same tensor memory (views made anew each round included)."""
    return (a is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.dtype == b.dtype and a.device == b.device)


def _to(v: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    if not isinstance(v, torch.Tensor):
        v = torch.as_tensor(v)
    if dtype is not None and v.is_floating_point():
        return v.to(device=device, dtype=dtype)
    return v.to(device)
