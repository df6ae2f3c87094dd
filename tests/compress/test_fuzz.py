"""Hostile bytes: random and mutated buffers never crash a parser, hang, or decode wrongly.

Every compressor's ``from_bytes`` gets 10,000 buffers (random bytes of random lengths, valid
messages with flipped bytes, truncations, extensions and header mutations). Each must end in a
:class:`CompressionError` or a payload that decodes to a tensor of the receiver's shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossip.compress import make
from gossip.errors import CompressionError
from gossip.layout import Layout

SPECS = ["none", "fp16", "bf16", "topk:0.1", "topk:3", "randk:0.2", "randk:0.2:unbiased", "sign",
         "qsgd:4bit", "qsgd:s=16:biased", "lead:2", "natural", "lowrank:2"]
CASES = 10_000


def mutations(valid: bytes, rng: np.random.Generator, limit: int):
    """Yield ``CASES`` hostile buffers derived from ``valid``."""
    n = len(valid)
    for case in range(CASES):
        kind = case % 5
        if kind == 0:  # random bytes, random length
            yield rng.integers(0, 256, int(rng.integers(0, 2 * n + 16)), dtype=np.uint8)
        elif kind == 1:  # a few flipped bytes
            buf = np.frombuffer(valid, dtype=np.uint8).copy()
            pos = rng.integers(0, n, int(rng.integers(1, 5)))
            buf[pos] = rng.integers(0, 256, pos.size, dtype=np.uint8)
            yield buf
        elif kind == 2:  # truncated
            yield np.frombuffer(valid[: int(rng.integers(0, n))], dtype=np.uint8).copy()
        elif kind == 3:  # extended
            extra = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8)
            yield np.concatenate([np.frombuffer(valid, dtype=np.uint8), extra])
        else:  # header bytes mutated, body intact
            buf = np.frombuffer(valid, dtype=np.uint8).copy()
            buf[int(rng.integers(0, min(8, n)))] = rng.integers(0, 256)
            yield buf
    assert limit >= n


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("layout", [False, True])
def test_parsers_survive_hostile_bytes(spec, layout):
    shape = (6, 5)
    lay = Layout([shape, (7,)]) if layout else None
    like = torch.zeros(37 if layout else 30, dtype=torch.float32)
    if not layout:
        like = like.view(shape)
    comp = make(spec, layout=lay)
    gen = torch.Generator()
    gen.manual_seed(0)
    valid = comp.encode(torch.randn(like.shape, generator=gen), gen).to_bytes().numpy().tobytes()
    limit = comp.max_nbytes(like)
    rng = np.random.default_rng(hash(spec) % 2**32)
    accepted = 0
    for buf in mutations(valid, rng, limit):
        try:
            payload = comp.from_bytes(torch.from_numpy(buf), like)
        except CompressionError:
            continue
        out = comp.decode(payload)
        assert out.shape == like.shape and out.dtype == like.dtype
        assert buf.size <= limit
        accepted += 1
    assert accepted < CASES  # most mutations are caught


def test_packed_messages_survive_hostile_bytes():
    """A block's packed phase (a header, then two compressed parts) received with mutated
    bytes: the check refuses it, or each part decodes to a tensor of the receiver's shape."""
    from types import SimpleNamespace

    import topologies
    from gossip.core.block import Block
    from gossip.core.routing import MixPlan

    topo = topologies.build("ring", 4)
    ids = [0, 1]
    block = Block([SimpleNamespace(id=i) for i in ids], torch.zeros(2, 10), make("topk:3"),
                  lambda: make("qsgd:4bit"))
    block.begin_round(1, MixPlan.build(topo, ids, lambda j: j in ids, torch.device("cpu")))
    X, Y = torch.randn(2, 10, generator=torch.Generator().manual_seed(1)), torch.randn(2, 7)
    msg = block.pack([block.encode(X), block.encode(Y, block.stream_compressor("y"))])
    a, b = msg.parts
    valid = msg.mine()[0].numpy().tobytes()
    remote = msg.received()
    rng = np.random.default_rng(1)
    accepted = 0
    for buf in mutations(valid, rng, len(valid)):
        if buf.size != len(valid):  # the transport refuses a row of another length
            continue
        remote.copy_(torch.from_numpy(buf).expand_as(remote))
        try:
            block.check_received(msg)
        except CompressionError:
            continue
        accepted += 1
        for part in (a, b):
            got = part.compressor.decode(part.compressor.from_bytes(part.received()[0].clone(),
                                                                    part.like))
            assert got.shape == part.like.shape
    assert accepted < CASES
