"""`python -m topologies describe`: run in-process through `main([...])`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies.cli import main

DATA = Path(__file__).parents[1] / "data" / "graphs"


def test_describe_ring(capsys):
    assert main(["describe", "ring", "--nodes", "8"]) == 0
    out = capsys.readouterr().out
    assert "topology     ring" in out and "nodes        8" in out and "edges        8" in out
    assert "min 2, mean 2.000, max 2" in out
    assert "gap          0.195262" in out and "rho          0.804738" in out
    assert "beta         1.33333" in out


def test_describe_json_with_flags(capsys):
    assert main(["describe", "erdos-renyi:p=0.3", "-n", "20", "--weights", "max-degree",
                 "--lazy", "--seed", "3", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n"] == 20 and info["weights"] == "max-degree" and info["lazy"] is True
    assert 0 < info["gap"] < 1


def test_describe_file_without_nodes(capsys):
    assert main(["describe", str(DATA / "letters.edgelist"), "--weights", "weights"]) == 0
    out = capsys.readouterr().out
    assert "nodes        4" in out and "weights      weights" in out


def test_describe_time_varying(capsys):
    assert main(["describe", "one-peer-exponential", "--nodes", "16"]) == 0
    out = capsys.readouterr().out
    assert "period       4" in out and "rho of product over 4 rounds  0" in out


def test_plot(tmp_path, capsys):
    png = tmp_path / "ring.png"
    assert main(["describe", "ring", "--nodes", "8", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"plot         {png}" in capsys.readouterr().out
    tv = tmp_path / "tv.png"
    assert main(["describe", "directed-exponential", "-n", "8", "--plot", str(tv)]) == 0
    assert tv.stat().st_size > 10_000


def test_errors_return_2(capsys):
    assert main(["describe", "banana", "--nodes", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown topology 'banana'") and "ring" in err
    assert main(["describe", "torus", "--nodes", "7"]) == 2
    assert "prime" in capsys.readouterr().err


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["describe", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--nodes", "--weights", "--lazy", "--seed", "--plot", "--json", "SPEC",
                 "metropolis", "erdos-renyi:p=P", "module:function"):
        assert flag in out


def test_list(capsys):
    assert main(["list"]) == 0
    assert "watts-strogatz[:k=4,p=0.3]" in capsys.readouterr().out
