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


def test_consensus_takes_hparams_and_runs_the_per_arc_form_under_loss(tmp_path):
    """``consensus.py --hparam arcs=true`` runs the method's per-arc form (exact under loss,
    where the plain form's copies drift apart), labelled apart from the plain form; an unknown
    key or a method without that form is one error line."""
    out = tmp_path / "arcs.jsonl"
    base = ["experiments/consensus.py", "--algorithm", "choco", "--compressor", "topk:0.5",
            "--network", "loss=0.1", "--nodes", "8", "--dim", "6", "--rounds", "300"]
    res = run_py([*base, "--hparam", "arcs=true", "--out", str(out)])
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    config = next(r for r in records if r["type"] == "config")
    last = [r for r in records if r["type"] == "round"][-1]
    assert config["args"]["hparam"] == ["arcs=true"] and "arcs=True" in last["label"]
    assert last["messages_lost_total"] > 0 and last["consensus_error_rel"] < 1e-12
    plain = run_py([*base, "--out", str(tmp_path / "plain.jsonl")])
    assert plain.returncode == 0, plain.stderr
    records = [json.loads(line) for line in (tmp_path / "plain.jsonl").read_text().splitlines()]
    assert [r for r in records if r["type"] == "round"][-1]["consensus_error_rel"] > 1e-6
    for bad in (["--hparam", "nosuch=1"], ["--algorithm", "gossip", "--hparam", "arcs=true"]):
        res = run_py([*base, *bad])
        assert res.returncode == 2 and res.stderr.startswith("error:"), res.stderr
