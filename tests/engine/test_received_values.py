"""Received messages with values no sender produces are refused, naming the sender."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.compress import bits, dispatch, make
from gossip.engine import Engine
from gossip.errors import CompressionError, DivergenceError
from gossip.layout import Layout

SPECS = ["none", "fp16", "bf16", "topk:4", "randk:0.5", "sign", "qsgd:4bit", "lead:2", "lowrank:1"]


def message(spec: str, like: torch.Tensor) -> tuple[torch.Tensor, list]:
    comp = make(spec)
    gen = torch.Generator()
    gen.manual_seed(0)
    buf = comp.encode(torch.randn(like.shape, generator=gen, dtype=like.dtype), gen).to_bytes().clone()
    return buf, comp.plan(like).slots


def altered(buf: torch.Tensor, a: int, b: int, dt: torch.dtype, value) -> torch.Tensor:
    out = buf.clone()
    out[a:b].view(dt)[0] = value
    return out


@pytest.mark.parametrize("host", [True, False])
@pytest.mark.parametrize("spec", SPECS)
def test_nan_inf_negative_scales_and_bad_codes_are_refused(spec, host, monkeypatch):
    monkeypatch.setattr(dispatch, "NUMPY", host)
    like = torch.zeros(6, 5)
    comp = make(spec)
    buf, slots = message(spec, like)
    comp.from_bytes(buf, like)  # the intact message is accepted
    refused = 0
    for name, a, b, _, dt in slots:
        if dt.is_floating_point:
            for bad in (math.nan, math.inf, -math.inf):
                with pytest.raises(CompressionError, match=f"{name} contain NaN/Inf"):
                    comp.from_bytes(altered(buf, a, b, dt, bad), like)
                refused += 1
        if name in comp.scale_sections:
            with pytest.raises(CompressionError, match=f"{name} is negative"):
                comp.from_bytes(altered(buf, a, b, dt, -1.0), like)
            refused += 1
        if name == "codes":  # every bit set: code 2^w - 1, past the 2s + 1 levels
            bad = buf.clone()
            bad[a:b] = 255
            with pytest.raises(CompressionError, match="outside the .* levels"):
                comp.from_bytes(bad, like)
            refused += 1
    assert refused >= 3


def test_per_tensor_messages_are_checked_too():
    layout = Layout([(4, 3), (5,)])
    comp = make("none", layout=layout)
    x = torch.arange(17, dtype=torch.float32)
    buf = comp.encode(x).to_bytes().clone()
    pos = buf.view(torch.uint8).numpy().tobytes().find(torch.tensor([7.0]).numpy().tobytes())
    buf[pos : pos + 4].view(torch.float32)[0] = math.nan
    with pytest.raises(CompressionError, match="NaN/Inf"):
        comp.from_bytes(buf, torch.zeros(17))


def test_a_nan_message_names_its_sender_not_the_receivers_step():
    """A block validates what other processes sent (its own rows were checked when encoded):
    node 2 lives elsewhere and sends NaN; the error names it and the receiver, node 1."""
    from types import SimpleNamespace

    from gossip.core.block import Block
    from gossip.core.routing import MixPlan
    from gossip.errors import RowsError

    topo = topologies.build("ring", 4)
    ids = [0, 1, 3]
    nodes = [SimpleNamespace(id=i, state={}) for i in ids]
    comp = make("none")
    block = Block(nodes, torch.ones(3, 8, dtype=torch.float64), comp, lambda: make("none"))
    block.begin_round(1, MixPlan.build(topo, ids, lambda j: j in ids, torch.device("cpu")))
    rows = block.encode(block.x)
    assert [(j, i) for j, i, _ in block.plan.remote_in] == [(2, 1), (2, 3)]
    bad = comp.encode(torch.ones(8, dtype=torch.float64)).to_bytes().clone()
    bad[8:16].view(torch.float64).fill_(math.nan)
    rows.received().copy_(bad.expand(2, -1))
    with pytest.raises(RowsError, match=r"message from node 2 to node 1 was refused: none: the "
                                        r"message's values contain NaN/Inf") as info:
        block.check_received(rows)
    assert (info.value.sender, info.value.receiver) == (2, 1)


@pytest.mark.parametrize("bad_value", [math.nan, math.inf])
def test_long_dense_rows_are_checked_by_the_mix(bad_value):
    """Long dense rows mixed by the fused kernel: the receive check waits for the mix, which
    runs it when a result is not finite; the error still names the sender and the receiver."""
    from types import SimpleNamespace

    from gossip.compress import fused
    from gossip.compress.dispatch import LOOP_FROM
    from gossip.core.block import Block
    from gossip.core.routing import MixPlan
    from gossip.errors import RowsError

    if fused.kernel() is None:
        pytest.skip("numba is not installed")
    d = LOOP_FROM
    topo = topologies.build("ring", 4)
    ids = [0, 1, 3]
    nodes = [SimpleNamespace(id=i, state={}) for i in ids]
    comp = make("none")
    block = Block(nodes, None, comp, lambda: make("none"))
    block.x = block.message_tensor(d, torch.float32, torch.device("cpu"))
    block.x.fill_(1.0)
    block.begin_round(1, MixPlan.build(topo, ids, lambda j: j in ids, torch.device("cpu")))
    rows = block.encode(block.x)
    good = comp.encode(torch.ones(d)).to_bytes().clone()
    rows.received().copy_(good.expand(2, -1))
    block.check_received(rows)
    assert rows.pending is not None  # deferred to the mix
    out = torch.empty(3, d)
    block.mix_into(out, rows, rows, add=False)
    assert rows.pending is None and torch.equal(out, torch.ones(3, d))
    rows.received()[0, 8 + 4 * 100 : 8 + 4 * 101].view(torch.float32).fill_(bad_value)
    block.check_received(rows)
    with pytest.raises(RowsError, match=r"message from node 2 to node 1 was refused: none: the "
                                        r"message's values contain NaN/Inf"):
        block.mix_into(out, rows, rows, add=False)


@pytest.mark.parametrize(("bad_row", "sender"), [(0, 0), (1, 2)])
@pytest.mark.parametrize("bad_value", [math.nan, math.inf])
def test_one_node_per_process_is_checked_by_the_mix(bad_value, bad_row, sender):
    """A block of one node (one per process, as under MPI) with rows of JIT_FROM entries, too
    short for the long-row path: the fused kernel mixes them too, the receive check waits for
    it, and a NaN/Inf from a neighbor is still refused naming the sender and the receiver
    (round 2, after round 1's model was sent again without a pass of its own)."""
    from types import SimpleNamespace

    from gossip.compress import fused
    from gossip.compress.dispatch import JIT_FROM, LOOP_FROM
    from gossip.core.block import Block
    from gossip.core.routing import MixPlan
    from gossip.errors import RowsError

    if fused.kernel() is None:
        pytest.skip("numba is not installed")
    d = JIT_FROM
    assert d < LOOP_FROM
    topo = topologies.build("ring", 4)
    comp = make("none")
    block = Block([SimpleNamespace(id=1, state={})], None, comp, lambda: make("none"))
    block.x = block.message_tensor(d, torch.float32, torch.device("cpu"))
    block.x.fill_(1.0)
    plan = MixPlan.build(topo, [1], lambda j: j == 1, torch.device("cpu"))
    for t in (1, 2):  # received row 0 is node 0's message, row 1 node 2's
        block.begin_round(t, plan)
        rows = block.encode(block.x)
        rows.received().copy_(comp.encode(torch.ones(d)).to_bytes().expand(2, -1))
        if t == 2:
            rows.received()[bad_row, 8 + 4 * 100 : 8 + 4 * 101].view(torch.float32).fill_(bad_value)
        block.check_received(rows)
        assert rows.pending is not None  # deferred to the mix
        if t == 1:
            block.mix_into(block.x, rows, rows, own_weight=block.self_weight - 1.0, alpha=1.0)
            assert rows.pending is None and torch.equal(block.x, torch.ones(1, d))
    with pytest.raises(RowsError, match=rf"message from node {sender} to node 1 was refused: "
                                        r"none: the message's values contain NaN/Inf"):
        block.mix_into(block.x, rows, rows, own_weight=block.self_weight - 1.0, alpha=1.0)


def test_nan_in_a_model_names_the_node():
    topo = topologies.build("ring", 4)
    engine = Engine(make_algorithm("choco", gamma=0.5), topo, lambda i: torch.ones(8) * i,
                    compressor="none", dtype=torch.float64)
    engine.nodes[2].x[0] = math.nan
    with pytest.raises(DivergenceError, match=r"node 2 \(rank 0\) has NaN/Inf in x"):
        engine.step()


@pytest.mark.parametrize("spec", ["none", "topk:4", "randk:0.5", "lead:2"])
def test_decoding_huge_values_raises_no_numpy_warning(spec):
    comp = make(spec)
    gen = torch.Generator()
    gen.manual_seed(0)
    payload = comp.from_bytes(comp.encode(torch.full((16,), 3e38), gen).to_bytes(), torch.zeros(16))
    out = torch.full((16,), 3e38)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp.decode_add_(out, payload, 2.0)
    assert not bool(torch.isfinite(out).all())  # the overflow is there, for divergence checks


@pytest.mark.parametrize("spec", ["qsgd:4bit", "lead:2", "qsgd:s=10"])
def test_code_range_check_on_packed_planes(spec):
    """Long messages are checked on the packed bit planes; the last partial byte exactly."""
    import numpy as np

    comp = make(spec)
    lo, hi = comp.offset - comp.s, comp.offset + comp.s
    rng = np.random.default_rng(0)
    for d in (70_000, 70_005):
        codes = rng.integers(lo, hi + 1, d).astype(bits.host_code_dtype(comp.width))
        for where, bad in ((None, None), (5, lo - 1), (d // 2, hi + 1), (d - 1, (1 << comp.width) - 1)):
            c = codes.copy()
            if where is not None:
                c[where] = bad
            packed = np.zeros(bits.packed_nbytes(d, comp.width), dtype=np.uint8)
            bits.pack_codes_np(c, comp.width, packed, comp.ws)
            assert bits.codes_within_np(packed, d, comp.width, lo, hi, comp.ws) == (where is None)
