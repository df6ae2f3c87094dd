"""Run labels name what differs between runs: the algorithm, what it sends (compressor, or an
all-reduce method's codec) and every --hparam, so two different runs never share a label."""

from __future__ import annotations

import json

from gossip.cli import run_label
from tests.helpers.launch import run_py


def test_run_label_names_the_wire_and_the_hparams():
    assert run_label("choco", "topk:0.01", {}) == "choco@topk:0.01"
    assert run_label("onebit-adam", "sign_l1", {"codec": "sign_l1", "freeze_step": 20}) \
        == "onebit-adam@sign_l1 freeze_step=20"
    assert run_label("dpsgd", None, {"byzantine": [1, 5], "eps": 1e-4}, sep=" ") \
        == "dpsgd byzantine=1,5 eps=0.0001"


def test_optimize_labels_two_codecs_apart(tmp_path):
    labels = []
    for codec in ("none", "sign_l2"):
        out = tmp_path / f"{codec}.jsonl"
        res = run_py(["experiments/optimize.py", "--algorithm", "onebit-adam", "--topology",
                      "complete", "--nodes", "4", "--dim", "8", "--iterations", "3",
                      "--hparam", f"codec={codec}", "--out", str(out)])
        assert res.returncode == 0, res.stderr
        records = [json.loads(line) for line in out.read_text().splitlines()]
        labels.append({r["label"] for r in records})
        assert f"| onebit-adam@{codec} |" in res.stdout
    assert labels[0] and labels[1] and not labels[0] & labels[1]
