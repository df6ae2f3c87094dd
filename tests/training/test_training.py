"""Decentralized training: flat buffers, oracles, data, models, schedules, the trainer, γ search."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import topologies
from gossip.algorithms import make_algorithm
from gossip.errors import ConfigError, DivergenceError, TuningError
from gossip.rng import data_seed, generator
from gossip.training import (
    MLP,
    BatchStream,
    DecentralizedTrainer,
    ModelOracle,
    OptimizerOracle,
    SmallCNN,
    digits,
    flat,
    load_dataset,
    load_tensor_file,
    lr_multiplier,
    make_model,
    make_optimizer,
    node_loader,
    partition_dataset,
    partition_indices,
    resnet20,
)
from gossip.tuning import GammaSearch, search_gamma


@pytest.fixture(scope="module")
def data():
    return digits()


def mlp(seed: int = 0, hidden=(32,)) -> nn.Module:
    torch.manual_seed(seed)
    return MLP(64, 10, hidden)


# -- flat buffers ----------------------------------------------------------------------------------


def test_bind_makes_parameters_views_of_one_buffer():
    torch.manual_seed(0)
    model = SmallCNN(1, 10, (8, 8), width=4, norm="batch")
    x = flat.flatten(model).clone()
    assert x.numel() == sum(p.numel() for p in model.parameters())
    assert flat.layout_of(model).numel == x.numel()
    flat.bind(model, x)
    for p, v in zip(model.parameters(), flat.split(x, flat.parameters(model)), strict=True):
        assert p.data_ptr() == v.data_ptr()
    before = x.clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.randn(3, 1, 8, 8)).sum().backward()
    opt.step()
    assert not torch.equal(x, before)  # the optimizer wrote straight into the flat buffer
    with_buffers = flat.flatten(model, buffers=True)
    n_buf = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    assert with_buffers.numel() == x.numel() + n_buf
    with pytest.raises(TypeError, match="module holds"):
        flat.bind(model, x.double())


# -- oracle ----------------------------------------------------------------------------------------


def test_oracle_gradient_and_step_match_plain_torch(data):
    train, _ = data
    model = mlp()
    ref = copy.deepcopy(model)
    loader = node_loader(train, np.arange(100), 16, generator(3))
    batch = next(iter(node_loader(train, np.arange(100), 16, generator(3))))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=1e-3)
    oracle = OptimizerOracle(model, BatchStream(loader), opt)
    x = flat.flatten(model).clone()
    g = torch.empty_like(x)
    oracle.grad(x, g)
    oracle.apply_step(x, g, 1)

    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                              weight_decay=1e-3)
    nn.functional.cross_entropy(ref(batch[0]), batch[1]).backward()
    assert torch.allclose(g, torch.cat([p.grad.reshape(-1) for p in ref.parameters()]))
    ref_opt.step()
    assert torch.allclose(x, flat.flatten(ref), atol=1e-7)
    assert oracle.pop_loss()[1] == 16 and oracle.pop_loss() == (0.0, 0)


def test_model_oracle_adds_l2_and_has_no_step(data):
    train, _ = data
    model = mlp()
    x = flat.flatten(model).clone()
    plain = ModelOracle(copy.deepcopy(model), BatchStream(node_loader(train, np.arange(50), 8,
                                                                      generator(1))))
    decay = ModelOracle(copy.deepcopy(model), BatchStream(node_loader(train, np.arange(50), 8,
                                                                      generator(1))), l2=0.5)
    assert not hasattr(plain, "apply_step")
    g0, g1 = plain.grad(x.clone()), decay.grad(x.clone())
    assert torch.allclose(g1 - g0, 0.5 * x, atol=1e-6)


def test_model_oracle_loss_is_the_next_batch_mean_loss_at_x(data):
    """``loss(x)``: cross-entropy of the model at ``x`` on the stream's next mini-batch, forward
    only (computed here directly on a copy of the model with ``x``'s values and the same batch);
    ``x`` and the parameters' gradients are untouched, and the batch is consumed as a gradient's
    would be (the next ``grad`` sees the batch after it)."""
    train, _ = data
    model = mlp()
    x = flat.flatten(model).clone() + 0.01 * torch.randn(flat.flatten(model).numel(),
                                                         generator=torch.Generator().manual_seed(3))

    def stream():
        return BatchStream(node_loader(train, np.arange(60), 8, generator(2)))

    oracle = ModelOracle(copy.deepcopy(model), stream())
    keep = x.clone()
    value = oracle.loss(x)
    batches = stream()
    first, second = next(batches), next(batches)
    direct = copy.deepcopy(model)
    with torch.no_grad():
        for p, v in zip(direct.parameters(), flat.split(x, flat.parameters(direct)), strict=True):
            p.copy_(v.view_as(p))
        expect = float(nn.functional.cross_entropy(direct(first[0]), first[1]))
    assert value == pytest.approx(expect, rel=1e-6)
    assert torch.equal(x, keep)
    assert all(p.grad is None for p in oracle.module.parameters())
    # the loss drew the first batch: the next gradient is the second batch's
    g = oracle.grad(x.clone())
    ref = copy.deepcopy(direct)
    nn.functional.cross_entropy(ref(second[0]), second[1]).backward()
    assert torch.allclose(g, torch.cat([p.grad.reshape(-1) for p in ref.parameters()]), atol=1e-6)
    # at another point, another value: it reads x, not a cached model
    assert oracle.loss(x + 0.5) != pytest.approx(value, rel=1e-3)


# -- data ------------------------------------------------------------------------------------------


class Plain(Dataset):
    """A map-style data set without tensors or targets (the general path)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((2,), float(i)), i % 3


@pytest.mark.parametrize("scheme", ["iid", "sorted", "dirichlet:0.5"])
def test_partition_covers_everything_once_and_is_seeded(data, scheme):
    train, _ = data
    parts = partition_indices(train, 8, scheme, seed=4)
    allidx = np.concatenate(parts)
    assert np.array_equal(np.sort(allidx), np.arange(len(train)))
    again = partition_indices(train, 8, scheme, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    subsets = partition_dataset(train, 8, scheme, seed=4)
    assert [len(s) for s in subsets] == [p.size for p in parts]
    if scheme == "sorted":
        labels = train.tensors[1].numpy()
        assert max(len(np.unique(labels[p])) for p in parts) <= 3


def test_loaders_are_seeded_per_node_and_general_datasets_work():
    ds = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20) % 4)
    a = [b[1].tolist() for b, _ in zip(BatchStream(node_loader(ds, range(20), 6, generator(1))),
                                       range(7), strict=False)]
    b = [b[1].tolist() for b, _ in zip(BatchStream(node_loader(ds, range(20), 6, generator(1))),
                                       range(7), strict=False)]
    c = [b[1].tolist() for b, _ in zip(BatchStream(node_loader(ds, range(20), 6, generator(2))),
                                       range(7), strict=False)]
    assert a == b and a != c
    stream = BatchStream(node_loader(Plain(10), [1, 3, 5, 7], 3, generator(0)))
    seen = [next(stream) for _ in range(4)]
    assert stream.passes == 1  # 4 samples in batches of 3: a pass is 2 batches
    assert sorted(int(v) for v in torch.cat([s[0][:, 0] for s in seen[:2]])) == [1, 3, 5, 7]
    parts = partition_indices(Plain(30), 3, "sorted", seed=0)
    assert [sorted({i % 3 for i in p}) for p in parts] == [[0], [1], [2]]


def test_datasets_from_files_and_errors(tmp_path):
    x = np.random.default_rng(0).standard_normal((50, 3)).astype(np.float32)
    y = np.arange(50) % 5
    np.savez(tmp_path / "d.npz", x=x, y=y)
    tr, te = load_tensor_file(tmp_path / "d.npz", test_fraction=0.2)
    assert len(tr) == 40 and len(te) == 10 and tr.tensors[1].dtype == torch.int64
    torch.save({"x_train": torch.zeros(4, 2), "y_train": torch.tensor([0, 1, 0, 1]),
                "x_test": torch.ones(2, 2), "y_test": torch.tensor([1, 0])}, tmp_path / "d.pt")
    tr, te = load_dataset(str(tmp_path / "d.pt"))
    assert len(tr) == 4 and len(te) == 2
    np.savez(tmp_path / "bad.npz", a=x)
    with pytest.raises(ConfigError, match="expected 'x' and 'y'"):
        load_tensor_file(tmp_path / "bad.npz")
    with pytest.raises(ConfigError, match="nothing is downloaded"):
        load_dataset("cifar10")
    torch.save({"x": torch.zeros(4, 2), "y": print}, tmp_path / "obj.pt")  # a pickled function
    with pytest.raises(ConfigError, match=r"obj\.pt: it holds Python objects") as exc:
        load_tensor_file(tmp_path / "obj.pt")
    assert "weights_only" not in str(exc.value) and "trust" not in str(exc.value)
    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs torchvision"):
            load_dataset(str(tmp_path / "imgs"))


def test_digits_and_models_shapes(data):
    train, test = data
    assert len(train) + len(test) == 1797 and train.tensors[0].shape[1:] == (64,)
    assert float(train.tensors[0].max()) <= 1.0
    img_train, _ = digits(image=True)
    assert img_train.tensors[0].shape[1:] == (1, 8, 8)
    assert make_model("mlp", (64,), 10)(torch.zeros(2, 64)).shape == (2, 10)
    assert make_model("cnn", (64,), 10)(torch.zeros(2, 64)).shape == (2, 10)  # flat -> 1x8x8
    net = resnet20()
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert 0.26e6 < sum(p.numel() for p in net.parameters()) < 0.28e6
    group = make_model("resnet20", (3, 32, 32), 10, norm="group")
    assert group(torch.zeros(1, 3, 32, 32)).shape == (1, 10)


# -- optimizers and schedules ----------------------------------------------------------------------


def test_schedules_and_optimizers():
    f = lr_multiplier(rounds_per_epoch=10, total_rounds=100, schedule="step", warmup_epochs=1,
                      warmup_start=0.1, milestones=[5, 8], decay=0.1)
    assert f(0) == pytest.approx(0.1) and f(5) == pytest.approx(0.55) and f(10) == 1.0
    assert f(50) == pytest.approx(0.1) and f(85) == pytest.approx(0.01)
    c = lr_multiplier(rounds_per_epoch=10, total_rounds=101, schedule="cosine", min_factor=0.1)
    assert c(0) == 1.0 and c(50) == pytest.approx(0.55) and c(100) == pytest.approx(0.1)
    model = MLP(4, 2, (3,))
    opt = make_optimizer("nesterov", model.parameters(), 0.1, weight_decay=1e-4, decay_1d=False)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert opt.param_groups[0]["nesterov"]
    assert isinstance(make_optimizer("adamw", model.parameters(), 1e-3), torch.optim.AdamW)


# -- the trainer -----------------------------------------------------------------------------------


def test_first_dpsgd_round_is_each_nodes_own_optimizer_step(data):
    train, test = data
    model = mlp(1)
    trainer = DecentralizedTrainer(
        model, train, test_set=test, topology=topologies.build("ring", 4), algorithm="dpsgd",
        optimizer=lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9), partition="iid",
        batch_size=8, seed=3)
    # all nodes start equal, so round 1's gossip changes nothing: x_i = step on node i's batch
    expected = {}
    for i in range(4):
        ref = copy.deepcopy(model)
        stream = BatchStream(node_loader(train, trainer.partition[i], 8,
                                         generator(data_seed(3, i))))
        xb, yb = next(stream)
        nn.functional.cross_entropy(ref(xb), yb).backward()
        torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9).step()
        expected[i] = flat.flatten(ref)
    recs = trainer.fit(rounds=1)
    for i in range(4):
        assert torch.allclose(trainer.engine.nodes[i].x, expected[i], atol=1e-6)
    assert recs[0]["round"] == 0 and recs[0]["train_loss"] is None
    last = recs[-1]
    for key in ("epoch", "train_loss", "test_loss", "test_accuracy", "worst_node_accuracy",
                "consensus_error", "bits_per_node", "bits_per_node_max", "time_s", "lr"):
        assert key in last, key
    assert trainer.node_model(0) is trainer.engine.nodes[0].oracle.module
    avg = trainer.average_model()
    x_bar = trainer.engine.mean_model()
    assert torch.equal(flat.flatten(avg), x_bar)


def test_gradient_algorithms_take_no_optimizer(data):
    train, test = data
    with pytest.raises(ConfigError, match="takes the gradient directly"):
        DecentralizedTrainer(mlp(), train, topology=topologies.build("ring", 4),
                             algorithm=make_algorithm("lead", eta=0.1), compressor="lead:2",
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    with pytest.raises(ConfigError, match="cannot train"):
        DecentralizedTrainer(mlp(), train, topology=topologies.build("ring", 4), algorithm="gossip")
    trainer = DecentralizedTrainer(
        mlp(), train, test_set=test, topology=topologies.build("ring", 4),
        algorithm=make_algorithm("lead", eta=0.5), compressor="lead:4", l2=1e-4, batch_size=32,
        partition="dirichlet:0.5")
    recs = trainer.fit(epochs=3)
    assert recs[-1]["test_accuracy"] > 0.7
    assert "lr" not in recs[-1]


def test_batchnorm_buffers_local_by_default_or_gossiped(data):
    train, test = digits(image=True)
    torch.manual_seed(0)
    model = SmallCNN(1, 10, (8, 8), width=4, norm="batch")
    n_params = sum(p.numel() for p in model.parameters())
    kw = dict(topology=topologies.build("ring", 4), algorithm="dpsgd", batch_size=16,
              optimizer=lambda p: torch.optim.SGD(p, lr=0.05), test_set=test,
              node_eval_samples=50)
    local = DecentralizedTrainer(model, train, **kw)
    shared = DecentralizedTrainer(model, train, gossip_buffers=True, **kw)
    assert local.layout.numel == n_params
    assert shared.layout.numel == n_params + 2 * (4 + 8)  # running mean and var of 2 BN layers
    rl, rs = local.fit(rounds=6)[-1], shared.fit(rounds=6)[-1]
    assert 0 <= rl["test_accuracy"] <= 1 and 0 <= rs["test_accuracy"] <= 1
    bn = shared.node_model(0).features[1]
    assert bn.running_mean.data_ptr() != local.node_model(0).features[1].running_mean.data_ptr()
    x0 = shared.engine.nodes[0].x
    stats = x0[n_params:]
    assert bn.running_mean.untyped_storage().data_ptr() == x0.untyped_storage().data_ptr()
    assert not torch.equal(stats[:4], torch.zeros(4))  # statistics moved and live in x


@pytest.mark.slow
def test_compressed_training_close_to_exact_with_fewer_bits(data):
    """A reduced done-when check: 8-ring, Dirichlet 0.5, CHOCO top-1 % vs exact D-PSGD."""
    train, test = data
    results = {}
    for name, alg, comp in (("exact", make_algorithm("dpsgd"), "none"),
                            ("choco", make_algorithm("choco", gamma=0.05), "topk:0.01")):
        trainer = DecentralizedTrainer(
            mlp(0, (64,)), train, test_set=test, topology=topologies.build("ring", 8),
            algorithm=alg, compressor=comp, partition="dirichlet:0.5", batch_size=32, seed=0,
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
        results[name] = trainer.fit(epochs=25, eval_every=25)[-1]
    exact, choco = results["exact"], results["choco"]
    assert exact["test_accuracy"] > 0.9
    assert choco["test_accuracy"] > exact["test_accuracy"] - 0.04
    assert exact["bits_per_node"] > 20 * choco["bits_per_node"]


def test_divergence_stops_the_run(data):
    train, _ = data
    trainer = DecentralizedTrainer(mlp(), train, topology=topologies.build("ring", 4),
                                   algorithm="dpsgd",
                                   optimizer=lambda p: torch.optim.SGD(p, lr=1e4))
    with pytest.raises(DivergenceError, match="diverged"):
        trainer.fit(rounds=30, log_every=2)


# -- γ search --------------------------------------------------------------------------------------


def test_gamma_search_picks_lowest_non_diverged():
    def trial(g):
        if g > 0.3:
            raise DivergenceError("boom", round=7)
        return (g - 0.1) ** 2 if g != 0.02 else math.nan

    search = search_gamma(trial, rounds=10)
    assert isinstance(search, GammaSearch) and search.pick == 0.1
    rec = search.record()
    assert rec["status"][:2] == ["diverged at round 7", "diverged at round 7"]
    assert rec["status"][5] == "non-finite" and rec["pick"] == 0.1
    assert "picked gamma = 0.1" in search.describe()
    with pytest.raises(TuningError, match="every gamma"):
        search_gamma(lambda g: math.inf, [0.1, 0.2])


def test_gamma_search_on_a_consensus_engine():
    from gossip.engine import Engine
    from gossip.rng import init_seed
    from gossip.tuning import final_score

    topo = topologies.build("ring", 8)

    def x0(i):
        return torch.randn(100, generator=generator(init_seed(0, i)), dtype=torch.float64)

    def trial(gamma):
        engine = Engine(make_algorithm("choco", gamma=gamma), topo, x0, compressor="topk:0.05")
        return final_score(engine, 100)

    search = search_gamma(trial, [1.0, 0.2, 0.01], rounds=100, score_name="consensus error")
    scores = dict(zip(search.record()["grid"], search.record()["scores"], strict=True))
    assert search.pick == 0.2 and scores[0.2] < scores[0.01] < scores[1.0]
