"""The block engine and block messages on CUDA against the CPU (skipped without a CUDA device).

tests/compress/test_compress.py::test_cuda_roundtrip already checks single ``encode`` bytes on CUDA;
here: ``encode_rows`` blocks (bytes and decode), in-process block-engine runs (CHOCO top-k and
gossip with ``none``, float64) with the whole block on the device, the bytes they count, and
``experiments/consensus.py --device cuda``.

Elementwise updates on the GPU may be contracted into fused multiply-adds where the CPU rounds
twice, so models are compared to 1e-12 relative (a mismatch in a selection or a message would
show as O(1)); byte counts and message bytes must be equal.

``GOSSIP_CUDA_TEST_DEVICE=cpu pytest tests/engine/test_cuda.py`` runs the same comparisons with the
CPU as the "device" (the compressors' torch code path against the numpy fast path), which
checks the tests themselves on a machine without a GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.compress import dispatch, make
from gossip.engine import Engine
from gossip.layout import Layout

DEVICE = torch.device(os.environ.get("GOSSIP_CUDA_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(),
                                reason="no CUDA device")

ROOT = Path(__file__).resolve().parents[2]
DETERMINISTIC = ["none", "fp16", "bf16", "topk:0.1", "topk:5"]
"""No randomness and no floating reduction on the wire: the same bytes on every device."""
REDUCING = ["sign", "sign_l2", "qsgd:4"]
"""Deterministic given the randomness, but the scale is a floating sum (device order)."""


@pytest.fixture
def on_device():
    """Make CPU tensors take the torch code path when DEVICE is the CPU (what CUDA runs)."""
    saved = dispatch.NUMPY
    if DEVICE.type == "cpu":
        dispatch.NUMPY = False
    yield DEVICE
    dispatch.NUMPY = saved


def block(m: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(m, d, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(dtype)


def decoded(spec: str, msgs: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    return make(spec).decode_add_rows_(out, msgs, torch.full((like.shape[0],), 0.5,
                                                             dtype=torch.float64, device=like.device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spec", DETERMINISTIC)
def test_encode_rows_bytes_equal_cpu(spec, dtype, on_device):
    X = block(8, 1000, dtype)
    ref = make(spec).encode_rows(X)
    got = make(spec).encode_rows(X.to(on_device))
    assert got.device.type == on_device.type
    assert torch.equal(got.cpu(), ref)
    assert torch.equal(decoded(spec, got, X.to(on_device)).cpu(), decoded(spec, ref, X))


@pytest.mark.parametrize("spec", REDUCING)
def test_reducing_compressors_decode_device_bytes_identically_on_cpu(spec, on_device):
    """Bytes may differ from the CPU's in the scale, but the device's bytes mean the same
    values wherever they are decoded."""
    X = block(8, 1000, torch.float32).to(on_device)
    gens = [torch.Generator(on_device).manual_seed(r) for r in range(8)]
    msgs = [make(spec).encode(X[r], gens[r]).to_bytes() for r in range(8)]
    comp = make(spec)
    for r in range(8):
        here = comp.decode(comp.from_bytes(msgs[r], X[r]))
        there = comp.decode(comp.from_bytes(msgs[r].cpu(), X[r].cpu()))
        assert torch.equal(here.cpu(), there)


def run(alg: str, hp: dict, spec: str, device: torch.device, rounds: int = 30) -> Engine:
    x0 = {i: torch.randn(64, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
          for i in range(6)}
    layout = Layout([(8, 8)]) if alg == "powergossip" else None  # one 8×8 matrix: per-arc sketches
    eng = Engine(make_algorithm(alg, **hp), topologies.build("ring", 6), x0, compressor=spec,
                 device=device, dtype=torch.float64, layout=layout)
    for _ in range(rounds):
        eng.step()
    return eng


@pytest.mark.parametrize(("alg", "hp", "spec"), [("choco", {"gamma": 0.1}, "topk:0.1"),
                                                 ("gossip", {}, "none"),
                                                 ("powergossip", {"rank": 2}, "none")])
def test_block_engine_on_device_equals_cpu(alg, hp, spec, on_device):
    cpu = run(alg, hp, spec, torch.device("cpu"))
    dev = run(alg, hp, spec, on_device)
    assert dev.block is not None and dev.block.x.device.type == on_device.type
    assert all(nd.x.device.type == on_device.type for nd in dev.nodes.values())
    x_cpu, x_dev = cpu.block.x, dev.block.x.cpu()
    scale = float(x_cpu.abs().max())
    assert float((x_cpu - x_dev).abs().max()) <= 1e-12 * scale
    assert list(dev.bytes_sent()) == list(cpu.bytes_sent())
    assert dev.record()["consensus_error"] == pytest.approx(cpu.record()["consensus_error"],
                                                            rel=1e-9, abs=1e-300)


def test_consensus_script_device(on_device):
    """experiments/consensus.py --device DEVICE runs its block on the device, same numbers."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import consensus
    finally:
        sys.path.pop(0)
    argv = ["--nodes", "6", "--dim", "50", "--rounds", "20", "--log-every", "5",
            "--compressor", "topk:0.1", "--gamma", "0.1", "--dtype", "float64"]
    cpu = consensus.main(argv + ["--device", "cpu"])
    dev = consensus.main(argv + ["--device", str(on_device)])
    assert dev[0]["status"] == cpu[0]["status"]
    assert dev[0]["final_rel_error"] == pytest.approx(cpu[0]["final_rel_error"], rel=1e-9)
