"""The one dispatcher of the compressors' code paths (:mod:`gossip.compress.dispatch`): its
switches and thresholds decide every path (the paths' bytes: test_kernels.py, test_jit.py,
test_compress_host.py, test_fused.py)."""

from __future__ import annotations

import pytest
import torch

from gossip.compress import dispatch, make, reference_kernels


def test_reference_kernels_turns_every_fast_path_off_and_restores_them():
    comp = make("topk:0.1")
    X = torch.randn(3, 100)
    plan = comp.plan(X[0])
    assert dispatch.host_encode(comp, plan) and dispatch.numpy_path(X.device)
    assert dispatch.block_kernel(comp._fast_encode_rows, X.dtype, comp.fast_dtypes) is not None
    with pytest.raises(RuntimeError), reference_kernels():
        assert not dispatch.host_encode(comp, plan) and not dispatch.host_tensor(X[0])
        assert not dispatch.host_decode(comp, X)
        assert dispatch.block_kernel(comp._fast_encode_rows, X.dtype, comp.fast_dtypes) is None
        raise RuntimeError  # the switches come back on the way out of an error too
    assert dispatch.host_encode(comp, plan) and not dispatch.REFERENCE and dispatch.NUMPY


def test_block_kernels_serve_only_their_dtypes():
    comp = make("topk:0.1")
    assert dispatch.block_kernel(comp._fast_encode_rows, torch.float16, comp.fast_dtypes) is None
    assert dispatch.block_kernel(None) is None


def test_thresholds_decide_the_long_row_paths(monkeypatch):
    d = dispatch.LOOP_FROM
    assert dispatch.loop_rows(d) and not dispatch.loop_rows(d - 1)
    assert dispatch.batch_encode(torch.zeros(2, d - 1)) and not dispatch.batch_encode(torch.zeros(2, d))
    assert not dispatch.batch_encode(torch.zeros(1, 8))  # a single row: the per-row loop
    assert dispatch.loop_decode(torch.zeros(2, d)) and not dispatch.loop_decode(torch.zeros(2, d - 1))
    assert dispatch.table_decode(dispatch.TABLE_FROM + 1) and not dispatch.table_decode(dispatch.TABLE_FROM)
    monkeypatch.setattr(dispatch, "LOOP_FROM", 1 << 40)  # one constant moves every such choice
    assert dispatch.batch_encode(torch.zeros(2, d)) and not dispatch.loop_decode(torch.zeros(2, d))


def test_jit_kernels_serve_long_messages_with_the_switch_on(monkeypatch):
    if dispatch.jit_kernel("mix") is None:
        pytest.skip("numba is not installed")
    assert dispatch.jit_kernel("sign_bits", dispatch.JIT_FROM) is not None
    assert dispatch.jit_kernel("sign_bits", dispatch.JIT_FROM - 1) is None
    assert dispatch.topk_rows_kernel(1, 16) is not None and dispatch.topk_rows_kernel(2, 16) is None
    out = torch.zeros(2, 64)
    assert dispatch.fused_mix(out) and not dispatch.fused_mix(out.double().t())
    monkeypatch.setattr(dispatch, "JIT", False)
    assert dispatch.jit_kernel("sign_bits", 1 << 20) is None and not dispatch.fused_mix(out)
