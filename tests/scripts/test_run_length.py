"""One run-length vocabulary: every script takes the run's length as ``--rounds R``, the
communication rounds the engine runs; optimize.py's former ``--iterations`` still works."""

import pytest

from gossip.cli.arguments import ROUNDS_HELP
from gossip.metrics import read_jsonl
from tests.helpers.launch import script

RUN_SCRIPTS = ("consensus", "optimize", "train", "federated_digits")


@pytest.mark.parametrize("name", RUN_SCRIPTS)
def test_every_script_takes_rounds_with_one_meaning(name, capsys):
    """--rounds parses to ``args.rounds`` everywhere, refuses 0 alike, and --help gives it the
    shared definition (not a script's own wording of what a round is)."""
    parse = script(name).parse_args
    assert parse(["--rounds", "7"]).rounds == 7
    with pytest.raises(SystemExit) as exc:
        parse(["--rounds", "0"])
    assert exc.value.code == 2 and "expected a positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--rounds R" in shown and ROUNDS_HELP in shown


def test_iterations_is_an_alias_of_rounds(tmp_path):
    """optimize.py's --iterations, on the command line or as a run file's key, sets --rounds."""
    parse = script("optimize").parse_args
    assert parse(["--iterations", "9"]).rounds == 9
    assert parse(["--iterations", "9", "--rounds", "4"]).rounds == 4  # the last one given wins
    for key in ("iterations", "rounds"):
        run = tmp_path / f"{key}.toml"
        run.write_text(f"{key} = 6\n")
        assert parse(["--config", str(run)]).rounds == 6


def last_round(path) -> int:
    return max(r["round"] for r in read_jsonl(path) if r["type"] == "round")


@pytest.mark.parametrize("flag", ["--rounds", "--iterations"])
def test_optimize_runs_the_rounds_given(flag, tmp_path):
    log = tmp_path / "o.jsonl"
    script("optimize").main(["--nodes", "4", "--dim", "4", flag, "3", "--log-every", "1",
                             "--out", str(log)])
    assert last_round(log) == 3


@pytest.mark.slow
def test_consensus_and_train_run_the_rounds_given(tmp_path):
    """The same flag, the same length: consensus.py and train.py (whose --rounds overrides
    --epochs) stop after R rounds."""
    script("consensus").main(["--nodes", "4", "--dim", "4", "--rounds", "3", "--log-every", "1",
                              "--out", str(tmp_path / "c.jsonl")])
    assert last_round(tmp_path / "c.jsonl") == 3
    script("train").main(["--nodes", "2", "--hidden", "8", "--epochs", "50", "--rounds", "3",
                          "--log-every", "1", "--out", str(tmp_path / "t.jsonl")])
    assert last_round(tmp_path / "t.jsonl") == 3
