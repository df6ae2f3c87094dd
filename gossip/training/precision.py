"""Mixed precision for a training node: autocast forward/backward over float32 master weights.

With ``autocast="bf16"`` or ``"fp16"`` a node's forward and backward run under
``torch.autocast(device_type, dtype)`` (matrix products and convolutions in the low type,
reductions and the loss in float32), while its flat model ``x`` — the master weights the
optimizer steps and the compressor sends — and the optimizer's state stay float32. The
gradient autograd returns is float32 (the gradient of the casts). docs/low-precision.md.

fp16 has 5 exponent bits: small gradients underflow to 0 and large ones overflow, so fp16 runs
scale the loss by a **dynamic** factor (:class:`LossScaler`, torch's ``GradScaler`` rule):
start at 2¹⁶, halve it and recompute the gradient on the same mini-batch (with the same random
draws) whenever the scaled gradient has a NaN/Inf, double it after ``GROWTH_INTERVAL``
finite gradients in a row. The oracle therefore always returns a finite gradient of the
batch; a loss that is itself NaN/Inf (fp16 activations beyond ±65504, or a diverged run)
raises :class:`gossip.errors.DivergenceError`, since no scale helps.
bf16 has float32's exponent range and needs no scale.

With ``quantize="int8"`` (or ``"int8-sr"``, stochastic rounding) the node's linear and
convolution layers compute in 8 bits as in Aketi, Kodge & Roy's low-precision decentralized
training (:class:`QuantizedCompute`): their weights, input activations and the gradient of
their output are rounded to 256 uniform levels between the tensor's minimum and maximum, while
``x`` and the optimizer stay float32 (the weights' rounding is straight-through: the gradient
reaches the float32 weights unchanged).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from gossip.errors import CheckpointError, ConfigError

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The ``autocast`` names and the dtype their forward and backward run in."""

INITIAL_SCALE = 2.0**16
GROWTH_INTERVAL = 200
MIN_SCALE = 2.0**-24  # below this even a gradient of 1 underflows: the scale is not the problem


def autocast_dtype(autocast: str | None, dtype: torch.dtype, device: torch.device) -> torch.dtype | None:
    """The low dtype of ``autocast`` (None: off) for a model of ``dtype`` on ``device``.

    Raises :class:`ConfigError` naming the fix when autocast cannot apply: an unknown name, a
    model that is not float32 (the master weights are float32 by definition; a float64 or half
    model has nothing to gain), or a device without autocast.
    """
    if autocast is None or autocast == "none":
        return None
    if autocast not in AUTOCAST_DTYPES:
        raise ConfigError(f"autocast={autocast!r}: use one of none, {', '.join(AUTOCAST_DTYPES)}")
    if dtype != torch.float32:
        raise ConfigError(
            f"autocast={autocast!r} keeps float32 master weights, but the model is {dtype}: "
            "train in float32 (--dtype float32) or turn autocast off"
        )
    if not torch.amp.is_autocast_available(device.type):
        raise ConfigError(f"autocast={autocast!r}: torch has no autocast on device {device.type!r}; "
                          "use cpu or cuda, or turn autocast off")
    return AUTOCAST_DTYPES[autocast]


class LossScaler:
    """The dynamic loss scale of one fp16 node (see the module docstring).

    Attributes:
        scale: the current factor the loss is multiplied by before backward.
        good: finite gradients in a row since the last change of the scale.
        overflows: gradients recomputed because of a NaN/Inf (all since the start).
    """

    def __init__(self, scale: float = INITIAL_SCALE, growth_interval: int = GROWTH_INTERVAL):
        self.scale = float(scale)
        self.growth_interval = int(growth_interval)
        self.good = 0
        self.overflows = 0

    def update(self, finite: bool) -> bool:
        """Record one scaled gradient; True when it is finite (keep it), False when it must be
        recomputed at the halved scale. Raises :class:`ConfigError` once the scale falls below
        2⁻²⁴, where the overflow cannot come from the scale (a gradient beyond fp16's range)."""
        if finite:
            self.good += 1
            if self.good >= self.growth_interval:
                self.scale *= 2.0
                self.good = 0
            return True
        self.overflows += 1
        self.good = 0
        self.scale /= 2.0
        if self.scale < MIN_SCALE:
            raise ConfigError(
                "autocast='fp16': the gradient overflows fp16 even with the loss scaled by "
                f"{self.scale * 2:.3g}; the model's activations exceed fp16's range (65504): "
                "use autocast='bf16'"
            )
        return False

    def state_dict(self) -> dict[str, Any]:
        """The scale and its counters (a resumed run continues with the same scale)."""
        return {"scale": self.scale, "good": self.good, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.scale = float(state["scale"])
        self.good = int(state["good"])
        self.overflows = int(state["overflows"])


HALF_DTYPES = (torch.bfloat16, torch.float16)
"""Model dtypes stored in 16 bits, whose nodes step float32 :class:`MasterWeights`."""


def wants_master_weights(requested: bool | None, dtype: torch.dtype, has_optimizer: bool,
                         algorithm: str, error: type[ConfigError] = ConfigError) -> bool:
    """Whether a run keeps float32 :class:`MasterWeights`: asked for (``True``), on by default
    (``None``) for a half-precision model with a local optimizer, never with ``False``.
    ``True`` without a half model and an optimizer is refused with ``error``."""
    possible = dtype in HALF_DTYPES and has_optimizer
    if requested and not possible:
        raise error(
            "master_weights=True keeps float32 copies of half-precision parameters for a local "
            "optimizer: it needs dtype bfloat16 or float16 and an optimizer"
            + ("" if has_optimizer else f" ({algorithm} steps with its own eta; use dpsgd, choco, "
                                        "deepsqueeze or powergossip)")
            + f"; the model is {dtype}")
    return possible and requested is not False


class MasterWeights:
    """The float32 copy of a half-precision node's parameters that its optimizer steps.

    The node's ``x`` (what it sends and mixes) is bfloat16 or float16; an optimizer step of
    ``lr·g`` is often below half a unit of its last place and would round away. So the
    optimizer steps float32 parameters (:attr:`params`, views of :attr:`x`; its momentum and
    Adam moments are float32 too), and the node's row follows them, rounded::

        master += x − written          (what the gossip added since the last step, in float32)
        optimizer.step() on master     (the gradient upcast to float32)
        x = round(master);  written = x

    ``written`` is what the last step wrote into ``x``, so the mixing of the algorithm reaches
    the master weights exactly and nothing the optimizer did is lost to rounding.
    """

    def __init__(self, params: list[torch.nn.Parameter]):
        if not params:
            raise ConfigError("master weights need a model with parameters")
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.written = flat.clone()
        self.x = flat.to(torch.float32)
        self.g = torch.zeros_like(self.x)
        self._delta = torch.empty_like(self.x)
        self.params: list[torch.nn.Parameter] = []
        pos = 0
        for p in params:
            view = self.x[pos:pos + p.numel()].view(p.shape)
            master = torch.nn.Parameter(view, requires_grad=p.requires_grad)
            if p.requires_grad:
                master.grad = self.g[pos:pos + p.numel()].view(p.shape)
            self.params.append(master)
            pos += p.numel()
        self.numel = pos

    def step(self, row: torch.Tensor, grad: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """One optimizer step of the node whose parameters are ``row`` (its first entries of
        ``x``), with the gradient ``grad`` (the same entries of the flat gradient)."""
        self.x.add_(self._delta.copy_(row).sub_(self.written))
        self.g.copy_(grad)
        optimizer.step()
        row.copy_(self.x)
        self.written.copy_(row)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"x": self.x.clone(), "written": self.written.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.x.copy_(state["x"])
        self.written.copy_(state["written"])


# ---------------------------------------------------------------- 8-bit compute
QUANTIZE_MODES: dict[str, bool] = {"int8": False, "int8-sr": True}
"""The ``quantize`` names, and whether they round activations and gradients stochastically."""

QUANT_BITS = 8
"""Bits of a quantized value: 2⁸ = 256 levels."""

QUANTIZED_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""The layers whose products :class:`QuantizedCompute` runs on 8-bit values."""


def quantize_minmax(t: torch.Tensor, generator: torch.Generator | None = None,
                    bits: int = QUANT_BITS) -> torch.Tensor:
    """``t`` rounded to ``2**bits`` uniform levels between its minimum and maximum (a new tensor
    of ``t``'s dtype holding the decoded values).

    With ``lo, hi = min t, max t`` and the step ``Δ = (hi − lo)/(2^bits − 1)``, each entry becomes
    ``lo + Δ·k`` with the integer ``k = round((t − lo)/Δ)`` in [0, 2^bits − 1] (to the nearest
    level, ties to even), or with a ``generator`` ``k = ⌊(t − lo)/Δ + u⌋``, u uniform in [0, 1)
    (stochastic rounding: unbiased, E[q] = t). The minimum and maximum are levels, so they are
    kept exactly; a constant tensor is returned unchanged. No host synchronization.
    """
    t = t.detach()
    top = float(2**bits - 1)
    lo, hi = torch.aminmax(t)
    step = ((hi - lo) / top).clamp_min(torch.finfo(t.dtype).tiny)  # constant t: every k is 0
    k = (t - lo).div_(step)
    if generator is None:
        k.round_()
    else:
        k.add_(torch.rand(t.shape, generator=generator, dtype=t.dtype, device=t.device)).floor_()
    return k.clamp_(0.0, top).mul_(step).add_(lo)


class _RoundStraightThrough(torch.autograd.Function):
    """Forward: :func:`quantize_minmax`; backward: the gradient passes unchanged."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return quantize_minmax(t, generator)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _RoundGradient(torch.autograd.Function):
    """Forward: the identity; backward: the incoming gradient through :func:`quantize_minmax`."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        ctx.generator = generator
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return quantize_minmax(grad, ctx.generator), None


def quantize_mode(quantize: str | None, dtype: torch.dtype, autocast: str | None,
                  error: type[ConfigError] = ConfigError) -> str | None:
    """``quantize`` checked (None: off): a known name, not with ``autocast`` (one compute
    precision at a time), and a float32 or float64 model (the weights the 8-bit products are
    rounded from; a half model has nothing to gain). Raises ``error`` naming the fix."""
    if quantize is None or quantize == "none":
        return None
    if quantize not in QUANTIZE_MODES:
        raise error(f"quantize={quantize!r}: use one of none, {', '.join(QUANTIZE_MODES)}")
    if autocast is not None and autocast != "none":
        raise error(f"quantize={quantize!r} and autocast={autocast!r} both set the precision of the "
                    "forward and backward: choose one (--autocast none or --quantize none)")
    if dtype not in (torch.float32, torch.float64):
        raise error(f"quantize={quantize!r} rounds float32 weights to 8 bits, but the model is "
                    f"{dtype}: train in float32 (--dtype float32)")
    return quantize


class QuantizedCompute:
    """The 8-bit compute of one node (Aketi, Kodge & Roy 2022; docs/low-precision.md).

    :meth:`install` replaces the ``forward`` of every ``nn.Linear`` and ``nn.Conv1d/2d/3d`` of a
    module (on the instance; :meth:`uninstall` undoes it). In training mode such a layer computes
    ``y = layer(q(a); q(W), q(b))`` with :func:`quantize_minmax` over each whole tensor (the
    input activation ``a``, the weight, the bias), and its backward receives ``q(∂L/∂y)``: the
    products of the forward and of the backward (``∂L/∂a = q(∂L/∂y)·q(W)``, ``∂L/∂W =
    q(∂L/∂y)ᵀ·q(a)``) take 8-bit operands. The rounding of ``W``, ``b`` and ``a`` is
    straight-through (their gradient is the one of the rounded value). In eval mode the layer
    runs in full precision (evaluations are of the float32 model).

    Rounding: the weights and biases to the nearest level; the activations and gradients to the
    nearest level (``"int8"``) or stochastically (``"int8-sr"``), with draws from this node's
    own ``torch.Generator`` (seeded from the node's seed, saved in checkpoints), consumed in
    the order of the forward and backward: the same numbers in process and under MPI.
    Emulated: the 8-bit values are held in the model's dtype, so time and memory are those of a
    float32 model plus the rounded copies, not 4× less (docs/low-precision.md).
    """

    def __init__(self, mode: str, seed: int, device: torch.device | str = "cpu"):
        if mode not in QUANTIZE_MODES:
            raise ConfigError(f"quantize={mode!r}: use one of {', '.join(QUANTIZE_MODES)}")
        self.mode = mode
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed))
        self._draws = self.generator if QUANTIZE_MODES[mode] else None

    def install(self, module: nn.Module) -> int:
        """Make the quantized layers of ``module`` compute in 8 bits; returns how many.
        Raises :class:`ConfigError` when it has none."""
        layers = [m for m in module.modules() if isinstance(m, QUANTIZED_LAYERS)]
        if not layers:
            raise ConfigError(f"quantize={self.mode!r} computes nn.Linear and nn.Conv1d/2d/3d "
                              f"layers in 8 bits, but {type(module).__name__} has none: use "
                              "quantize='none'")
        for layer in layers:
            layer.forward = types.MethodType(self._forward, layer)  # type: ignore[method-assign]
        return len(layers)

    @staticmethod
    def uninstall(module: nn.Module) -> None:
        """Give the layers of ``module`` their own ``forward`` back."""
        for m in module.modules():
            if isinstance(m, QUANTIZED_LAYERS) and "forward" in m.__dict__:
                del m.forward

    def _forward(self, layer: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        if not layer.training:
            return type(layer).forward(layer, inputs)
        a = _RoundStraightThrough.apply(inputs, self._draws)
        w = _RoundStraightThrough.apply(layer.weight, None)
        b = None if layer.bias is None else _RoundStraightThrough.apply(layer.bias, None)
        if isinstance(layer, nn.Linear):
            y = nn.functional.linear(a, w, b)
        else:
            y = layer._conv_forward(a, w, b)  # type: ignore[operator]
        return _RoundGradient.apply(y, self._draws)

    def state_dict(self) -> dict[str, Any]:
        """The rounding generator's state (a resumed run draws what the straight one draws)."""
        return {"mode": self.mode, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state["mode"] != self.mode:
            raise CheckpointError(f"the checkpoint was trained with quantize={state['mode']!r}, this "
                              f"run has quantize={self.mode!r}: resume with the same setting")
        self.generator.set_state(state["generator"])
