"""Mixed-precision training: autocast bf16/fp16 over float32 master weights, fp16's dynamic
loss scale, and the refusals of combinations where autocast cannot apply."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import topologies
from gossip.errors import ConfigError
from gossip.seeding import generator
from gossip.training import MLP, BatchStream, DecentralizedTrainer, ModelOracle, digits, flat, node_loader
from gossip.training.precision import GROWTH_INTERVAL, INITIAL_SCALE, LossScaler
from tests.helpers.launch import script


@pytest.fixture(scope="module")
def data():
    return digits()


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MLP(64, 10, (32,))


def oracle(train, model, autocast, loss_fn=None, batch=16) -> ModelOracle:
    stream = BatchStream(node_loader(train, np.arange(200), batch, generator(5)))
    return ModelOracle(model, stream, loss_fn, autocast=autocast)


@pytest.mark.parametrize("autocast, low", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_trains_in_low_precision_over_float32_master_weights(data, autocast, low):
    """A few CHOCO rounds with the bf16 message: the layers compute in the low type while
    training, x and the optimizer state stay float32, and the train loss decreases."""
    train, test = data
    seen: set[tuple[bool, torch.dtype]] = set()  # (training, output dtype) of the first layer
    model = mlp()
    trainer = DecentralizedTrainer(
        model, train, test_set=test, topology=topologies.build("ring", 4), algorithm="choco",
        compressor="bf16", optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        batch_size=16, seed=1, autocast=autocast)
    for nd in trainer.engine.nodes.values():
        nd.oracle.module[1].register_forward_hook(
            lambda m, i, o: seen.add((torch.is_grad_enabled(), o.dtype)))
    recs = trainer.fit(rounds=40, log_every=10)
    assert seen == {(True, low), (False, torch.float32)}  # evaluations run in float32
    losses = [r["train_loss"] for r in recs if r.get("train_loss") is not None]
    assert losses[-1] < 0.6 * losses[0], losses
    for nd in trainer.engine.nodes.values():
        assert nd.x.dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in nd.oracle.module.parameters())
        state = nd.oracle.optimizer.state
        assert state and all(s["momentum_buffer"].dtype == torch.float32 for s in state.values())
    assert recs[-1]["bits_per_node"] > 0
    assert recs[-1]["test_accuracy"] > 0.5


def test_autocast_gradient_is_close_to_float32(data):
    """The bf16 gradient is the float32 one up to bf16 rounding, on the same batch."""
    train, _ = data
    model = mlp()
    x = flat.flatten(model).clone()
    exact = oracle(train, copy.deepcopy(model), None).grad(x.clone())
    for autocast, tol in (("bf16", 3e-2), ("fp16", 4e-3)):
        g = oracle(train, copy.deepcopy(model), autocast).grad(x.clone())
        assert g.dtype == torch.float32 and bool(torch.isfinite(g).all())
        rel = float((g - exact).norm() / exact.norm())
        assert 0 < rel < tol, (autocast, rel)


def mse(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Regression onto targets far from the output: a gradient of ~20 per output entry."""
    return (y.float() - 40.0 - t.float()[:, None]).pow(2).mean() * 10


def test_fp16_overflow_halves_the_scale_and_recomputes_the_batch(data):
    """At the initial scale 2^16 the fp16 backward overflows: the oracle halves the scale,
    recomputes the same batch and returns a finite gradient close to float32's."""
    train, _ = data
    model = mlp()
    x = flat.flatten(model).clone()
    exact = oracle(train, copy.deepcopy(model), None, mse).grad(x.clone())
    o = oracle(train, copy.deepcopy(model), "fp16", mse)
    g = o.grad(x.clone())
    assert o.scaler.overflows >= 1 and o.scaler.scale < INITIAL_SCALE
    assert bool(torch.isfinite(g).all())
    assert float((g - exact).norm() / exact.norm()) < 4e-3
    assert o.samples == 16 and o.pop_loss()[1] == 16  # the recomputed batch is counted once


def test_fp16_loss_scale_keeps_tiny_gradients(data):
    """A gradient of ~1e-9 underflows fp16 (smallest subnormal 6e-8) unless scaled: the scaled
    one survives and matches float32."""
    train, _ = data
    model = mlp()

    def tiny(y, t):
        return nn.functional.cross_entropy(y, t) * 1e-7

    x = flat.flatten(model).clone()
    exact = oracle(train, copy.deepcopy(model), None, tiny).grad(x.clone())
    g = oracle(train, copy.deepcopy(model), "fp16", tiny).grad(x.clone())
    assert float(exact.abs().max()) < 6e-8  # every entry would flush to 0 in fp16
    assert float((g - exact).norm() / exact.norm()) < 4e-3


def test_loss_scaler_grows_after_an_interval_and_saves_its_state():
    s = LossScaler(scale=4.0, growth_interval=3)
    assert s.update(True) and s.update(True) and s.scale == 4.0
    assert s.update(True) and s.scale == 8.0 and s.good == 0
    assert not s.update(False) and s.scale == 4.0 and s.overflows == 1
    t = LossScaler()
    t.load_state_dict(s.state_dict())
    assert (t.scale, t.good, t.overflows) == (4.0, 0, 1)
    assert GROWTH_INTERVAL >= 100
    low = LossScaler(scale=2.0**-24)
    with pytest.raises(ConfigError, match="overflows fp16 even with the loss scaled.*use autocast='bf16'"):
        low.update(False)


def test_fp16_scale_survives_a_checkpoint(data):
    train, _ = data
    o = oracle(train, mlp(), "fp16", mse)
    o.grad(flat.flatten(o.module).clone())
    state = o.state_dict()
    fresh = oracle(train, mlp(), "fp16", mse)
    fresh.load_state_dict(state)
    assert fresh.scaler.scale == o.scaler.scale < INITIAL_SCALE
    assert oracle(train, mlp(), None).state_dict()["loss_scale"] is None


def test_autocast_refuses_what_it_cannot_apply(data):
    train, _ = data
    ring = topologies.build("ring", 4)
    with pytest.raises(ConfigError, match="float32 master weights, but the model is torch.float64"):
        DecentralizedTrainer(mlp(), train, topology=ring, dtype=torch.float64, autocast="fp16")
    with pytest.raises(ConfigError, match="autocast='fp8': use one of none, bf16, fp16"):
        DecentralizedTrainer(mlp(), train, topology=ring, autocast="fp8")
    with pytest.raises(ConfigError, match="float32 master weights"):
        ModelOracle(mlp().double(), iter(()), autocast="bf16")


def test_train_script_refuses_autocast_without_float32_in_one_line():
    train = script("train")
    with pytest.raises(SystemExit) as info:
        train.main(["--autocast", "fp16", "--dtype", "float64", "--rounds", "1", "--nodes", "2"])
    msg = str(info.value.code)
    assert msg.startswith("error: autocast='fp16' keeps float32 master weights") and "\n" not in msg
    assert "--dtype float32" in msg


def test_fp16_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    """A train.py run with --autocast fp16 and fp16 messages, stopped and resumed from its
    checkpoint, logs what the uninterrupted run logs (the scaler's state is checkpointable)."""
    from tests.helpers.train_runs import interrupted_and_resumed

    args = ["--algorithm", "choco", "--gamma", "0.5", "--compressor", "fp16", "--autocast", "fp16",
            "--nodes", "4", "--hidden", "16", "--rounds", "12", "--log-every", "3"]
    full, resumed = interrupted_and_resumed(tmp_path, monkeypatch, args)
    assert full == resumed and len(full) >= 4


def test_benchmark_table_is_the_one_in_the_docs():
    """docs/low-precision.md shows the table benchmarks/bench_low_precision.py prints (same
    columns, every setting), not a hand-made one."""
    import importlib.util

    from tests.helpers.launch import ROOT

    spec = importlib.util.spec_from_file_location("_bench_lp", ROOT / "benchmarks" / "bench_low_precision.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = {"test_accuracy": 0.9, "test_loss": 0.1, "bits_per_node": 8.0, "seconds_per_epoch": 0.1}
    header = bench.table({("dpsgd", *s): [row] for s in bench.SETTINGS}).splitlines()[0]
    doc = (ROOT / "docs" / "low-precision.md").read_text()
    assert header in doc
    for autocast, comp in bench.SETTINGS:
        for alg in ("dpsgd", "choco"):
            assert f"| {alg} | {autocast} | {comp} | " in doc
    assert "| part (cpu) | float32 / none | bf16 | fp16 |" in doc


def test_fp16_activation_overflow_names_the_cause(data):
    """Logits beyond fp16's range make the loss itself Inf/NaN: one clear error pointing to
    bf16, where float32 and bf16 compute a finite gradient of the same model."""
    from gossip.errors import DivergenceError

    train, _ = data
    model = mlp()
    with torch.no_grad():
        model[1].weight.fill_(1e4)  # pixels in [0, 1], 64 of them: hidden units ~2e5 > 65504
    x = flat.flatten(model).clone()
    for autocast in (None, "bf16"):
        assert bool(torch.isfinite(oracle(train, copy.deepcopy(model), autocast).grad(x.clone())).all())
    with pytest.raises(DivergenceError, match="autocast='fp16': the loss of this mini-batch is "
                                              "NaN/Inf.*use autocast='bf16'"):
        oracle(train, copy.deepcopy(model), "fp16").grad(x.clone())
