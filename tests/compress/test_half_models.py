"""Gossip of bfloat16 / float16 models with every kind of compressor: the message's values
travel in the model's dtype and CHOCO-SGD averages as well as it does in float32."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine

SPECS = ["none", "topk:0.1", "randk:0.1", "sign", "sign_l2", "qsgd:4bit",
         "lead:2", "natural", "bf16", "fp16"]


def shrink(spec: str, dtype: torch.dtype, rounds: int = 60) -> tuple[float, int]:
    """Consensus error after ``rounds`` of CHOCO-SGD on a ring of 6, over the start's; bytes sent."""
    engine = Engine(make_algorithm("choco", gamma=0.1), topologies.build("ring", 6),
                    lambda i: torch.randn(200, generator=torch.Generator().manual_seed(i)),
                    compressor=spec, dtype=dtype)
    start = engine.record()["consensus_error"]
    for _ in range(rounds):
        engine.step()
    assert engine.block.x.dtype == dtype
    return engine.record()["consensus_error"] / start, sum(engine.transport.bytes_sent.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec", SPECS)
def test_half_models_average_as_float32_does(spec, dtype):
    half, half_bytes = shrink(spec, dtype)
    full, full_bytes = shrink(spec, torch.float32)
    assert full < 0.2
    assert half <= 1.25 * full + 2e-3, (half, full)  # + bfloat16's rounding floor
    if spec not in ("bf16", "fp16", "sign", "sign_l2", "natural"):  # values in the model's dtype
        assert half_bytes < full_bytes
