"""Summary tables of timed runs give the seconds to reach the target (virtual time of the
network's timing models, wall time of --free-run) next to the rounds; federated tables count
rounds and the bits each client sent up and received down."""

from __future__ import annotations

import json

import pytest

from gossip.outputs import clocks_of, first_reached
from tests.helpers.launch import script

STRAGGLER = "compute=exp:1;slow=nodes:0x5"


def _cells(text: str, run: str) -> dict[str, str]:
    """The row of ``run`` as {heading: cell}."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == run:
            return dict(zip(head, cells, strict=True))
    raise AssertionError(f"no row {run!r} in\n{text}")


def _rounds(path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "round"]


@pytest.mark.slow
def test_optimize_gives_virtual_time_to_target_with_stragglers(tmp_path, capsys):
    log = tmp_path / "o.jsonl"
    rows = script("optimize").main(["--compare", "dpsgd", "ad-psgd", "--network", STRAGGLER,
                                    "--iterations", "60", "--target", "0.3", "--nodes", "8",
                                    "--dim", "20", "--out", str(log)])
    out = capsys.readouterr().out
    records = _rounds(log)
    for row in rows:
        mine = [r for r in records if r["label"] == row["run"]]
        hit = first_reached(mine, "distance_to_optimum", 0.3)
        assert hit is not None and row["rounds"] == hit["round"]
        assert row["time_virtual_s"] == hit["time_virtual_s"] > 0
        cells = _cells(out, row["run"])
        assert float(cells["virtual s to 0.3"]) == pytest.approx(hit["time_virtual_s"], rel=1e-3)
        assert cells["rounds to 0.3"] == str(hit["round"])
    # the straggler holds back every synchronous round, not the asynchronous nodes
    assert rows[1]["time_virtual_s"] < rows[0]["time_virtual_s"]


def test_optimize_table_without_a_clock_has_no_time_column():
    table = script("optimize").format_table(
        [{"run": "a", "final": 1e-3, "rounds": 5, "bits": 64.0, "ms": 1.0, "status": "ok",
          "time_virtual_s": None, "wall_s": None}], 0.01, clocks_of([[{"round": 5}]]))
    assert "virtual" not in table and "wall" not in table


def test_wall_time_to_target_of_a_free_run_and_not_reached():
    """--free-run records carry wall_s: the table shows it to the target, 'not reached' for a
    run that never got there."""
    optimize = script("optimize")
    records = [[{"type": "round", "round": 0, "wall_s": 0.0}, {"type": "round", "round": 9,
                                                                "wall_s": 1.25}]]
    clocks = clocks_of(records)
    assert clocks == [("wall_s", "wall s")]
    table = optimize.format_table(
        [{"run": "fast", "final": 1e-3, "rounds": 9, "bits": 64.0, "ms": 1.0, "status": "ok",
          "time_virtual_s": None, "wall_s": 1.25},
         {"run": "slow", "final": 0.5, "rounds": None, "bits": None, "ms": 1.0, "status": "ok",
          "time_virtual_s": None, "wall_s": None}], 0.01, clocks)
    assert _cells(table, "fast")["wall s to 0.01"] == "1.25"
    assert _cells(table, "slow")["wall s to 0.01"] == "not reached"


def test_consensus_gives_virtual_time_to_target(tmp_path, capsys):
    log = tmp_path / "c.jsonl"
    rows = script("consensus").main(["--compressor", "none", "--gamma", "1", "--network",
                                     STRAGGLER, "--rounds", "40", "--nodes", "6", "--dim", "8",
                                     "--target", "1e-2", "--out", str(log)])
    hit = first_reached(_rounds(log), "consensus_error_rel", 1e-2)
    assert rows[0]["time_virtual_s"] == hit["time_virtual_s"] > 0
    cells = _cells(capsys.readouterr().out, rows[0]["run"])
    assert float(cells["virtual s to 0.01"]) == pytest.approx(hit["time_virtual_s"], rel=1e-3)


def test_sweep_table_with_a_target_gives_rounds_and_seconds_to_it():
    compare = script("compare")
    fast = [{"type": "round", "round": k, "bits_per_node": 10.0 * k, "distance": 2.0 ** -k,
             "time_virtual_s": 3.0 * k} for k in range(6)]
    slow = [r | {"distance": 1.0} for r in fast]
    text = compare.table([("fast", fast, {"status": "ok"}, "ok"),
                          ("slow", slow, {"status": "ok"}, "ok")], "distance", [],
                         target=0.1)
    assert _cells(text, "fast")["rounds to 0.1"] == "4"
    assert _cells(text, "fast")["virtual s to 0.1"] == "12"
    assert _cells(text, "fast")["bits/node to 0.1"] == "40"
    assert _cells(text, "slow")["virtual s to 0.1"] == "not reached"
    assert "to 0.1" not in compare.table([("fast", fast, {}, "ok")], "distance", [])


def test_accuracy_targets_are_reached_from_below():
    recs = [{"type": "round", "round": k, "test_accuracy": 0.2 * k} for k in range(5)]
    assert first_reached(recs, "test_accuracy", 0.5, higher=True)["round"] == 3


def _train_row(**extra) -> dict:
    return {"run": "r", "epochs": 2.5, "rounds": 10, "train_loss": 0.5, "test_loss": 0.6,
            "test_accuracy": 0.8, "worst_node_accuracy": 0.7, "consensus_error": 1e-3,
            "bits_per_node": 1e6, "seconds_per_epoch": 0.4, "seconds_per_round": 0.1,
            "status": "ok", **extra}


def test_federated_training_table_counts_rounds_and_bits_each_way():
    train = script("train")
    text = train.format_table([_train_row(bits_up_per_client=3.0e5, bits_down_per_client=7.0e5)])
    cells = _cells(text, "r")
    assert "epochs" not in cells and "bits/node" not in cells
    assert cells["rounds"] == "10"
    assert cells["bits up/client"] == "3e+05" and cells["bits down/client"] == "7e+05"
    gossip = _cells(train.format_table([_train_row()]), "r")
    assert gossip["epochs"] == "2.5" and "bits up/client" not in gossip


def test_training_table_gives_rounds_and_virtual_seconds_to_a_target_accuracy():
    train = script("train")
    recs = [{"type": "round", "round": k, "test_accuracy": 0.1 * k, "time_virtual_s": 2.0 * k}
            for k in range(8)]
    summary = {"epochs": 2.0, "seconds_per_epoch": 0.1, "status": "ok"}
    row = train.table_row("r", recs, summary, target=0.5)
    cells = _cells(train.format_table([row]), "r")
    assert cells["rounds to 0.5"] == "5" and cells["virtual s to 0.5"] == "10"
    missed = _cells(train.format_table([train.table_row("r", recs, summary, target=0.95)]), "r")
    assert missed["rounds to 0.95"] == "not reached"


@pytest.mark.slow
def test_federated_train_run_table_from_counted_bytes(tmp_path, capsys):
    log = tmp_path / "f.jsonl"
    row = script("train").main(["--algorithm", "fedavg", "--nodes", "5", "--rounds", "4",
                                "--hidden", "8", "--log-every", "2", "--out", str(log)])
    last = _rounds(log)[-1]
    cells = _cells(capsys.readouterr().out, row["run"])
    assert cells["rounds"] == "4"
    assert float(cells["bits up/client"]) == pytest.approx(last["bits_up_per_client"], rel=1e-2)
    assert float(cells["bits down/client"]) == pytest.approx(last["bits_down_per_client"], rel=1e-2)


def test_federated_digits_table_has_rounds_and_bits_each_way():
    fed = script("federated_digits")
    star = [{"type": "round", "round": r, "test_accuracy": a, "bits_per_node": 5.0,
             "bits_up_per_client": 100.0 * r, "bits_down_per_client": 300.0 * r}
            for r, a in ((0, 0.1), (10, 0.6), (20, 0.5))]
    ring = [{"type": "round", "round": r, "test_accuracy": 0.3, "bits_per_node": 50.0 * r}
            for r in (0, 20)]
    text = fed.format_table({"FedAvg": star, "D-PSGD": ring})
    fedavg, dpsgd = _cells(text, "FedAvg"), _cells(text, "D-PSGD")
    assert fedavg["rounds"] == "20" and fedavg["best test acc"] == "60.00%"
    assert fedavg["bits up/client"] == "2e+03" and fedavg["bits down/client"] == "6e+03"
    assert dpsgd["bits up/client"] == "—" and dpsgd["bits sent/node (ring)"] == "1e+03"
    assert "epoch" not in text


def test_federated_optimize_table_gives_bits_each_way_to_the_target(tmp_path, capsys):
    log = tmp_path / "f.jsonl"
    rows = script("optimize").main(["--compare", "fedavg", "scaffold", "--iterations", "20",
                                    "--nodes", "7", "--dim", "10", "--target", "0.05",
                                    "--out", str(log)])
    out = capsys.readouterr().out
    records = _rounds(log)
    for row in rows:
        hit = first_reached([r for r in records if r["label"] == row["run"]],
                            "distance_to_optimum", 0.05)
        cells = _cells(out, row["run"])
        assert "bits/node to 0.05" not in cells
        assert float(cells["bits up/client to 0.05"]) == pytest.approx(hit["bits_up_per_client"], rel=1e-2)
        assert float(cells["bits down/client to 0.05"]) == pytest.approx(hit["bits_down_per_client"],
                                                                         rel=1e-2)
