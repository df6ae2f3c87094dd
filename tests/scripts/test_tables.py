"""The scripts' tables: a run that ends before --target says so in both to-target columns and
in a note under the table naming the run, the rounds it had and the flag to raise."""

from __future__ import annotations

from gossip.cli import target_note
from tests.helpers.launch import script


def _row(run: str, reached: int | None) -> dict:
    return {"run": run, "final_rel_error": 1e-3, "rounds_to_target": reached,
            "bits_to_target": None if reached is None else 640.0, "ms_per_round": 0.5,
            "status": "ok", "rounds_run": 50}


def test_consensus_table_says_not_reached_and_why():
    text = script("consensus").format_table([_row("a", 12), _row("b", None)], 1e-6)
    lines = text.splitlines()
    assert lines[2] == "| a | 0.001 | 12 | 640 | — | — | 0.500 | ok |"  # no setup, first round
    assert lines[3] == "| b | 0.001 | not reached | not reached | — | — | 0.500 | ok |"
    assert lines[4] == ("not reached: 1 run(s) ended before the relative consensus error fell to "
                        "--target 1e-06 (b after 50 rounds); raise --rounds or --target to see "
                        "it reached")


def test_consensus_table_shows_setup_and_first_round_apart():
    row = _row("a", 12) | {"setup_s": 2.5, "first_round_ms": 40.0, "ms_per_round": 3.0}
    cells = script("consensus").format_table([row], 1e-6).splitlines()[2].split(" | ")
    assert cells[-4:] == ["2.5", "40", "3.000", "ok |"]


def test_no_note_when_every_run_reached_the_target():
    text = script("consensus").format_table([_row("a", 12)], 1e-6)
    assert len(text.splitlines()) == 3 and "not reached" not in text
    assert target_note([], 1e-6, "error") is None


def test_optimize_prints_the_note(capsys, tmp_path):
    rows = script("optimize").main(["--rounds", "4", "--nodes", "4", "--dim", "4",
                                    "--out", str(tmp_path / "o.jsonl")])
    out = capsys.readouterr().out
    assert rows[0]["rounds"] is None
    assert f"| {rows[0]['run']} | " in out and "| not reached | not reached |" in out
    assert "(lead@none after 4 rounds); raise --rounds or --target" in out


def test_a_run_that_diverges_before_its_first_record_is_a_failed_row(tmp_path):
    """--eta 1e300 diverges at round 0, before any record: the table row says so (the row
    building met an empty record list, an IndexError) and the script fails with status 1."""
    import pytest

    from gossip.errors import RunFailed

    optimize = script("optimize")
    with pytest.raises(RunFailed, match="diverged at round 0"):
        optimize.exit_status(optimize.main(["--iterations", "3", "--nodes", "4", "--dim", "4",
                                            "--eta", "1e300", "--out", str(tmp_path / "o.jsonl")]))
