"""How an asynchronous message travels between processes (gossip/network/frames.py: frame,
unframe): the synchronous path's wire header on each floating part, and the same checks."""

from __future__ import annotations

import math

import pytest
import torch

from gossip.errors import DivergenceError, RowsError
from gossip.network.frames import frame, framed_nbytes, unframe

PARTS = (torch.linspace(-1, 1, 5, dtype=torch.float64), torch.ones(1, dtype=torch.float32))


def test_frames_carry_each_floating_part_with_its_header_and_give_it_back():
    buf = frame(PARTS)
    assert buf.numel() == framed_nbytes(PARTS) == (8 + 40) + (8 + 4)
    assert buf[0] == 0xC5 and buf[48] == 0xC5  # the wire magic of each part
    got = unframe(buf, PARTS, "here", 1, 0)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, PARTS))
    PARTS[0].add_(1)  # the frame is its own memory: a model that moves on does not change it
    assert torch.equal(unframe(buf, PARTS, "here", 1, 0)[0], PARTS[0] - 1)
    PARTS[0].sub_(1)
    raw = (torch.arange(6, dtype=torch.uint8),)  # a compressor's message travels as it is
    assert torch.equal(unframe(frame(raw), raw, "here", 1, 0)[0], raw[0])


def _nan(buf):
    out = buf.clone()
    out[8:16].view(torch.float64)[0] = math.nan
    return out


def _header(buf):
    out = buf.clone()
    out[48 + 1] = 0x12  # the second part's dtype code: float32 -> float64
    return out


@pytest.mark.parametrize(("alter", "needle"), [
    (lambda b: b[:30], "truncated"),
    (lambda b: torch.cat([b, torch.zeros(8, dtype=torch.uint8)]), "extended"),
    (_nan, "NaN/Inf"),
    (_header, "carries torch.float64 values"),
])
def test_what_no_honest_sender_sends_is_refused_naming_it(alter, needle):
    with pytest.raises(RowsError, match=f"node 0 refused node 3: none: .*{needle}") as exc:
        unframe(alter(frame(PARTS)), PARTS, "node 0 refused node 3", 3, 0)
    assert (exc.value.sender, exc.value.receiver) == (3, 0)
    raw = (torch.zeros(6, dtype=torch.uint8),)
    with pytest.raises(RowsError, match="part 0 holds 7 bytes, expected 6"):
        unframe(torch.zeros(7, dtype=torch.uint8), raw, "here", 3, 0)


def test_a_node_whose_model_diverged_names_itself_instead_of_sending():
    with pytest.raises(DivergenceError, match="node 2 .*has NaN/Inf in the message it would send"):
        frame((torch.tensor([1.0, math.inf]),), "node 2 (rank 2)")
