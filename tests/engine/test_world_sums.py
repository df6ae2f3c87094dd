"""The running sum's wire buffer (World.ordered_sum under MPI): the values' bytes, then an
8-byte finiteness flag that starts wherever the values end."""

from __future__ import annotations

import pytest
import torch

from gossip.comm.world import _flagged, _unflagged


@pytest.mark.parametrize("dtype,d", [(torch.float32, 7), (torch.float32, 8), (torch.float16, 3),
                                     (torch.bfloat16, 5), (torch.float64, 7)])
@pytest.mark.parametrize("finite", [True, False])
def test_a_flagged_sum_reads_back_whatever_its_size(dtype, d, finite):
    x = torch.arange(d, dtype=torch.float64).to(dtype) / 3
    buf = _flagged(x, finite)
    got = torch.empty_like(buf).copy_(buf)  # a receive buffer of its own, at offset 0
    values, flag = _unflagged(got, x)
    assert torch.equal(values, x) and values.dtype == dtype
    assert flag == (0.0 if finite else 1.0)
