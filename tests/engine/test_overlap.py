"""--overlap: the next gradients computed while a round's messages travel give the same bits as
computed after them; algorithms that change x after sending are refused or caught; the
simulated link delay holds every phase back."""

from __future__ import annotations

import time

import pytest
import torch

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.algorithms.gossip import Gossip
from gossip.checkpoint import Checkpointer
from gossip.comm.world import World
from gossip.engine import Engine
from gossip.errors import ConfigError, ContractError, NodeError
from gossip.problems import make_problem
from gossip.rng import generator, init_seed

N, D = 6, 10
PROBLEM = make_problem("least-squares", n_nodes=N, dim=D, samples_per_node=20, seed=3,
                       dtype=torch.float64)
OVERLAPPING = sorted(name for name, cls in REGISTRY.items() if cls.overlaps)
HPARAMS = {"choco": {"gamma": 0.3}, "choco-amsgrad": {"gamma": 0.3}, "choco-arcs": {"gamma": 0.3}}


def engine(name: str, overlap: bool, **kw) -> Engine:
    alg = make_algorithm(name, **(HPARAMS.get(name, {}) | {"eta": 0.02}))
    x0 = lambda i: torch.randn(D, generator=generator(init_seed(1, i)), dtype=torch.float64)  # noqa: E731
    return Engine(alg, topologies.build("ring", N), x0, dtype=torch.float64, overlap=overlap,
                  oracles=lambda i, g: PROBLEM.oracle(i, g, "sgd", 2), **kw)


def models(eng: Engine) -> torch.Tensor:
    return torch.stack([eng.nodes[i].x for i in range(N)])


def test_the_overlapping_algorithms_are_the_ones_expected():
    assert OVERLAPPING == ["accum-adam", "accum-adamw", "c-ecl", "choco", "choco-amsgrad",
                           "choco-arcs", "dpsgd", "ecd"]


@pytest.mark.parametrize("name", OVERLAPPING)
def test_overlap_gives_the_same_bits(name):
    """Stochastic gradients (the batches drawn in the same order), logs every 4 rounds: every
    record and the final models equal the run that computes gradients after the messages."""
    runs = []
    for overlap in (False, True):
        eng = engine(name, overlap)
        recs = [{k: v for k, v in r.items() if not k.endswith("_s")}
                for r in eng.run(13, log_every=4)]
        runs.append((recs, models(eng)))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])


def test_overlap_prefetches_between_logs_only():
    """Rounds that end in a log, a checkpoint or the run's end draw no gradient ahead: the
    state a record or a checkpoint sees is the round's own."""
    eng = engine("choco", True)
    calls = []
    original = eng.block.prefetch_gradients
    eng.block.prefetch_gradients = lambda name: (calls.append(eng.round + 1), original(name))
    eng.run(9, log_every=4)
    assert calls == [1, 2, 3, 5, 6, 7]  # not 4, 8 (logs) nor 9 (the end)


def test_overlap_resumes_exactly(tmp_path):
    """A checkpointed overlapped run, resumed, ends where the uninterrupted one does."""
    whole = engine("choco", True)
    whole.run(12, log_every=12)
    first = engine("choco", True)
    ckpt = Checkpointer(tmp_path, {"run": "overlap"}, every=5)
    first.run(7, log_every=100, checkpointer=ckpt)
    ckpt.close()
    resumed = engine("choco", True)
    again = Checkpointer(tmp_path, {"run": "overlap"}, every=5)
    assert again.restore(resumed) == 5
    again.close()
    assert resumed.round == 5
    resumed.run(7, log_every=100)
    assert torch.equal(models(resumed), models(whole))


def test_algorithms_that_cannot_overlap_are_refused():
    with pytest.raises(ConfigError, match=r"--overlap: lead changes x after its messages are sent.*"
                                          r"applies to accum-adam, accum-adamw, c-ecl, choco, choco-amsgrad, "
                                          r"choco-arcs, dpsgd, ecd"):
        engine("lead", True)
    with pytest.raises(ConfigError, match="--overlap: choco has no gradients to compute"):
        Engine(make_algorithm("choco"), topologies.build("ring", 4), lambda i: torch.ones(3),
               overlap=True)


class _Lying(Gossip):
    """Gossip with a gradient step after the mix, claiming it leaves x alone."""

    name = "lying"
    trains = True
    overlaps = "next"

    def setup(self, block):
        super().setup(block)
        block.workspace["grad"] = torch.empty_like(block.x)

    def step(self, block):
        g = block.gradients(block.workspace["grad"])
        yield from super().step(block)
        block.x.add_(g, alpha=-0.01)


def test_an_algorithm_that_changes_x_after_sending_is_caught():
    x0 = lambda i: torch.randn(D, generator=generator(init_seed(1, i)), dtype=torch.float64)  # noqa: E731
    eng = Engine(_Lying(), topologies.build("ring", N), x0, dtype=torch.float64, overlap=True,
                 oracles=lambda i, g: PROBLEM.oracle(i, g, "sgd", 2))
    with pytest.raises(NodeError) as exc:
        eng.run(3, log_every=10)
    assert isinstance(exc.value.__cause__, ContractError)
    assert "lying declares overlaps but changed x after its round's messages" in str(exc.value)


def test_link_latency_holds_every_phase_back():
    eng = Engine(make_algorithm("gossip"), topologies.build("ring", 4), lambda i: torch.ones(3),
                 world=World(link_latency=0.03))
    t0 = time.perf_counter()
    eng.run(4, log_every=10)
    assert time.perf_counter() - t0 >= 4 * 0.03
    for bad in (-1.0, float("inf"), "5ms"):
        with pytest.raises(ConfigError, match="link_latency must be a number of seconds >= 0"):
            World(link_latency=bad)
