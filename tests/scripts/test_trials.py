"""--seeds / --jobs (repeated trials in processes) and --cost-weights of experiments/optimize.py:
trials run in parallel give the records of the same seeds run one by one; the table gives
mean ± std over them; the flags refuse what they cannot mean."""

from __future__ import annotations

import argparse

import pytest

from gossip.cli.trials import cost_weights, seed_list, spread
from gossip.metrics import read_jsonl
from tests.helpers.launch import script

COMMON = ["--compare", "dgd", "lead", "--nodes", "4", "--dim", "6", "--samples-per-node", "8",
          "--problem", "logistic", "--rounds", "6", "--log-every", "2", "--target", "1e-2",
          "--cost-weights", "comm=1e-3,grad=1", "--no-progress"]


def _strip(records: list[dict]) -> list[dict]:
    """What a run's numbers are: the records without wall times and the flags that differ
    between a trial and a lone run (--out, --seeds, --jobs; the seed is in the records)."""
    out = []
    for rec in records:
        rec = {k: v for k, v in rec.items()
               if not k.endswith(("_s", "_s_per_round")) and k not in ("seed", "seconds_per_round")}
        if "args" in rec:
            rec["args"] = {k: v for k, v in rec["args"].items()
                           if k not in ("out", "seeds", "jobs", "plot", "progress")}
        out.append(rec)
    return out


@pytest.mark.slow  # two spawned processes import torch, then the seeds run again one by one
def test_seeds_in_parallel_give_the_records_of_the_seeds_run_one_by_one(tmp_path, capsys):
    optimize = script("optimize")
    both = tmp_path / "both.jsonl"
    rows = optimize.main([*COMMON, "--seeds", "3,5", "--jobs", "2", "--out", str(both),
                          "--plot", str(tmp_path / "bands.png")])
    table = capsys.readouterr().out
    merged = read_jsonl(both)
    assert sorted({r["seed"] for r in merged}) == [3, 5]
    assert (tmp_path / "bands.png").stat().st_size > 0
    for seed in (3, 5):
        alone = tmp_path / f"alone{seed}.jsonl"
        optimize.main([*COMMON, "--seed", str(seed), "--out", str(alone)])
        mine = [r for r in merged if r["seed"] == seed]
        assert _strip(mine) == _strip(read_jsonl(alone))
        assert all(r["args"]["seed"] == seed for r in mine if r["type"] == "config")
    # the table: per run, the mean over the seeds of the final distance, and the costs
    assert [r["seed"] for r in rows] == [3, 3, 5, 5]
    for label in ("dgd@none", "lead@none"):
        finals = [r["final"] for r in rows if r["run"] == label]
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| {label} |"))
        assert line.split("|")[2].strip() == "2"  # seeds
        assert float(line.split("|")[3].split("±")[0]) == pytest.approx(sum(finals) / 2, rel=1e-2)
    last = [r for r in merged if r["type"] == "round"][-1]
    assert last["cost"] == pytest.approx(1e-3 * last["bits_per_node"] + last["grads_per_node"])


def test_consensus_seeds_one_by_one_in_process_keyed_by_seed(tmp_path, capsys):
    """consensus.py --seeds 0,2 --jobs 1 (the trials in this process): each seed's records are
    those of --seed S alone; the table's final error is their mean."""
    consensus = script("consensus")
    common = ["--compressor", "sign", "--gamma", "0.4", "--rounds", "12", "--nodes", "5",
              "--dim", "8", "--log-every", "4", "--target", "1e-2", "--no-progress"]
    both = tmp_path / "both.jsonl"
    rows = consensus.main([*common, "--seeds", "0,2", "--out", str(both)])
    table = capsys.readouterr().out
    merged = read_jsonl(both)
    for seed in (0, 2):
        alone = tmp_path / f"alone{seed}.jsonl"
        consensus.main([*common, "--seed", str(seed), "--out", str(alone)])
        assert _strip([r for r in merged if r["seed"] == seed]) == _strip(read_jsonl(alone))
    finals = [r["final_rel_error"] for r in rows]
    assert finals[0] != finals[1]  # the seeds draw different vectors
    line = next(ln for ln in table.splitlines() if ln.startswith(f"| {rows[0]['run']} |"))
    assert float(line.split("|")[3].split("±")[0]) == pytest.approx(sum(finals) / 2, rel=1e-2)


def test_seed_lists_and_cost_weights_are_parsed_and_refused():
    assert seed_list("0..3") == [0, 1, 2, 3]
    assert seed_list("0,2,5..6") == [0, 2, 5, 6]
    for bad in ("3..1", "a", "1,1", "-1", "0..2,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)
    assert cost_weights("comm=1e-6,grad=1,prox=1") == {"comm": 1e-6, "grad": 1.0, "prox": 1.0}
    for bad in ("bits=1", "comm", "comm=-1", "comm=nan", "grad=1,grad=2"):
        with pytest.raises(argparse.ArgumentTypeError):
            cost_weights(bad)
    assert spread([1.0, 3.0]) == {"mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0}
    assert spread([1.0, None]) is None


def test_jobs_without_seeds_and_seeds_with_checkpoints_are_refused(tmp_path):
    optimize = script("optimize")
    with pytest.raises(SystemExit, match="--seeds"):
        optimize.main([*COMMON, "--jobs", "2"])
    with pytest.raises(SystemExit, match="--checkpoint-dir"):
        optimize.main([*COMMON, "--seeds", "0..1", "--checkpoint-dir", str(tmp_path)])
