"""experiments/train.py runs read back: records, their comparable part, an interrupted and resumed run."""

from __future__ import annotations

import json

import pytest

from tests.helpers.launch import script


def records(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def comparable(recs):
    """Round records without timings and process-layout fields."""
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k not in ("args", "world_size")}
            for r in recs if r["type"] == "round"]


def interrupted_and_resumed(tmp_path, monkeypatch, args: list[str], crash_round: int = 9):
    """train.py run straight through, and run again stopped at ``crash_round`` (checkpoints every
    3 rounds) then resumed: the round records of both, comparable."""
    from gossip.training import DecentralizedTrainer

    train = script("train")
    full, cut, ck = tmp_path / "full.jsonl", tmp_path / "cut.jsonl", tmp_path / "ck"
    train.main([*args, "--out", str(full)])
    original = DecentralizedTrainer.metrics

    def crash(self, engine, xbar):
        if engine.round == crash_round:
            raise KeyboardInterrupt
        return original(self, engine, xbar)

    monkeypatch.setattr(DecentralizedTrainer, "metrics", crash)
    with pytest.raises(KeyboardInterrupt):
        train.main([*args, "--out", str(cut), "--checkpoint-dir", str(ck), "--checkpoint-every", "3"])
    monkeypatch.undo()
    train.main([*args, "--out", str(cut), "--resume", str(ck)])
    return comparable(records(full)), comparable(records(cut))
