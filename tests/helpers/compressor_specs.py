"""The compressor specs the compress tests sweep: one per registered form, plus wire variants."""

from __future__ import annotations

import re

from gossip.compress import available


def concrete_specs() -> list[str]:
    """One spec per registered form (placeholders filled), plus the top-k wire variants."""
    fill = {"RATIO": "0.1", "K": "3", "BITS": "4", "LEVELS": "3", "RANK": "2"}
    out = []
    for form in available():
        out.append(re.sub(r"[A-Z]+", lambda mt: fill[mt.group()], form))
    return out + ["topk:0.5", "topk:0.01", "qsgd:12", "lead:8"]
