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
from gossip.rng import generator
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
    from tests.helpers.launch import ROOT

    bench = script("bench_low_precision", "benchmarks")
    row = {"test_accuracy": 0.9, "test_loss": 0.1, "bits_per_node": 8.0, "seconds_per_epoch": 0.1}
    header = bench.table({("dpsgd", *s): [row] for s in bench.SETTINGS}).splitlines()[0]
    doc = (ROOT / "docs" / "low-precision.md").read_text()
    assert header in doc
    for dtype, autocast, comp in bench.SETTINGS:
        for alg in ("dpsgd", "choco"):
            assert f"| {alg} | {dtype} | {autocast} | {comp} | " in doc
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


# -- half-precision models with float32 master weights -----------------------------------------


def half_node(dtype, master: bool, lr: float):
    """A bfloat16/float16 MLP's OptimizerOracle on a flat row, with or without master weights."""
    from gossip.training import OptimizerOracle
    from gossip.training.precision import MasterWeights

    model = mlp().to(dtype)
    x = flat.flatten(model).clone()
    weights = MasterWeights(flat.parameters(model)) if master else None
    opt = torch.optim.SGD(weights.params if master else flat.parameters(model), lr=lr)
    node = OptimizerOracle(model, iter(()), opt, master=weights)
    node.bind(x)
    return node, x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_master_weights_keep_steps_below_half_an_ulp(dtype):
    """Steps of lr·g = 5e-6 on weights above 0.05 round away in a half model; with float32
    master weights 100 of them move the master copy by 5e-4, as in float32, and the model is
    the master copy rounded."""
    for master in (False, True):
        node, x = half_node(dtype, master, lr=5e-6)
        start = x.clone()
        big = start.float().abs() > 0.05
        g = torch.ones_like(x)
        for t in range(100):
            node.apply_step(x, g, t)
        if not master:
            assert torch.equal(x[big], start[big])
            continue
        moved = start.float() - node.master.x
        assert torch.allclose(moved, torch.full_like(moved, 5e-4), rtol=2e-2)  # float32 roundings
        assert torch.equal(x, node.master.x.to(dtype)) and not torch.equal(x[big], start[big])


def test_master_weights_follow_what_the_gossip_adds():
    """A change of x between steps (the mixing) reaches the master copy exactly, in float32:
    master += x − written; the state survives a checkpoint."""
    node, x = half_node(torch.bfloat16, True, lr=0.1)
    g = torch.zeros_like(x)
    node.apply_step(x, torch.full_like(x, 0.5), 0)
    before, written = node.master.x.clone(), node.master.written.clone()
    x.add_(torch.linspace(-0.02, 0.03, x.numel(), dtype=x.dtype))  # the gossip's step
    mixed = x.clone()
    saved = copy.deepcopy(node.state_dict())
    node.apply_step(x, g, 1)
    assert torch.equal(node.master.x, before + (mixed.float() - written.float()))
    assert torch.equal(x, node.master.x.to(torch.bfloat16))
    other, y = half_node(torch.bfloat16, True, lr=0.1)
    other.load_state_dict(saved)
    y.copy_(mixed)
    other.apply_step(y, g, 1)
    assert torch.equal(y, x) and torch.equal(other.master.x, node.master.x)


def test_half_models_train_as_float32_on_digits(data):
    """CHOCO-SGD on 4 nodes, bfloat16 and float16 models (sent, mixed, stepped through
    float32 master weights): the averaged model's test accuracy within a point of float32's,
    with half the bytes of the dense messages."""
    train, test = data
    runs = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        trainer = DecentralizedTrainer(
            mlp(), train, topology=topologies.build("ring", 4), algorithm="choco",
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batch_size=32,
            test_set=test, dtype=dtype, seed=0)
        last = trainer.fit(epochs=3)[-1]
        assert trainer.engine.block.x.dtype == dtype
        runs[dtype] = (last["test_accuracy"], sum(trainer.engine.transport.bytes_sent.values()))
    acc32, bytes32 = runs[torch.float32]
    for dtype in (torch.bfloat16, torch.float16):
        acc, sent = runs[dtype]
        assert abs(acc - acc32) <= 0.01, (dtype, acc, acc32)
        assert sent / bytes32 == pytest.approx(0.5, abs=0.01)


def test_master_weights_need_a_half_model_and_an_optimizer(data):
    train, _ = data
    with pytest.raises(ConfigError, match="needs dtype bfloat16 or float16"):
        DecentralizedTrainer(mlp(), train, topology=topologies.build("ring", 2), algorithm="choco",
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1), master_weights=True)
    with pytest.raises(ConfigError, match="steps with its own eta"):
        DecentralizedTrainer(mlp().to(torch.bfloat16), train, topology=topologies.build("ring", 2),
                             algorithm="lead", dtype=torch.bfloat16, master_weights=True)


def test_half_model_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    """train.py --dtype bfloat16 with top-k messages, stopped and resumed: the master weights
    are in the checkpoint, so the resumed log is the uninterrupted one."""
    from tests.helpers.train_runs import interrupted_and_resumed

    args = ["--algorithm", "choco", "--gamma", "0.5", "--compressor", "topk:0.2", "--dtype",
            "bfloat16", "--nodes", "4", "--hidden", "16", "--rounds", "12", "--log-every", "3"]
    full, resumed = interrupted_and_resumed(tmp_path, monkeypatch, args)
    assert full == resumed and len(full) >= 4
