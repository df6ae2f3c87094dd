"""The adaptive methods through the scripts: logs, checkpoints, and the headline behaviours.

Headline checks (each a few seconds on two cores):
* 1-bit Adam on the shipped digits data ends within 2 % of all-reduce Adam's test loss with at
  least 4x fewer bits;
* Signum with majority vote keeps descending with 1 of 8 sign-flipping workers;
* on heterogeneous least squares, tracked AMSGrad reaches the optimum where DADAM stays biased.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.launch import script
from tests.helpers.train_runs import interrupted_and_resumed, records

DIGITS = ["--topology", "complete", "--nodes", "8", "--partition", "iid", "--eval-every", "30",
          "--epochs", "30", "--lr", "0.003"]


def _last(path):
    return [r for r in records(path) if r["type"] == "round"][-1]


@pytest.mark.slow
def test_onebit_adam_within_2_percent_of_adam_with_4x_fewer_bits(tmp_path):
    train = script("train")
    adam, onebit = tmp_path / "adam.jsonl", tmp_path / "onebit.jsonl"
    # Adam = 1-bit Adam that never leaves its full-precision warm-up; 30 epochs = 180 rounds
    train.main(["--algorithm", "onebit-adam", *DIGITS, "--hparam", "freeze_step=1000000",
                "--hparam", "eps=1e-4", "--out", str(adam)])
    train.main(["--algorithm", "onebit-adam", *DIGITS, "--hparam", "freeze_step=36",
                "--hparam", "eps=1e-4", "--out", str(onebit)])
    a, b = _last(adam), _last(onebit)
    assert a["round"] == b["round"] == 180
    assert b["test_loss"] <= 1.02 * a["test_loss"], (a["test_loss"], b["test_loss"])
    assert a["bits_per_node"] >= 4 * b["bits_per_node"] > 0
    assert b["consensus_error"] < 1e-9  # the all-reduce keeps the nodes equal (float32 noise)


@pytest.mark.slow
def test_majority_vote_keeps_descending_with_one_sign_flipper(tmp_path):
    train = script("train")
    clean, attacked = tmp_path / "clean.jsonl", tmp_path / "bad.jsonl"
    common = ["--algorithm", "signum", *DIGITS[:-4], "--epochs", "20", "--eval-every", "5",
              "--lr", "0.003"]
    train.main([*common, "--out", str(clean)])
    train.main([*common, "--hparam", "byzantine=3", "--out", str(attacked)])
    losses = [r["test_loss"] for r in records(attacked) if r["type"] == "round"]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses  # every log lower
    assert losses[-1] < 0.25 * losses[0]
    assert _last(attacked)["test_accuracy"] > 0.85
    assert _last(attacked)["test_loss"] < 2.0 * _last(clean)["test_loss"]


@pytest.mark.slow
def test_tracked_amsgrad_removes_dadams_bias(tmp_path, capsys):
    optimize = script("optimize")
    common = ["--problem", "least-squares", "--heterogeneity", "3", "--topology", "ring",
              "--nodes", "8", "--dim", "40", "--compressor", "none", "--eta", "0.01",
              "--iterations", "2000", "--log-every", "500"]
    rows = {a: optimize.main([*common, "--algorithm", a])[0]["final"]
            for a in ("dadam", "tracked-amsgrad")}
    assert rows["dadam"] > 0.1  # a biased fixed point
    assert rows["tracked-amsgrad"] < 0.01 * rows["dadam"]


@pytest.mark.parametrize("hparams", [
    ["--algorithm", "onebit-adam", "--hparam", "freeze_step=4", "--hparam", "eps=1e-3"],
    ["--algorithm", "zero-one-adam", "--hparam", "var_freeze_step=5", "--hparam",
     "var_update_scaler=1", "--hparam", "local_step_scaler=2", "--hparam", "local_step_clipper=2",
     "--hparam", "eps=1e-3"],
])
def test_resume_equals_uninterrupted(tmp_path, monkeypatch, hparams):
    args = [*hparams, "--topology", "complete", "--nodes", "4", "--hidden", "16", "--lr", "0.01",
            "--rounds", "12", "--log-every", "3", "--dtype", "float64", "--batch-size", "16"]
    a, b = interrupted_and_resumed(tmp_path, monkeypatch, args)
    assert [r["round"] for r in a] == [0, 3, 6, 9, 12] and a == b
    assert a[-1]["bits_per_node"] > 0


def test_script_refuses_all_reduce_methods_on_a_ring_and_unknown_hparams(capsys):
    train = script("train")
    with pytest.raises(SystemExit, match="onebit-adam is an all-reduce method.*--topology complete"):
        train.main(["--algorithm", "onebit-adam", "--topology", "ring", "--nodes", "4", "--rounds", "1"])
    with pytest.raises(SystemExit, match="does not take"):
        train.main(["--algorithm", "signum", "--topology", "complete", "--nodes", "4", "--rounds", "1",
                    "--hparam", "freeze_step=3"])
    with pytest.raises(SystemExit, match="power-of-two"):
        train.main(["--algorithm", "adasum", "--topology", "complete", "--nodes", "6", "--rounds", "1"])


def test_config_record_names_the_hparams(tmp_path):
    out = tmp_path / "log.jsonl"
    script("train").main(["--algorithm", "desloc", "--topology", "ring", "--nodes", "4", "--rounds", "4",
                          "--log-every", "2", "--hparam", "period_x=2", "--out", str(out)])
    config = records(out)[0]
    assert config["hparams"]["period_x"] == 2 and config["algorithm"] == "desloc"
    assert json.dumps(config)  # plain JSON
