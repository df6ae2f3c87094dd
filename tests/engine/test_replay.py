"""The replay of a static round (Engine's StaticRound): taken when a dense round repeats, the
same bits and bytes as the generic round, and left for the generic round when a guard changes."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.compress import dispatch
from gossip.core.algorithm import Algorithm
from gossip.core.channel import Channel
from gossip.engine import Engine
from gossip.engine import engine as engine_module
from gossip.errors import ContractError, DivergenceError, NodeError

D = 96


@pytest.fixture(autouse=True)
def _dense_kernel_rows(monkeypatch):
    """Short rows mixed by the dense kernel, as long ones are (the replay needs its call)."""
    if dispatch.jit_kernel("mix") is None:
        pytest.skip("the dense mix kernel needs numba")
    monkeypatch.setattr(dispatch, "LOOP_FROM", 64)


@pytest.fixture
def replays(monkeypatch):
    """The rounds each engine ran from its StaticRound (by id of the engine)."""
    counts: dict[int, int] = {}
    original = engine_module.Engine._replay

    def spy(self, static):
        ran = original(self, static)
        if ran and self._static is static:  # replayed to its end, the record kept
            counts[id(self)] = counts.get(id(self), 0) + 1
        return ran

    monkeypatch.setattr(engine_module.Engine, "_replay", spy)
    return counts


def _engine(alg: str = "gossip", **kw) -> Engine:
    return Engine(make_algorithm(alg, **kw), topologies.build("ring", 4),
                  lambda i: torch.randn(D, generator=torch.Generator().manual_seed(i)),
                  compressor="none", dtype=torch.float32)


def _generic_step(eng: Engine) -> None:
    """A round the generic way (the record of the last one dropped)."""
    eng._static = None
    eng.step()


def _same(a: Engine, b: Engine) -> None:
    assert torch.equal(a.block.x, b.block.x)
    assert a.transport.bytes_sent == b.transport.bytes_sent
    assert a.round == b.round


@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_a_repeated_dense_round_is_replayed_with_the_generic_rounds_bits(replays, gamma):
    fast, generic = _engine(gamma=gamma), _engine(gamma=gamma)
    for _ in range(8):
        fast.step()
        _generic_step(generic)
    assert replays.get(id(fast), 0) >= 5  # from round 3 on (two rounds make the record)
    assert id(generic) not in replays
    _same(fast, generic)
    assert fast.record()["bits_per_node"] == generic.record()["bits_per_node"]


@pytest.mark.parametrize("change", ["x changed", "x replaced", "latency", "reference kernels",
                                    "x requires grad"])
def test_a_changed_guard_leaves_the_replay_for_the_generic_round(replays, change):
    fast, generic = _engine(), _engine()
    for _ in range(4):
        fast.step()
        _generic_step(generic)
    before = replays.get(id(fast), 0)
    assert before >= 1 and fast._static is not None
    for eng in (fast, generic):
        if change == "x changed":
            eng.block.x.mul_(0.5)
        elif change == "x replaced":  # another memory under the same tensor object
            eng.block.x.data = eng.block.x.clone()
        elif change == "latency":
            eng.transport.latency = 1e-6
        elif change == "x requires grad":
            eng.block.x.requires_grad_(True)
    with dispatch.reference_kernels() if change == "reference kernels" else _nothing():
        fast.step()
        # the generic round ran; a model changed in place (finite: one sum says so) is
        # still sent from its memory, so that round replays
        assert replays.get(id(fast), 0) == before + (change == "x changed")
        _generic_step(generic)
        _same(fast, generic)
        for _ in range(3):
            fast.step()
            _generic_step(generic)
    _same(fast, generic)
    if change == "x changed":  # recorded again once the rounds repeat
        assert replays[id(fast)] > before


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_a_fault_added_to_the_network_stops_the_replay(replays):
    from gossip.network.noise import ChannelNoise

    fast = _engine()
    for _ in range(4):
        fast.step()
    before = replays[id(fast)]
    fast.network.noise = ChannelNoise.__new__(ChannelNoise)  # any round hook at all
    assert not fast.network.quiet
    fast._step = lambda prefetch: fast._replay(fast._static)  # what step() would try first
    assert fast.step() is False and fast._static is None
    assert replays[id(fast)] == before


class _ChangesXAfterRound(Algorithm):
    """Gossip whose round 5 changes x between its send and its mix (refused: the message is
    read from x's own memory)."""

    name = "changes-x-after-round"

    def setup(self, block):
        block.workspace["ch"] = Channel(block, "x")
        block.workspace["w"] = block.plan.self_weight - 1.0  # (a static graph's, once)

    def step(self, block):
        inbox = yield block.workspace["ch"].send(block.x)
        if block.round == 5:
            block.x.add_(1.0)
        block.workspace["ch"].mix(inbox, into=(None, block.x), alpha=1.0,
                                  own_weight=block.workspace["w"])


def test_a_model_changed_between_send_and_mix_is_refused_in_a_replayed_round(replays):
    eng = Engine(_ChangesXAfterRound(), topologies.build("ring", 4), lambda i: torch.ones(D) * i,
                 compressor="none", dtype=torch.float32)
    for _ in range(4):
        eng.step()
    assert replays.get(id(eng), 0) >= 1
    with pytest.raises((ContractError, NodeError), match="changed after its message was sent"):
        eng.step()


def _dpsgd(problem) -> Engine:
    return Engine(make_algorithm("dpsgd", eta=0.1), topologies.build("ring", 4),
                  lambda i: torch.randn(D, generator=torch.Generator().manual_seed(i)),
                  compressor="none", dtype=torch.float32,
                  oracles=lambda i, gen: problem.oracle(i, gen))


def test_dpsgd_whose_step_changes_x_after_the_mix_is_replayed_with_the_generic_bits(replays):
    """The local step changes x after the kernel found it finite: the send checks it with one
    sum and still goes out from x's memory, so the round repeats; a model whose sum overflows
    (every entry finite) or that holds a NaN goes the compressor's way (the same bits, the
    same error as the generic round)."""
    from gossip.problems.consensus import Consensus

    problem = Consensus(torch.randn(4, D, generator=torch.Generator().manual_seed(9)),
                        dtype=torch.float32)
    fast, generic = _dpsgd(problem), _dpsgd(problem)
    for _ in range(8):
        fast.step()
        _generic_step(generic)
    assert replays.get(id(fast), 0) >= 5
    _same(fast, generic)
    before = replays[id(fast)]
    for eng in (fast, generic):  # finite entries, a sum that overflows float32
        eng.block.x.fill_(3e38)
    fast.step()
    _generic_step(generic)
    _same(fast, generic)
    assert replays[id(fast)] == before  # that send was the compressor's
    for eng in (fast, generic):
        eng.block.x[0, 3] = float("nan")
    errors = []
    for eng in (fast, generic):
        with pytest.raises((NodeError, DivergenceError)) as info:
            eng.step()
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "NaN" in errors[0]
