"""experiments/train.py: records, --gamma auto, and mpiexec -n 4 equal to the in-process run."""

from __future__ import annotations

import pytest

from tests.helpers.launch import mpiexec, run_mpi, script
from tests.helpers.train_runs import comparable, interrupted_and_resumed, records

LAUNCHES_MARKED_PER_TEST = True  # only the mpiexec test launches (tests/conftest.py)

ROUND_KEYS = ("round", "consensus_error", "bits_per_node", "bits_per_node_max", "time_s", "epoch",
              "train_loss", "test_loss", "test_accuracy", "worst_node_accuracy", "lr")


COMMON = ["--algorithm", "choco", "--compressor", "topk:0.05", "--gamma", "0.2",
          "--partition", "dirichlet:0.5", "--rounds", "12", "--log-every", "6",
          "--dtype", "float64", "--hidden", "16", "--optimizer", "nesterov", "--weight-decay",
          "1e-4", "--schedule", "cosine", "--warmup-epochs", "0.5"]


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_mpi_run_equals_in_process_run(tmp_path):
    local, remote = tmp_path / "local.jsonl", tmp_path / "mpi.jsonl"
    res = run_mpi(4, ["experiments/train.py", *COMMON, "--out", str(remote)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| choco topk:0.05" in res.stdout
    script("train").main([*COMMON, "--nodes", "4", "--out", str(local)])
    a, b = comparable(records(local)), comparable(records(remote))
    assert len(a) == 3 and a == b
    assert records(remote)[0]["world_size"] == 4


def test_script_logs_every_field_and_tunes_gamma(tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    row = script("train").main(["--algorithm", "deepsqueeze", "--compressor", "sign",
                                "--gamma", "auto", "--gamma-grid", "0.5", "0.05",
                                "--tune-fraction", "0.5", "--epochs", "2", "--eval-every", "1",
                                "--hidden", "16", "--nodes", "4", "--out", str(out),
                                "--plot", str(tmp_path / "acc.png"), "--eval-train"])
    text = capsys.readouterr().out
    assert "gamma search" in text and "picked gamma" in text and "| deepsqueeze sign" in text
    recs = records(out)
    config, rounds, summary = recs[0], [r for r in recs if r["type"] == "round"], recs[-1]
    assert config["type"] == "config" and config["gamma_search"]["grid"] == [0.5, 0.05]
    assert config["gamma_search"]["pick"] in (0.5, 0.05)
    assert config["hparams"]["gamma"] == config["gamma_search"]["pick"]
    assert [r["round"] for r in rounds] == [0, 12, 24]  # 1438 / (4·32) -> 12 rounds per epoch
    for key in ROUND_KEYS:
        assert all(key in r for r in rounds), key
    assert "avg_model_train_loss" in rounds[-1]
    assert summary["type"] == "summary" and rounds[-1]["time_per_epoch_s"] > 0
    assert row["status"] == "ok" and (tmp_path / "acc.png").exists()
    assert (tmp_path / "acc-loss.png").exists()


def test_script_refuses_bad_combinations(capsys):
    train = script("train")
    with pytest.raises(SystemExit, match="plain gradient"):
        train.main(["--algorithm", "lead", "--compressor", "lead:2", "--optimizer", "adam",
                    "--rounds", "1"])
    with pytest.raises(SystemExit, match=r"--gamma auto tunes .*\(.*choco, .*deepsqueeze"):
        train.main(["--algorithm", "dpsgd", "--gamma", "auto", "--rounds", "1"])
    with pytest.raises(SystemExit):
        train.main(["--model", "resnet", "--rounds", "1"])
    assert "invalid choice: 'resnet'" in capsys.readouterr().err


def test_resume_from_checkpoint_equals_uninterrupted_run(tmp_path, monkeypatch):
    args = ["--algorithm", "choco", "--compressor", "sign", "--gamma", "0.3", "--model", "cnn",
            "--norm", "batch", "--width", "4", "--optimizer", "adam", "--lr", "0.01",
            "--schedule", "cosine", "--partition", "sorted", "--rounds", "12", "--log-every",
            "3", "--nodes", "4", "--dtype", "float64", "--batch-size", "16"]
    a, b = interrupted_and_resumed(tmp_path, monkeypatch, args)
    assert [r["round"] for r in a] == [0, 3, 6, 9, 12] and a == b


@pytest.mark.parametrize("flags, unused", [
    (["--width", "8"], ["--width"]), (["--norm", "batch", "--width", "8"], ["--width", "--norm"]),
    (["--model", "cnn", "--hidden", "64"], ["--hidden"]), (["--model", "cnn", "--width", "8"], []),
    ([], []),
])
def test_model_flags_the_model_ignores_are_named(flags, unused):
    train = script("train")
    assert train.unused_model_flags(train.parse_args(flags)) == unused
