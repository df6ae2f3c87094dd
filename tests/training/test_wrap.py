"""gossip.wrap: a user's own loop gives DecentralizedTrainer's numbers, checkpoints resume, the
helpers and the sampler, the algorithms it refuses, bad input, the examples and their diff."""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import io
import json
import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gossip
import topologies
from gossip.algorithms import REGISTRY, Algorithm
from gossip.comm.world import World
from gossip.errors import ConfigError, WrapError
from gossip.rng import data_seed, generator, partition_seed
from gossip.training import MLP, BatchStream, digits, flat, node_loader, partition_indices
from gossip.training.build import trainable_algorithms
from gossip.wrap import NodeSampler, wrap
from tests.helpers import wrap_runs
from tests.helpers.launch import ROOT, mpiexec, run_mpi, run_py, run_torchrun, torchrun

LAUNCHES_MARKED_PER_TEST = True  # only the tests under mpiexec/torchrun launch (tests/conftest.py)

DOC = ROOT / "docs" / "wrap.md"


def documented(kind: str) -> list[str]:
    """The algorithms docs/wrap.md lists under ``- works:`` / ``- not for`` / ``- federated`` /
    ``- asynchronous``."""
    text = DOC.read_text()
    item = re.search(rf"^- {kind}.*?(?=^- |^\n)", text, re.S | re.M)
    assert item, f"docs/wrap.md has no '- {kind}' list"
    return sorted(re.findall(r"`([a-z0-9-]+)`", item.group(0)))


WORKS, NOT_FOR_MODELS, FEDERATED = documented("works"), documented("not for"), documented("federated")
ASYNCHRONOUS = documented("asynchronous")
LOCAL_STEPS = documented("several gradients")
SETUP_STEP = ["beer", "beer-arcs", "docom", "lead", "lead-arcs", "motef"]
"""The algorithms whose setup takes a gradient, so the first ``opt.step()`` is the setup."""
BUILT_IN = [name for name in trainable_algorithms() if REGISTRY[name].__module__.startswith("gossip.")]
"""The package's own trainable algorithms (other test modules register some of theirs)."""


def test_the_docs_list_every_trainable_algorithm_once():
    listed = WORKS + NOT_FOR_MODELS + FEDERATED + ASYNCHRONOUS + LOCAL_STEPS
    assert sorted(listed) == BUILT_IN, "update the lists of docs/wrap.md"
    assert FEDERATED == sorted(n for n in BUILT_IN if REGISTRY[n].federated)
    assert ASYNCHRONOUS == sorted(n for n in BUILT_IN if REGISTRY[n].asynchronous)


@pytest.mark.parametrize("name", sorted(wrap_runs.CONFIGS))
def test_the_issues_four_equal_the_trainer(name):
    """CHOCO (top-k), D-PSGD, 1-bit Adam (past its warm-up), DES-LOC (periodic mixes): the
    same losses and models, bit for bit, over 8 rounds of 4 nodes in one process."""
    want, x_want = wrap_runs.trainer_losses(name, 4, 8)
    got, x_got = wrap_runs.wrap_losses(name, 4, 8)
    assert got == want
    assert torch.equal(x_got, x_want)
    start = torch.cat([p.detach().reshape(-1) for p in wrap_runs.model().parameters()])
    assert x_got.shape[0] == 4 and not torch.equal(x_got[0], start)  # it trained


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_trainable_algorithm_works_as_documented(name):
    if name in NOT_FOR_MODELS:
        with pytest.raises(ConfigError):
            wrap_runs.wrapped(name, 4)
        with pytest.raises(ConfigError):
            wrap_runs.trainer_losses(name, 4, 1)
    elif name in FEDERATED:
        with pytest.raises(WrapError, match=rf"^{re.escape(name)} is federated: .*DecentralizedTrainer"):
            wrap_runs.wrapped(name, 4)
    elif name in ASYNCHRONOUS:
        with pytest.raises(WrapError, match=rf"^{re.escape(name)} is asynchronous: .*"
                                            rf"experiments/train.py --algorithm {name} or "
                                            r"gossip.DecentralizedTrainer"):
            wrap_runs.wrapped(name, 4)
    elif name in LOCAL_STEPS:  # the trainer takes its local steps; the wrapper refuses the second
        assert len(wrap_runs.trainer_losses(name, 4, 2)[0]) == 2
        with pytest.raises(WrapError, match=rf"^{re.escape(name)} asks for a gradient a second time"):
            wrap_runs.wrap_losses(name, 4, 2)
    else:
        want, x_want = wrap_runs.trainer_losses(name, 4, 3)
        got, x_got = wrap_runs.wrap_losses(name, 4, 3)
        assert got == want
        assert torch.equal(x_got, x_want)


def test_the_timeout_reaches_the_detection_of_the_world(monkeypatch):
    """``wrap(timeout=...)`` bounds the start-up too: World.detect gets it (torchrun's
    rendezvous would otherwise wait torch's default)."""
    seen = {}
    detect = World.detect.__func__

    def spy(cls, timeout=120.0, **kwargs):
        seen["timeout"] = timeout
        return detect(cls, timeout, **kwargs)

    monkeypatch.setattr(World, "detect", classmethod(spy))
    net = wrap_runs.model()
    wrap(net, torch.optim.SGD(net.parameters(), lr=0.1), algorithm="dpsgd", timeout=7.5)
    assert seen == {"timeout": 7.5}


def test_the_model_is_the_nodes_row_of_x():
    model, opt = wrap_runs.wrapped("choco", None)
    assert opt.n == 1 and opt.models[0] is model and opt.node == 0 and opt.rank == 0
    train, _ = digits()
    x, y = next(iter(DataLoader(train, batch_size=16, sampler=opt.sampler(train))))
    nn.functional.cross_entropy(model(x), y).backward()
    before = copy.deepcopy(model.state_dict())
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(flat, opt.engine.block.x[0])
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is not None for p in model.parameters())  # backward's, as after optimizer.step()


@pytest.mark.parametrize("name", ["choco", "dpsgd"])
def test_one_node_alone_is_plain_training(name):
    """A plain process without nodes=: one node, nothing to gossip; a round of CHOCO-SGD or
    D-PSGD is then exactly the optimizer's step."""
    train, _ = digits()
    torch.manual_seed(0)
    plain = MLP(64, 10, (32,))
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(0)
    net = MLP(64, 10, (32,))
    net, opt = wrap(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), algorithm=name,
                    compressor="topk:0.1" if name == "choco" else None)
    batches = list(DataLoader(train, batch_size=32))[:5]
    for x, y in batches:
        for m, o in ((plain, sgd), (net, opt)):
            o.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for a, b in zip(plain.parameters(), net.parameters(), strict=True):
        assert torch.equal(a, b)


ALONE_REFUSED = ["c-ecl", "dlm", "powergossip"]
"""Algorithms that need a neighbor, refused on a single node."""


@pytest.mark.parametrize("name", WORKS)
def test_a_single_node_runs_or_is_refused_clearly(name):
    train, _ = digits()
    x, y = train.tensors[0][:16], train.tensors[1][:16]
    with pytest.raises(WrapError, match=rf"^{name} cannot run on a single node .*mpiexec -n 4") \
            if name in ALONE_REFUSED else contextlib.nullcontext():
        model, opt = wrap_runs.wrapped(name, None)
        for _ in range(2):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        assert opt.n == 1 and opt.round == 2 - (name in SETUP_STEP)


def _saved(opt) -> dict:
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("name", WORKS)
def test_the_first_step_is_the_setup_for_the_documented_ones(name):
    """Exactly the algorithms of SETUP_STEP spend the first step on their setup: no round,
    no message; the second step is round 1."""
    if name in ALONE_REFUSED:
        pytest.skip("needs a neighbor: checked with 4 nodes elsewhere")
    _, opt = wrap_runs.wrapped(name, 4)
    wrap_runs.wrap_losses(name, 4, 0, opt=opt)  # no round: nothing happens
    assert opt.round == 0 and not opt.engine.is_set_up
    train, _ = digits()
    for m in opt.models:
        nn.functional.cross_entropy(m(train.tensors[0][:8]), train.tensors[1][:8]).backward()
    opt.step()
    assert opt.round == (0 if name in SETUP_STEP else 1) and opt.engine.is_set_up
    if name in SETUP_STEP:
        assert opt.bits_sent == 0


@pytest.mark.parametrize("name", ["choco", "onebit-adam", "lead", "beer", "c-gt"])
def test_state_dict_round_trip_continues_exactly(name):
    """Save after 3 rounds, load into a fresh wrapper, run 4 more: the uninterrupted 7."""
    want, x_want = wrap_runs.wrap_losses(name, 4, 7)
    _, first = wrap_runs.wrapped(name, 4)
    train, _ = digits()
    streams = [wrap_runs.endless(DataLoader(train, batch_size=wrap_runs.BATCH,
                                            sampler=first.sampler(train, node=i)))
               for i in first.local_nodes]
    got, _ = wrap_runs.wrap_losses(name, 4, 3, opt=first, streams=streams)
    state = _saved(first)
    model, second = wrap_runs.wrapped(name, 4)
    second.load_state_dict(state)
    assert second.round == 3
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                       first.engine.block.x[0])
    more, x_got = wrap_runs.wrap_losses(name, 4, 4, opt=second, streams=streams)
    assert got + more == want
    assert torch.equal(x_got, x_want)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_half_models_with_master_weights_equal_the_trainer(dtype):
    """A bfloat16 model wrapped with its SGD: the optimizer is moved onto float32 master
    weights, and the run is the trainer's with ``dtype``, bit for bit. (float16: the trainer
    scales the loss, your backward does not, so their gradients differ.)"""
    want, x_want = wrap_runs.trainer_losses("choco", 4, 6, dtype=dtype)
    _, opt = wrap_runs.wrapped("choco", 4, dtype=dtype)
    assert all(o.master is not None for o in opt._oracles)
    assert all(p.dtype == torch.float32 for g in opt.param_groups for p in g["params"])
    got, x_got = wrap_runs.wrap_losses("choco", 4, 6, opt=opt)
    assert x_got.dtype == dtype and got == want and torch.equal(x_got, x_want)


def test_master_weights_refusals():
    net = wrap_runs.model()
    with pytest.raises(WrapError, match="master_weights=True .* the model is torch.float32"):
        wrap(net, torch.optim.SGD(net.parameters(), lr=0.1), master_weights=True, nodes=2)
    half = wrap_runs.model(dtype=torch.bfloat16)
    sgd = torch.optim.SGD(half.parameters(), lr=0.1, momentum=0.9)
    half(torch.zeros(2, 64, dtype=torch.bfloat16)).sum().backward()
    sgd.step()
    with pytest.raises(WrapError, match="optimizer has state already"):
        wrap(half, sgd, nodes=2)


def test_a_checkpoint_from_before_the_setup_step():
    """LEAD saved before its first step resumes into a new wrapper (which then takes the setup
    step) and equals the uninterrupted run; a wrapper past its setup refuses it."""
    want, x_want = wrap_runs.wrap_losses("lead", 4, 3)
    _, first = wrap_runs.wrapped("lead", 4)
    state = _saved(first)
    _, second = wrap_runs.wrapped("lead", 4)
    second.load_state_dict(state)
    got, x_got = wrap_runs.wrap_losses("lead", 4, 3, opt=second)
    assert got == want and torch.equal(x_got, x_want)
    with pytest.raises(ConfigError, match="before the algorithm's setup .*new run"):
        second.load_state_dict(state)


def test_a_checkpoint_of_another_run_is_refused():
    _, a = wrap_runs.wrapped("choco", 4)
    _, b = wrap_runs.wrapped("dpsgd", 4)
    with pytest.raises(WrapError, match="same algorithm"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(WrapError, match="state_dict"):
        b.load_state_dict({"x": 1})


def test_helpers():
    """average_model is x̄, consensus_distance the engine's error, bits count what was sent."""
    _, opt = wrap_runs.wrapped("choco", 4)
    assert opt.consensus_distance() == 0.0 and opt.bits_sent == 0
    wrap_runs.wrap_losses("choco", 4, 3, opt=opt)
    avg = opt.average_model()
    xbar = opt.engine.mean_model()
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in avg.parameters()]), xbar)
    want = sum(float(((r - xbar) ** 2).sum()) for r in opt.engine.block.x) / 4
    assert opt.consensus_distance() == pytest.approx(want, rel=1e-12) and want > 0
    sent = opt.engine.transport.bytes_sent
    assert opt.bits_sent == 8 * sum(sent.values()) > 0
    assert opt.bits_per_node() == pytest.approx(opt.bits_sent / 4)
    assert opt.local_nodes == [0, 1, 2, 3] and opt.world_size == 1 and opt.is_root
    assert len(opt.param_groups) == 4
    schedule = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)  # a torch.optim.Optimizer
    wrap_runs.wrap_losses("choco", 4, 2, opt=opt)
    schedule.step()
    assert [o.param_groups[0]["lr"] for o in opt.optimizers] == [0.05] * 4  # every node's
    assert set(opt.state) == {p for m in opt.models for p in m.parameters()}  # momentum buffers


def test_step_takes_a_closure_and_the_module_is_callable():
    assert callable(gossip.wrap) and gossip.wrap.NodeSampler is NodeSampler
    model, opt = gossip.wrap(wrap_runs.model(), None, algorithm="dpsgd", eta=0.1, nodes=2)
    train, _ = digits()
    x, y = train.tensors[0][:8], train.tensors[1][:8]

    def closure():
        opt.zero_grad()
        for m in opt.models:
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
        return loss

    assert isinstance(opt.step(closure), torch.Tensor)
    assert opt.round == 1


# -- the sampler ------------------------------------------------------------------------------------


class _Plain(Dataset):
    """The digits as a map-style data set that is not a TensorDataset (the loader's slow path)."""

    def __init__(self, base):
        self.x, self.y = base.tensors

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("plain", [False, True])
@pytest.mark.parametrize("partition", ["iid", "dirichlet:0.5"])
def test_node_sampler_reads_what_the_trainer_reads(plain, partition):
    train, _ = digits()
    data = _Plain(train) if plain else train
    for node in (0, 3):
        parts = partition_indices(data, 5, partition, partition_seed(7))
        stream = BatchStream(node_loader(data, parts[node], 16, generator(data_seed(7, node))))
        loader = DataLoader(data, batch_size=16, sampler=NodeSampler(data, node, 5, seed=7,
                                                                    partition=partition))
        mine = wrap_runs.endless(loader)
        for _ in range(2 * len(loader) + 3):  # past two passes
            (xa, ya), (xb, yb) = next(stream), next(mine)
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_node_sampler_resumes_its_order():
    """A checkpoint of the sampler mid-pass: a fresh sampler and loader go on with the next
    batch of the uninterrupted order (into the following passes)."""
    train, _ = digits()
    straight = wrap_runs.endless(DataLoader(train, batch_size=16, sampler=NodeSampler(train, 1, 4)))
    want = [next(straight)[1] for _ in range(60)]
    first = NodeSampler(train, 1, 4)
    it = iter(DataLoader(train, batch_size=16, sampler=first))
    got = [next(it)[1] for _ in range(10)]
    state = first.state_dict()
    assert state["drawn"] == 160
    second = NodeSampler(train, 1, 4)
    second.load_state_dict(state)
    rest = wrap_runs.endless(DataLoader(train, batch_size=16, sampler=second))
    got += [next(rest)[1] for _ in range(50)]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert second.passes >= 2


def test_node_sampler_refuses_a_bad_node():
    train, _ = digits()
    with pytest.raises(ConfigError, match="not one of the 4 nodes"):
        NodeSampler(train, 4, 4)


# -- bad input -------------------------------------------------------------------------------------


def test_a_model_without_parameters():
    with pytest.raises(WrapError, match="no parameters"):
        wrap(nn.ReLU(), None, algorithm="dpsgd")


def test_parameters_not_in_the_optimizer():
    model = wrap_runs.model()
    first = model[1]
    with pytest.raises(WrapError, match=r"not in the optimizer .*model.parameters\(\)"):
        wrap(model, torch.optim.SGD(first.parameters(), lr=0.1))
    with pytest.raises(WrapError, match="not parameters of the model"):
        wrap(model, torch.optim.SGD(wrap_runs.model().parameters(), lr=0.1))
    with pytest.raises(WrapError, match="factory returned"):
        wrap(model, lambda params: None)


def test_an_optimizer_for_an_algorithm_that_takes_none():
    model = wrap_runs.model()
    with pytest.raises(ConfigError, match="pass no optimizer"):
        wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), algorithm="onebit-adam",
             topology="complete", nodes=4)


def test_l2_with_an_optimizer_is_refused():
    model = wrap_runs.model()
    with pytest.raises(WrapError, match="weight_decay"):
        wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), l2=1e-4)


@pytest.mark.parametrize(("spec", "n"), [("alternating-ring", 5), ("alternating-exp-ring", 4)])
def test_one_peer_schedules_by_name_equal_the_trainer(monkeypatch, spec, n):
    """A time-varying graph named in wrap(topology=...) runs each round's W, as the trainer."""
    monkeypatch.setitem(wrap_runs.CONFIGS, "dpsgd", {**wrap_runs.CONFIGS["dpsgd"], "topology": spec})
    _, opt = wrap_runs.wrapped("dpsgd", n)
    assert opt.engine.topology.time_varying and opt.engine.topology.name == spec
    want, x_want = wrap_runs.trainer_losses("dpsgd", n, 5)
    got, x_got = wrap_runs.wrap_losses("dpsgd", n, 5, opt=opt)
    assert got == want and torch.equal(x_got, x_want)


def test_a_topology_of_another_size():
    with pytest.raises(WrapError, match=r"5 nodes but 1 process.*mpiexec -n 5.*nodes=5"):
        wrap(wrap_runs.model(), None, algorithm="dpsgd", topology=topologies.build("ring", 5))
    with pytest.raises(WrapError, match="pass nodes=5"):
        wrap(wrap_runs.model(), None, algorithm="dpsgd", topology=topologies.build("ring", 5), nodes=4)


def test_a_launch_whose_processes_see_a_world_of_one(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(WrapError, match=r"one of 4 .*its world is a single process.*leave world= "):
        wrap(wrap_runs.model(), None, algorithm="dpsgd", world=World(None))
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("PMI_SIZE", "4")
    with pytest.raises(WrapError, match="mpiexec started 4 processes but MPI"):
        wrap(wrap_runs.model(), None, algorithm="dpsgd", world=World(None))


def test_a_new_parameter_group_is_refused():
    _, opt = wrap_runs.wrapped("choco", None)
    with pytest.raises(WrapError, match="before gossip.wrap"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})


def test_a_step_without_backward():
    _, opt = wrap_runs.wrapped("dpsgd", None)
    with pytest.raises(WrapError, match=r"call loss.backward\(\) before opt.step\(\)"):
        opt.step()


class _TwoGradients(Algorithm):
    """A round that asks for the gradient twice (a probe of the wrapper's check)."""

    name = "two-gradients"
    trains = True

    def setup(self, block):
        block.workspace["g"] = torch.empty_like(block.x)

    def step(self, block):
        g = block.gradients(block.workspace["g"])
        block.x.sub_(g, alpha=0.1)
        block.gradients(block.workspace["g"])
        yield from ()


class _GradientElsewhere(_TwoGradients):
    """A round that moves x, then asks for the gradient (extragradient-like)."""

    name = "gradient-elsewhere"

    def step(self, block):
        block.x.mul_(0.5)
        block.gradients(block.workspace["g"])
        yield from ()


@pytest.mark.parametrize(("cls", "why"), [(_TwoGradients, "a second time in one round"),
                                          (_GradientElsewhere, "at another point")])
def test_an_algorithm_that_wants_another_gradient(cls, why):
    model, opt = wrap(wrap_runs.model(), None, algorithm=cls(), nodes=2)
    train, _ = digits()
    for m in opt.models:
        nn.functional.cross_entropy(m(train.tensors[0][:8]), train.tensors[1][:8]).backward()
    with pytest.raises(WrapError, match=rf"^{cls.name} asks for .*{why}.*DecentralizedTrainer"):
        opt.step()


# -- the examples ----------------------------------------------------------------------------------


def _body(path) -> list[str]:
    """An example's lines after its module docstring."""
    text = path.read_text()
    return text[text.index('"""', 3) + 4:].splitlines(keepends=True)


def example_diff() -> str:
    """The unified diff from train_plain.py to train_gossip.py, docstrings left out."""
    plain, wrapped = ROOT / "examples" / "train_plain.py", ROOT / "examples" / "train_gossip.py"
    lines = difflib.unified_diff(_body(plain), _body(wrapped), "train_plain.py", "train_gossip.py", n=1)
    return "".join(re.sub(r"^(@@ [^@]* @@).*", r"\1", line) for line in lines)


def test_the_docs_show_the_examples_diff():
    text = DOC.read_text()
    block = re.search(r"```diff\n(.*?)```", text, re.S)
    assert block, "docs/wrap.md has no ```diff block"
    assert block.group(1) == example_diff(), "regenerate the diff in docs/wrap.md (example_diff())"
    changed = [ln for ln in example_diff().splitlines()[2:] if ln[:1] in "+-"]
    assert 0 < len(changed) <= 8, changed  # "a few lines different"


@pytest.mark.slow
def test_the_examples_run():
    plain = run_py(["examples/train_plain.py", "--steps", "20"], timeout=120)
    assert plain.returncode == 0, plain.stderr
    one = run_py(["examples/train_gossip.py", "--steps", "20"], timeout=120)
    assert one.returncode == 0, one.stderr
    for res in (plain, one):
        assert re.search(r"steps 20 .*test accuracy 0\.\d+", res.stdout), res.stdout


# -- under MPI ---------------------------------------------------------------------------------------


LAUNCHERS = [pytest.param(run_mpi, id="mpiexec",
                          marks=pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")),
             pytest.param(run_torchrun, id="torchrun",
                          marks=pytest.mark.skipif(torchrun() is None, reason="no torchrun"))]


_trainer_losses = functools.cache(wrap_runs.trainer_losses)
"""The trainer's runs that both launchers' ranks are compared with, run once (read only)."""


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.parametrize("launch", LAUNCHERS)
def test_ranks_equal_the_trainer_and_refuse_unequal_models(tmp_path, launch):
    """One node per process under mpiexec -n 4 and torchrun --nproc-per-node 4 (gloo)."""
    res = launch(4, ["tests/helpers/mpi_wrap.py", str(tmp_path)], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    for name in wrap_runs.LAUNCHED:
        want, x_want = _trainer_losses(name, 4, 8)
        for rank in range(4):
            got = json.loads((tmp_path / f"{name}.{rank}.json").read_text())
            assert got["losses"] == want, (name, rank)
            x = torch.load(tmp_path / f"{name}.{rank}.pt", weights_only=True)
            assert torch.equal(x, x_want[rank]), (name, rank)
    want, x_want = _trainer_losses("choco", 8, 4)
    for rank in range(4):
        assert json.loads((tmp_path / f"block.{rank}.json").read_text())["losses"] == want
        x = torch.load(tmp_path / f"block.{rank}.pt", weights_only=True)
        assert torch.equal(x, x_want[2 * rank : 2 * rank + 2]), rank
    for rank in range(4):
        msg = (tmp_path / f"unequal.{rank}.txt").read_text()
        assert "differs between processes" in msg and "[1]" in msg and "manual_seed" in msg
        resumed = json.loads((tmp_path / f"resume.{rank}.json").read_text())
        assert resumed["resumed"] == resumed["straight"]


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.skipif(torchrun() is None, reason="no torchrun")
def test_the_gossip_example_under_torchrun():
    """The example under torchrun (under mpiexec: tests/training/test_wrap_nodes_example.py,
    which also checks that rank 0 alone prints)."""
    res = run_torchrun(4, ["examples/train_gossip.py", "--steps", "20"], timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(re.findall(r"test accuracy", res.stdout)) == 1, res.stdout  # rank 0 prints


@pytest.mark.parametrize("gossip_buffers", [False, True])
def test_batchnorm_buffers_local_or_gossiped(gossip_buffers):
    """Local BatchNorm statistics are averaged by average_model; gossiped ones live in x."""
    from gossip.training import SmallCNN

    train, _ = digits(image=True)
    torch.manual_seed(0)
    net = SmallCNN(1, 10, (8, 8), width=4, norm="batch")
    net, opt = wrap(net, torch.optim.SGD(net.parameters(), lr=0.1), algorithm="dpsgd", nodes=2,
                    gossip_buffers=gossip_buffers)
    for step in range(2):
        opt.zero_grad()
        for k, m in enumerate(opt.models):
            lo = 16 * (2 * step + k)
            nn.functional.cross_entropy(m(train.tensors[0][lo:lo + 16]), train.tensors[1][lo:lo + 16]).backward()
        opt.step()
    means = [dict(m.named_buffers())["features.1.running_mean"] for m in opt.models]
    avg = dict(opt.average_model().named_buffers())["features.1.running_mean"]
    assert torch.allclose(avg, (means[0] + means[1]) / 2, atol=1e-7)
    in_x = means[0].data_ptr() - opt.engine.block.x[0].data_ptr()
    assert (0 <= in_x < opt.engine.block.x[0].numel() * 4) == gossip_buffers


# -- overlap -----------------------------------------------------------------------------------------


def test_overlap_is_offered_where_it_changes_no_number():
    from gossip.wrap import wrap_overlapping

    assert wrap_overlapping() == ["accum-adam", "accum-adamw", "c-ecl", "choco", "choco-amsgrad",
                                  "choco-arcs", "dpsgd", "ecd"]
    with pytest.raises(WrapError):
        wrap(wrap_runs.model(), None, algorithm="lead", nodes=4, overlap=True)
    for name in ("dpsgd", "choco", "lead"):
        _, opt = wrap(wrap_runs.model(), None, algorithm=name, nodes=4)
        assert opt.overlap == (name in wrap_overlapping())  # on by default where exact


@pytest.mark.parametrize("algorithm, kwargs", [
    ("choco", {"compressor": "topk:0.2", "gamma": 0.3}),
    ("dpsgd", {}),
    ("dpsgd", {"compressor": "qsgd:4bit:biased", "topology": "alternating-ring"}),
    ("ecd", {"compressor": "qsgd:4bit", "eta": 0.1}),
    ("accum-adam", {"eta": 1e-3, "accum_iter": 2}),
])
def test_overlapped_steps_equal_plain_steps(algorithm, kwargs):
    """Through the wrapper with overlap: CHOCO's messages are mixed in at the next step,
    D-PSGD's are posted at the forward and mixed in at the step; the losses, the consensus
    distance and the final models equal the plain run's."""
    runs = []
    for overlap in (False, True):
        torch.manual_seed(0)
        model = wrap_runs.model()
        optimizer = None if algorithm in ("ecd", "accum-adam") else torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = wrap(model, optimizer, algorithm=algorithm, nodes=4, overlap=overlap, **kwargs)
        train, _ = digits()
        xs, ys = train.tensors
        losses = []
        for step in range(6):
            for k, m in enumerate(opt.models):
                batch = slice(32 * (4 * step + k), 32 * (4 * step + k + 1))
                loss = torch.nn.functional.cross_entropy(m(xs[batch]), ys[batch])
                loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad()
            assert opt.round == step + 1
        runs.append((losses, opt.consensus_distance(), torch.stack(
            [opt.engine.nodes[i].x.clone() for i in opt.local_nodes])))
        if overlap:
            assert not opt.engine.in_round  # consensus_distance mixed the last round in
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert torch.equal(runs[0][2], runs[1][2])


def test_dpsgd_posts_its_messages_at_a_differentiated_forward():
    """D-PSGD with overlap: a forward with gradients posts the round (the messages travel
    during the forward and backward), a no_grad forward posts nothing, and a checkpoint
    between the forward and its step is refused rather than saved half-way."""
    torch.manual_seed(0)
    model = wrap_runs.model()
    model, opt = wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), algorithm="dpsgd", nodes=2)
    train, _ = digits()
    xs, ys = train.tensors
    for step in range(3):
        with torch.no_grad():
            opt.models[0](xs[:8])
        assert not opt.engine.in_round or step == 0
        losses = [nn.functional.cross_entropy(m(xs[16 * k:16 * k + 16]), ys[16 * k:16 * k + 16])
                  for k, m in enumerate(opt.models)]
        assert opt.engine.in_round == (step > 0)  # the first step sets up and runs whole
        if step == 1:
            with pytest.raises(WrapError):
                opt.state_dict()
        for loss in losses:
            loss.backward()
        opt.step()
        opt.zero_grad()
        assert not opt.engine.in_round and opt.round == step + 1
    assert set(opt.state_dict()) == {"wrap", "nodes", "run"}


def test_a_scheduler_drives_eta_without_a_local_optimizer():
    """Without a local optimizer, opt.param_groups' lr is the algorithm's eta: a StepLR on the
    wrapped optimizer gives the run of the same schedule passed as eta(t)."""
    train, _ = digits()
    xs, ys = train.tensors
    finals = []
    for how in ("scheduler", "callable"):
        torch.manual_seed(0)
        model = wrap_runs.model()
        eta = 1e-2 if how == "scheduler" else (lambda t: 1e-2 * 0.5 ** ((t - 1) // 2))
        model, opt = wrap(model, None, algorithm="accum-adam", nodes=2, eta=eta, accum_iter=1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if how == "scheduler" else None
        for step in range(6):
            opt.zero_grad()
            for k, m in enumerate(opt.models):
                lo = 16 * (2 * step + k)
                nn.functional.cross_entropy(m(xs[lo:lo + 16]), ys[lo:lo + 16]).backward()
            opt.step()
            if sched is not None:
                sched.step()
        finals.append(opt.engine.block.x.clone())
    assert torch.equal(finals[0], finals[1])


@pytest.mark.parametrize("algorithm", ["dpsgd", "choco"])
def test_grad_scaler_skips_an_overflowing_step_on_every_node(algorithm):
    """torch.amp.GradScaler on the wrapped optimizer: the scaled gradients are unscaled before
    the round (a power-of-two scale: the run equals the unscaled one bit for bit), and a step
    whose gradients overflow on one node only is skipped by every node (no round, no local
    step), as a loop that leaves that step out on every node."""
    train, _ = digits()
    xs, ys = train.tensors
    bad_step = 2
    finals = []
    for scaled in (True, False):
        torch.manual_seed(0)
        model = wrap_runs.model()
        model, opt = wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), algorithm=algorithm,
                          nodes=2, compressor="topk:0.5" if algorithm == "choco" else None)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaled else None
        for step in range(5):
            opt.zero_grad()
            for k, m in enumerate(opt.models):
                lo = 16 * (2 * step + k)
                loss = nn.functional.cross_entropy(m(xs[lo:lo + 16]), ys[lo:lo + 16])
                if step == bad_step and k == 1:
                    loss = loss * float("inf")  # this node's gradients overflow
                (scaler.scale(loss) if scaled else loss).backward()
            if scaled:
                scaler.step(opt)
                scaler.update()
            elif step != bad_step:
                opt.step()
        opt.synchronize()
        finals.append(opt.engine.block.x.clone())
        if scaled:
            assert scaler.get_scale() == 512.0  # halved once, by the overflow
            assert opt.round == 4
    assert torch.isfinite(finals[0]).all()
    assert torch.equal(finals[0], finals[1])


def test_gradient_accumulation_and_clipping_in_the_loop():
    """Two half-batch backwards of half the loss before one step give the step of the whole
    batch (to rounding), and clip_grad_norm_ between backward and step clips what the round
    takes."""
    train, _ = digits()
    xs, ys = train.tensors
    finals = {}
    for how in ("whole", "accumulated", "clipped"):
        torch.manual_seed(0)
        model = wrap_runs.model()
        model, opt = wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), algorithm="dpsgd", nodes=2)
        for step in range(4):
            opt.zero_grad()
            for k, m in enumerate(opt.models):
                lo = 32 * (2 * step + k)
                if how == "accumulated":
                    for half in (slice(lo, lo + 16), slice(lo + 16, lo + 32)):
                        (nn.functional.cross_entropy(m(xs[half]), ys[half]) / 2).backward()
                else:
                    nn.functional.cross_entropy(m(xs[lo:lo + 32]), ys[lo:lo + 32]).backward()
                if how == "clipped":
                    torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
            opt.step()
        finals[how] = opt.engine.block.x.clone()
    assert torch.allclose(finals["whole"], finals["accumulated"], atol=1e-6)
    assert not torch.allclose(finals["whole"], finals["clipped"], atol=1e-4)
    torch.manual_seed(0)
    start = flat.flatten(wrap_runs.model())
    moved = (finals["clipped"] - start).norm(dim=1)  # 4 steps of lr 0.1 on gradients of norm <= 1e-3
    assert bool((moved <= 4 * 0.1 * 1e-3 * 1.01 + 1e-6).all())


def test_zero_grad_in_place_accumulates_into_the_flat_gradient():
    """zero_grad(set_to_none=False) zeroes the .grad views into the flat gradient in place:
    the backward accumulates into them, the step copies nothing, and the run is the same."""
    train, _ = digits()
    xs, ys = train.tensors
    finals = []
    for none in (True, False):
        torch.manual_seed(0)
        model = wrap_runs.model()
        model, opt = wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), algorithm="dpsgd", nodes=2)
        for step in range(4):
            opt.zero_grad(set_to_none=none)
            for k, m in enumerate(opt.models):
                lo = 16 * (2 * step + k)
                nn.functional.cross_entropy(m(xs[lo:lo + 16]), ys[lo:lo + 16]).backward()
            if step and not none:  # the backward wrote into the round's flat gradient
                grad = opt.engine.block.workspace["grad"]
                start, size = grad[0].data_ptr(), grad[0].numel() * grad.element_size()
                assert all(start <= p.grad.data_ptr() < start + size for p in opt.models[0].parameters())
            opt.step()
        finals.append(opt.engine.block.x.clone())
    assert torch.equal(finals[0], finals[1])
