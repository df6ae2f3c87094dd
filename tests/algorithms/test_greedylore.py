"""GreedyLore and PowerSGD on the all-reduce (docs/algorithms/greedylore.md): the float64
reference, the full-rank reduction, the greedy selection with its error feedback, the bytes,
resume and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.layout import Layout
from tests.helpers.reference_adaptive import QuadraticOracle, quadratic_problem
from tests.helpers.reference_lowrank import lowrank_allreduce

SHAPES = [(6, 9), (5,), (7, 3), (3, 2, 2)]  # short side rows, a bias, short side columns, a 3-D one
D = sum(math.prod(s) for s in SHAPES)


def _engine(name: str, n: int, data, hp: dict, x0=None, seed: int = 2) -> Engine:
    return Engine(make_algorithm(name, **hp), topologies.build("complete", n),
                  (lambda i: torch.zeros(D, dtype=torch.float64)) if x0 is None else x0,
                  layout=Layout(SHAPES), seed=seed, oracles=lambda i, gen: QuadraticOracle(data, i))


def _models(eng: Engine, n: int) -> torch.Tensor:
    return torch.stack([eng.nodes[i].x for i in range(n)])


CASES = [
    ("greedylore", dict(eta=0.05, rank=2, refresh=4, start=2, min_compression=0.0)),
    ("greedylore", dict(eta=0.05, rank=1, refresh=5, start=0, min_compression=2.0)),
    ("powersgd", dict(eta=0.05, rank=2, start=2, min_compression=0.0)),
    ("powersgd", dict(eta=0.05, rank=1, start=1, refresh=5, min_compression=2.0)),
]


@pytest.mark.parametrize(("name", "hp"), CASES)
@pytest.mark.parametrize("n", [3, 4])
def test_equals_the_float64_reference(name, hp, n):
    data, grads = quadratic_problem(n, D, seed=n)
    eng = _engine(name, n, data, hp)
    eng.run(14, log_every=14)
    X = _models(eng, n)
    subspace = "greedy" if name == "greedylore" else "power"
    ref_x, ref_e = lowrank_allreduce(torch.zeros(n, D, dtype=torch.float64), grads, 14,
                                     shapes=SHAPES, subspace=subspace, seed=2,
                                     **{"refresh": 0, **hp})
    torch.testing.assert_close(X, ref_x, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(eng.block.state["error"], ref_e, rtol=1e-9, atol=1e-11)
    assert float((X - X[0]).abs().max()) == 0.0  # every node the same model, bit for bit
    assert float(ref_e.abs().max()) > 1e-6  # the memory took part


@pytest.mark.parametrize("name", ["greedylore", "powersgd"])
def test_full_rank_is_the_exact_allreduce(name):
    """r = min(a, b) on every matrix: ḡ is the mean gradient every round (greedy's memory
    stays 0; PowerSGD's memories A_i − Ā sum to 0), so the run is plain all-reduce SGD."""
    n = 4
    data, _ = quadratic_problem(n, D, seed=7)
    hp = dict(eta=0.05, rank=9, start=1, min_compression=0.0)
    if name == "greedylore":
        hp["refresh"] = 5
    full = _engine(name, n, data, hp)
    plain = _engine(name, n, data, {**hp, "start": 100})
    for _ in range(12):
        full.step()
        plain.step()
        torch.testing.assert_close(_models(full, n), _models(plain, n), rtol=1e-11, atol=1e-12)
        E = full.block.state["error"]
        if name == "greedylore":
            assert float(E.abs().max()) < 1e-12
        else:
            assert float(E.sum(0).abs().max()) < 1e-12
    if name == "powersgd":
        assert float(full.block.state["error"].abs().max()) > 1e-6  # A_i − Ā: not 0 per node
    assert full.transport.bytes_sent[0] != plain.transport.bytes_sent[0]  # it did compress


class _Constant:
    """Every node's gradient: the same fixed vector."""

    def __init__(self, g: torch.Tensor):
        self.g = g

    def grad(self, x, out=None):
        return self.g.clone() if out is None else out.copy_(self.g)


def test_scores_pick_the_dominant_direction_and_error_feedback_keeps_the_rest():
    """With B = I and G = diag(1, 100, 2) on every node, rank 1 keeps direction 1 (the probes'
    σ_j estimate ‖(Bᵀ Ḡ)_j‖² up to scale); ḡ + E = G + E_prev every compressed round, so what
    was left out is sent later."""
    n, eta = 3, 0.5
    g = torch.diag(torch.tensor([1.0, 100.0, 2.0], dtype=torch.float64)).reshape(-1)
    eng = Engine(make_algorithm("greedylore", eta=eta, rank=1, refresh=1000, start=0,
                                min_compression=0.0),
                 topologies.build("complete", n), lambda i: torch.zeros(9, dtype=torch.float64),
                 layout=Layout([(3, 3)]), seed=0, oracles=lambda i, gen: _Constant(g))
    eng.step()  # round 1: the refresh (full precision; its SVD basis replaced below)
    eng.block.state["basis"].copy_(torch.eye(3, dtype=torch.float64).reshape(1, -1))
    E_prev = torch.zeros(9, dtype=torch.float64)
    picked = []
    for _ in range(150):
        x = eng.nodes[0].x.clone()
        eng.step()
        gbar = (x - eng.nodes[0].x) / eta
        E = eng.block.state["error"][0].clone()
        torch.testing.assert_close(gbar + E, g + E_prev, rtol=0, atol=1e-12)
        picked.append(int(gbar.view(3, 3).abs().sum(1).argmax()))
        E_prev = E
    assert picked[0] == 1  # the dominant direction first
    assert set(picked) == {0, 1, 2}  # the memory grows until the others are sent too
    assert picked.count(1) > 100  # the dominant direction most often


@pytest.mark.parametrize(("name", "hp"), [CASES[0], CASES[2]])
def test_bytes_are_the_two_reductions_of_the_factors(name, hp):
    """A compressed round sends two full-precision all-reduces (2(n−1)·⌈N/n⌉ values each);
    plain and refresh rounds the model's."""
    n = 4
    data, _ = quadratic_problem(n, D, seed=1)
    eng = _engine(name, n, data, hp)
    eng.run(10, log_every=10)
    per = lambda numel: 2 * (n - 1) * (-(-numel // n)) * 8  # noqa: E731
    dense = 5
    if name == "greedylore":  # scores s, then factors r·L plus the bias
        first, second = 6 + 3 + 3, 2 * 9 + 2 * 7 + 2 * 4 + dense
        plain_rounds = 2 + 2  # rounds 1-2, refreshes at 3 and 7
    else:  # P (r·a) plus the bias, then Q (r·b)
        first, second = 2 * (6 + 7 + 3) + dense, 2 * (9 + 3 + 4)
        plain_rounds = 2
    want = plain_rounds * per(D) + (10 - plain_rounds) * (per(first) + per(second))
    assert eng.transport.bytes_sent[0] == want


@pytest.mark.parametrize(("name", "hp"), [
    ("greedylore", dict(eta=0.05, rank=2, refresh=3, start=1)),
    ("powersgd", dict(eta=0.05, rank=1, start=2)),
])
def test_checkpoint_resume_equals_the_uninterrupted_run(tmp_path, name, hp):
    """The memory, greedy's basis and PowerSGD's warm-start factors are checkpointed; the
    probes are keyed by the round: the resumed run is the uninterrupted one, bit for bit."""
    from gossip.checkpoint import Checkpointer

    n = 4
    data, _ = quadratic_problem(n, D, seed=5)
    x0 = lambda i: torch.full((D,), 0.1 * (i + 1), dtype=torch.float64)  # noqa: E731
    full = _engine(name, n, data, hp, x0)
    full.run(10, log_every=10)
    cut = _engine(name, n, data, hp, x0)
    cut.run(5, log_every=5)
    Checkpointer(tmp_path / "run00", {"test": name}).save(cut)
    resumed = _engine(name, n, data, hp, x0)
    assert Checkpointer(tmp_path / "run00", {"test": name}).restore(resumed) == 5
    resumed.run(5, log_every=5)
    a, b = resumed.node_state_dicts(), full.node_state_dicts()
    for i in range(n):
        assert torch.equal(resumed.nodes[i].x, full.nodes[i].x)
        assert a[i]["state"].keys() == b[i]["state"].keys()
        assert all(torch.equal(a[i]["state"][k], b[i]["state"][k]) for k in a[i]["state"])
        assert a[i]["bytes_sent"] == b[i]["bytes_sent"]


def test_what_is_compressed_follows_the_rule_and_the_rate():
    from gossip.algorithms.greedylore import make_plan

    shapes = [(0, (64, 32)), (2048, (32,)), (2080, (10, 32)), (2400, (10,))]
    greedy = make_plan(shapes, 4, "greedy", 2.0)
    power = make_plan(shapes, 4, "power", 2.0)
    assert [m.offset for m in greedy.matrices] == [0, 2080]  # 4·32·2 < 320
    assert [m.offset for m in power.matrices] == [0]  # 4·42·2 ≥ 320: the 10 × 32 goes in full
    assert power.dense == ((2048, 32 + 320 + 10),)
    assert make_plan(shapes, 4, "power", 0.0).dense == ((2048, 32), (2400, 10))


@pytest.mark.parametrize(("name", "hp", "message"), [
    ("greedylore", {"subspace": "random"}, "subspace"),
    ("greedylore", {"refresh": 0}, "refresh"),
    ("greedylore", {"rank": 0}, "rank"),
    ("powersgd", {"start": -1}, "start"),
    ("powersgd", {"min_compression": -1.0}, "min_compression"),
])
def test_bad_hyper_parameters_are_refused(name, hp, message):
    with pytest.raises(ConfigError, match=message):
        make_algorithm(name, **hp)


@pytest.mark.parametrize("name", ["greedylore", "powersgd"])
def test_needs_the_complete_graph_and_no_gossip_compressor(name):
    data, _ = quadratic_problem(4, D, seed=1)
    with pytest.raises(ConfigError):
        Engine(make_algorithm(name), topologies.build("ring", 4),
               lambda i: torch.zeros(D, dtype=torch.float64), layout=Layout(SHAPES),
               oracles=lambda i, gen: QuadraticOracle(data, i))
    with pytest.raises(ConfigError):
        Engine(make_algorithm(name), topologies.build("complete", 4),
               lambda i: torch.zeros(D, dtype=torch.float64), layout=Layout(SHAPES),
               compressor="topk:0.5", oracles=lambda i, gen: QuadraticOracle(data, i))


@pytest.mark.parametrize("name", ["greedylore", "powersgd"])
def test_a_run_that_may_lose_messages_is_refused(name):
    """An all-reduce needs every chunk, and the nodes' shared B and Q would part: no meaning
    for a lost message, so a lossy network is refused before any message."""
    data, _ = quadratic_problem(4, D, seed=1)
    with pytest.raises(ConfigError, match="loss"):
        Engine(make_algorithm(name), topologies.build("complete", 4),
               lambda i: torch.zeros(D, dtype=torch.float64), layout=Layout(SHAPES),
               network="loss=0.1", oracles=lambda i, gen: QuadraticOracle(data, i))
