"""experiments/compare.py: sweeps from TOML files -> runs, one markdown table, PNG plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.launch import ROOT, script

LAUNCHES_MARKED_PER_TEST = True  # none launches: mpiexec commands are only printed (--dry-run) (tests/conftest.py)

CONFIGS = ROOT / "experiments" / "configs"


@pytest.mark.slow
def test_shipped_training_sweep_gives_table_and_plots(tmp_path, capsys):
    compare = script("compare")
    text = compare.main([str(CONFIGS / "sweep_digits.toml"), "--out", str(tmp_path),
                         "--set", "epochs=1", "--set", "eval-every=0.5", "--set", "hidden=[16]"])
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    labels = [r.split(" | ")[0][2:] for r in rows]
    assert labels == ["D-PSGD exact", "CHOCO-SGD top-1%", "CHOCO-SGD sign", "DeepSqueeze sign",
                      "PowerGossip rank 1"]
    assert all(r.rstrip(" |").endswith("ok") for r in rows)
    table = (tmp_path / "table.md").read_text()
    assert "final test_accuracy" in table and "worst_node_accuracy" in table
    assert "python experiments/train.py" in table  # the commands, for reproducing
    for metric in ("test_accuracy", "train_loss", "consensus_error"):
        assert (tmp_path / f"{metric}.png").stat().st_size > 1000
    assert len(list(tmp_path.glob("*.jsonl"))) == 5


def test_one_run_logging_several_algorithms_gives_several_rows(tmp_path):
    compare = script("compare")
    text = compare.main([str(CONFIGS / "sweep_lead.toml"), "--out", str(tmp_path),
                         "--set", "iterations=30"])
    for inner in ("lead@lead:2", "nids@none", "dgd@none", "choco@lead:2"):
        assert f"| least squares / {inner} |" in text
    assert (tmp_path / "distance_to_optimum.png").exists()


def test_grid_dry_run_and_mpi_commands(tmp_path, capsys):
    compare = script("compare")
    sweep = tmp_path / "s.toml"
    sweep.write_text('script = "consensus"\nmpi = 2\n[defaults]\nrounds = 5\n'
                     '[[run]]\nlabel = "a"\ncompressor = "sign"\n'
                     '[grid]\ngamma = [0.1, 0.2]\nseed = [0, 1]\n')
    text = compare.main([str(sweep), "--dry-run", "--out", str(tmp_path)])
    lines = text.splitlines()
    assert len(lines) == 4 and all(line.startswith("mpiexec -n 2 python experiments/consensus.py")
                                   for line in lines)
    assert "--gamma=0.2 --seed=1" in lines[-1] and "--rounds=5" in lines[0]
    assert "--mpi" not in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('script = "consensus"\nrounds = 5\n', "unknown key 'rounds'; valid top-level keys"),
        ('script = "consensus"\n[[run]]\nlabel = "x"\nroundz = 5\n', "run 'x': "),
        ('script = "consensus"\n[[run]]\nrounds = "many"\n', "invalid int value: 'many'"),
        ('[[run]]\nrounds = 5\n', "has no script"),
        ('script = "nope"\n', "neither one of"),
        ('script = "consensus"\n[grid]\ngamma = 0.1\n', "key 'grid.gamma' expects an array"),
        ('script = "consensus"\n[[run]]\nout = "x.jsonl"\n', "chooses the log file itself"),
    ],
)
def test_sweep_errors_name_the_problem(tmp_path, content, message):
    compare = script("compare")
    sweep = tmp_path / "bad.toml"
    sweep.write_text(content)
    with pytest.raises(SystemExit) as exc:
        compare.main([str(sweep), "--out", str(tmp_path)])
    assert message in str(exc.value)
    assert str(sweep) in str(exc.value)


def test_shipped_sweeps_are_valid():
    compare = script("compare")
    for path in sorted(CONFIGS.glob("sweep_*.toml")):
        runs = compare.expand(compare.load_toml(path), str(path), Path("/tmp/x"), None, {})
        assert runs
        for run in runs:
            compare.validate(run, str(path))


def test_consensus_sweep_relative_errors(tmp_path):
    compare = script("compare")
    text = compare.main([str(CONFIGS / "sweep_consensus.toml"), "--out", str(tmp_path),
                         "--set", "rounds=20", "--set", "dim=50", "--set", "nodes=6"])
    assert "final consensus_error (rel.)" in text
    exact = next(line for line in text.splitlines() if line.startswith("| exact gossip"))
    assert 0 < float(exact.split(" | ")[1]) < 0.5
    assert (tmp_path / "consensus_error.png").exists()


@pytest.mark.parametrize("out, message", [
    ("/dev/full", "error: --out /dev/full is not a directory"),
    ("{tmp}/file/logs", "is not a directory, so the directory cannot be created there"),
])
def test_an_output_folder_that_cannot_be_made_is_refused_before_any_run(tmp_path, out, message):
    compare = script("compare")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exc:
        compare.main([str(CONFIGS / "sweep_consensus.toml"), "--out", out.format(tmp=tmp_path),
                      "--set", "rounds=2"])
    assert message in str(exc.value)


def test_no_run_without_the_logs_folder_says_so(tmp_path):
    compare = script("compare")
    with pytest.raises(SystemExit) as exc:
        compare.main([str(CONFIGS / "sweep_consensus.toml"), "--no-run", "--out",
                      str(tmp_path / "never")])
    assert str(exc.value) == (f"error: --no-run reads the logs in {tmp_path / 'never'}, which does "
                              "not exist; run the sweep first (without --no-run) or give --out the "
                              "folder of its logs")
    assert not (tmp_path / "never").exists()


def test_a_mistyped_set_names_the_runs_script_and_the_flag_meant():
    compare = script("compare")
    with pytest.raises(SystemExit) as exc:
        compare.main([str(CONFIGS / "sweep_consensus.toml"), "--set", "rouns=5", "--dry-run"])
    assert str(exc.value).endswith("run 'exact gossip': consensus.py: error: unrecognized "
                                   "arguments: --rouns=5 (did you mean --rounds?)")
