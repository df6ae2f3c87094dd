"""8-bit compute (``quantize="int8"`` / ``"int8-sr"``, Aketi, Kodge & Roy 2022): the min-max
quantizer against a float64 reference, the quantized layers' forward and backward against a
reference chain, the trainer against gossip.wrap, MPI against in process, resume against an
uninterrupted run, and the refusals (docs/low-precision.md)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import topologies
from gossip.errors import CheckpointError, ConfigError, WrapError
from gossip.training import MLP, DecentralizedTrainer, ModelOracle, digits
from gossip.training.precision import QUANT_BITS, QuantizedCompute, quantize_minmax
from gossip.wrap import wrap
from tests.helpers import wrap_runs
from tests.helpers.launch import mpiexec, run_mpi, script
from tests.helpers.train_runs import comparable, interrupted_and_resumed, records

LAUNCHES_MARKED_PER_TEST = True  # only the mpiexec test launches (tests/conftest.py)

LEVELS = 2**QUANT_BITS


def reference_codes(t: np.ndarray, u: np.ndarray | None = None) -> tuple[np.ndarray, float, float]:
    """float64 min-max codes of ``t`` (nearest, or ``floor(v + u)`` with the given uniforms)."""
    lo, hi = float(t.min()), float(t.max())
    step = (hi - lo) / (LEVELS - 1)
    v = (t - lo) / step
    k = np.rint(v) if u is None else np.floor(v + u)
    return np.clip(k, 0, LEVELS - 1), lo, step


def reference_q(t: torch.Tensor) -> torch.Tensor:
    """The nearest-level quantization of ``t`` in float64 numpy."""
    k, lo, step = reference_codes(t.detach().double().numpy())
    return torch.from_numpy(k * step + lo).to(t.dtype)


def test_nearest_rounding_is_the_float64_reference():
    t = torch.randn(5000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3 + 1
    q = quantize_minmax(t)
    k, lo, step = reference_codes(t.numpy())
    assert torch.equal(q, torch.from_numpy(k * step + lo))
    assert len(torch.unique(q)) <= LEVELS and q.min() == t.min() and q.max() == t.max()
    assert float((q - t).abs().max()) <= step / 2 * (1 + 1e-9)
    # float32: within half a step of the value, on the float64 grid up to float32 rounding
    t32 = t.float()
    q32 = quantize_minmax(t32).double()
    k32, lo32, step32 = reference_codes(t32.double().numpy())
    assert float((q32 - t32.double()).abs().max()) <= step32 / 2 + 1e-5
    near_tie = np.abs((t32.double().numpy() - lo32) / step32 % 1 - 0.5) < 1e-3
    grid = torch.from_numpy(k32 * step32 + lo32)
    assert torch.allclose(q32[~near_tie], grid[~near_tie], atol=1e-5, rtol=0)


def test_stochastic_rounding_is_unbiased_and_reproducible():
    gen = torch.Generator().manual_seed(3)
    t = torch.randn(64, dtype=torch.float64, generator=gen)
    k, lo, step = reference_codes(t.numpy())
    draws = 20000
    g = torch.Generator().manual_seed(7)
    qs = torch.stack([quantize_minmax(t, g) for _ in range(draws)])
    levels = (qs - lo) / step
    below = torch.floor((t - lo) / step)
    assert torch.all((levels - below).abs().round().le(1))  # one of the two neighbouring levels
    # E[q] = t: the error of the mean is below 5 standard errors (Var <= step²/4)
    assert float((qs.mean(0) - t).abs().max()) < 5 * step / 2 / draws**0.5
    assert float((qs.mean(0) - t).abs().max()) > 0  # random, not nearest
    # the same generator seed gives the same draws; the float64 reference with them agrees
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    u = torch.rand(t.shape, generator=torch.Generator().manual_seed(9), dtype=t.dtype).numpy()
    a, b = quantize_minmax(t, g1), quantize_minmax(t, g2)
    ku, _, _ = reference_codes(t.numpy(), u)
    assert torch.equal(a, b) and torch.equal(a, torch.from_numpy(ku * step + lo))


def test_a_constant_tensor_is_kept():
    t = torch.full((7,), -0.25)
    assert torch.equal(quantize_minmax(t), t)
    assert torch.equal(quantize_minmax(t, torch.Generator().manual_seed(0)), t)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_forward_and_backward_are_the_reference_chain():
    """Conv2d then Linear, int8 (nearest), float64: the output and every gradient equal a chain
    written from the rule: y = layer(q(a); q(W), q(b)), the backward gets q(∂L/∂y)."""
    torch.manual_seed(0)
    net = ConvNet().double()
    x = torch.randn(5, 1, 6, 6, dtype=torch.float64)
    c = torch.randn(5, 3, dtype=torch.float64)
    QuantizedCompute("int8", seed=0).install(net)
    net.train()
    out = net(x)
    (out * c).sum().backward()
    # the reference
    conv, fc = net.conv, net.fc
    a1 = reference_q(x)
    w1 = reference_q(conv.weight).requires_grad_()
    b1 = reference_q(conv.bias).requires_grad_()
    a1.requires_grad_()
    y1 = nn.functional.conv2d(a1, w1, b1)
    h = torch.relu(y1).flatten(1)
    a2 = reference_q(h.detach())
    w2, b2 = reference_q(fc.weight), reference_q(fc.bias)
    y2 = a2 @ w2.T + b2
    assert torch.allclose(out, y2, rtol=0, atol=1e-12)
    g2 = reference_q(c)  # ∂L/∂y2 = c, rounded
    assert torch.allclose(fc.weight.grad, g2.T @ a2, rtol=0, atol=1e-12)
    assert torch.allclose(fc.bias.grad, g2.sum(0), rtol=0, atol=1e-12)
    gh = (g2 @ w2).view_as(y1) * (y1.detach() > 0)  # straight through q(h), then the ReLU
    g1 = reference_q(gh)
    gw1, gb1 = torch.autograd.grad(y1, (w1, b1), grad_outputs=g1)
    assert torch.allclose(conv.weight.grad, gw1, rtol=0, atol=1e-12)
    assert torch.allclose(conv.bias.grad, gb1, rtol=0, atol=1e-12)
    # it is not the float model's gradient
    plain = ConvNet().double()
    plain.load_state_dict(net.state_dict())
    (plain(x) * c).sum().backward()
    assert not torch.allclose(plain.fc.weight.grad, fc.weight.grad, rtol=0, atol=1e-6)


def test_eval_mode_and_uninstall_run_in_full_precision():
    torch.manual_seed(0)
    net, plain = ConvNet(), ConvNet()
    plain.load_state_dict(net.state_dict())
    x = torch.randn(4, 1, 6, 6)
    assert QuantizedCompute("int8-sr", seed=1).install(net) == 2
    assert not torch.equal(net(x), plain(x))
    net.eval()
    plain.eval()
    assert torch.equal(net(x), plain(x))
    net.train()
    QuantizedCompute.uninstall(net)
    plain.train()
    assert torch.equal(net(x), plain(x))


def test_stochastic_rounding_draws_from_the_node_generator():
    """Same seed: the same gradient; another seed: another; nearest: no draws at all."""
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))

    def grad(mode: str, seed: int) -> torch.Tensor:
        torch.manual_seed(0)
        net = MLP(64, 10, (16,))
        QuantizedCompute(mode, seed).install(net)
        nn.functional.cross_entropy(net(x), y).backward()
        return next(net.parameters()).grad.clone()

    assert torch.equal(grad("int8-sr", 1), grad("int8-sr", 1))
    assert not torch.equal(grad("int8-sr", 1), grad("int8-sr", 2))
    assert torch.equal(grad("int8", 1), grad("int8", 2))


def test_trainer_and_wrap_give_the_same_numbers():
    """CHOCO-SGD with top-k on 4 nodes, int8-sr: gossip.wrap in a user's loop is the trainer,
    bit for bit (the same generator per node), and not the float32 run."""
    want, x_want = wrap_runs.trainer_losses("choco", 4, 6, quantize="int8-sr")
    _, opt = wrap_runs.wrapped("choco", 4, quantize="int8-sr")
    assert all(o.quantized is not None and o.quantized.mode == "int8-sr" for o in opt._oracles)
    got, x_got = wrap_runs.wrap_losses("choco", 4, 6, opt=opt)
    assert got == want and torch.equal(x_got, x_want)
    plain, x_plain = wrap_runs.trainer_losses("choco", 4, 6)
    assert plain != want and not torch.equal(x_plain, x_want)


def test_wrap_checkpoint_continues_the_rounding_stream():
    """Save after 3 rounds, load into a fresh wrapper, run 4 more: the uninterrupted 7 (the
    rounding generators are in the checkpoint)."""
    want, x_want = wrap_runs.wrap_losses("choco", 4, 7, opt=wrap_runs.wrapped("choco", 4, quantize="int8-sr")[1])
    _, first = wrap_runs.wrapped("choco", 4, quantize="int8-sr")
    train, _ = digits()
    streams = [wrap_runs.endless(DataLoader(train, batch_size=wrap_runs.BATCH,
                                            sampler=first.sampler(train, node=i)))
               for i in first.local_nodes]
    got, _ = wrap_runs.wrap_losses("choco", 4, 3, opt=first, streams=streams)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    _, second = wrap_runs.wrapped("choco", 4, quantize="int8-sr")
    second.load_state_dict(torch.load(buf, weights_only=True))
    more, x_got = wrap_runs.wrap_losses("choco", 4, 4, opt=second, streams=streams)
    assert got + more == want and torch.equal(x_got, x_want)


def test_train_script_resumes_bit_for_bit(tmp_path, monkeypatch):
    args = ["--algorithm", "choco", "--gamma", "0.5", "--compressor", "lead:7", "--quantize",
            "int8-sr", "--nodes", "4", "--hidden", "16", "--rounds", "12", "--log-every", "3"]
    full, resumed = interrupted_and_resumed(tmp_path, monkeypatch, args)
    assert full == resumed and len(full) >= 4


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_train_script_under_mpi_equals_in_process(tmp_path):
    args = ["experiments/train.py", "--algorithm", "deepsqueeze", "--gamma", "0.5", "--compressor",
            "lead:7", "--quantize", "int8-sr", "--hidden", "16", "--rounds", "8", "--log-every", "4"]
    res = run_mpi(4, [*args, "--out", str(tmp_path / "m.jsonl")])
    assert res.returncode == 0, res.stdout + res.stderr
    script("train").main([*args[1:], "--nodes", "4", "--out", str(tmp_path / "l.jsonl")])
    a, b = comparable(records(tmp_path / "l.jsonl")), comparable(records(tmp_path / "m.jsonl"))
    assert len(a) == 3 and a == b and records(tmp_path / "m.jsonl")[0]["world_size"] == 4


def test_refusals():
    train, _ = digits()
    ring = topologies.build("ring", 2)

    def mlp() -> nn.Module:
        return MLP(64, 10, (8,))

    with pytest.raises(ConfigError, match="quantize='int4': use one of none, int8, int8-sr"):
        DecentralizedTrainer(mlp(), train, topology=ring, quantize="int4")
    with pytest.raises(ConfigError, match="choose one"):
        DecentralizedTrainer(mlp(), train, topology=ring, quantize="int8", autocast="bf16")
    with pytest.raises(ConfigError, match="but the model is torch.bfloat16"):
        DecentralizedTrainer(mlp().bfloat16(), train, topology=ring, dtype=torch.bfloat16,
                             quantize="int8")
    with pytest.raises(ConfigError, match="has none"):
        ModelOracle(nn.Sequential(nn.Flatten(), nn.Bilinear(2, 2, 2)), iter(()), quantize="int8")
    net = mlp()
    with pytest.raises(WrapError, match="quantize='int8-x'"):
        wrap(net, torch.optim.SGD(net.parameters(), lr=0.1), quantize="int8-x", nodes=2)
    with pytest.raises(SystemExit) as info:
        script("train").main(["--quantize", "int8", "--autocast", "bf16", "--rounds", "1",
                              "--nodes", "2"])
    msg = str(info.value.code)
    assert msg.startswith("error: quantize='int8' and autocast='bf16'") and "\n" not in msg


def test_a_checkpoint_of_another_precision_is_refused():
    torch.manual_seed(0)
    plain = ModelOracle(MLP(64, 10, (8,)), iter(()))
    quant = ModelOracle(MLP(64, 10, (8,)), iter(()), quantize="int8-sr")
    with pytest.raises(CheckpointError, match="without quantize"):
        quant.load_state_dict(plain.state_dict())
    nearest = ModelOracle(MLP(64, 10, (8,)), iter(()), quantize="int8")
    with pytest.raises(CheckpointError, match="quantize='int8-sr'"):
        nearest.load_state_dict(quant.state_dict())


def test_benchmark_int8_table_is_the_one_in_the_docs():
    from tests.helpers.launch import ROOT

    bench = script("bench_low_precision", "benchmarks")
    row = {"test_accuracy": 0.9, "test_loss": 0.1, "bits_per_node": 8.0, "seconds_per_epoch": 0.1}
    header = bench.int8_table({("choco", *s): [row] for s in bench.INT8_SETTINGS}).splitlines()[0]
    doc = (ROOT / "docs" / "low-precision.md").read_text()
    doc = doc[doc.index("## 8-bit compute"):]  # the section (the 16-bit tables have similar rows)
    assert doc.count(header) == 2
    for quantize, comp in bench.INT8_SETTINGS:
        compute = "float32" if quantize == "none" else quantize
        for alg in ("choco", "deepsqueeze"):
            assert doc.count(f"| {alg} | {compute} | {comp} | ") == 2  # iid and skewed
    assert "| memory of a node's step | float32 | int8 | int8-sr |" in doc
    assert "| saved for the backward (batch 32) | " + " | ".join(
        f"{bench.saved_bytes(q)[0]} B" for q in ("none", "int8", "int8-sr")) + " |" in doc
