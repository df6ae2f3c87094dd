"""TOML run files (gossip/config.py): keys, types, overrides, and the hook in every script."""

from __future__ import annotations

import argparse

import pytest

from gossip.config import config_values, load_toml, parse_args_with_config
from gossip.errors import ConfigFileError
from tests.helpers.launch import ROOT, script


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--gamma", type=float, nargs="+", default=None)
    p.add_argument("--eta", type=float, default=0.1)
    p.add_argument("--compressor", default="none")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--log-every", type=int, default=1)
    return p


def write(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_values_with_dash_or_underscore_and_scalar_for_lists():
    values = config_values(parser(), {"log-every": 5, "rounds": 3, "gamma": 0.5, "eta": 1,
                                      "progress": True, "dtype": "float64"})
    assert values == {"log_every": 5, "rounds": 3, "gamma": [0.5], "eta": 1.0,
                      "progress": True, "dtype": "float64"}
    assert config_values(parser(), {"log_every": 2, "gamma": [1, 0.05]}) == {
        "log_every": 2, "gamma": [1.0, 0.05]}


def test_unknown_key_names_it_and_lists_valid_keys():
    with pytest.raises(ConfigFileError) as exc:
        config_values(parser(), {"roundz": 3}, source="run.toml")
    msg = str(exc.value)
    assert "run.toml" in msg and "unknown key 'roundz'" in msg
    assert "did you mean 'rounds'" in msg
    assert "valid keys:" in msg and "log-every" in msg and "compressor" in msg


@pytest.mark.parametrize(
    ("table", "key", "expected"),
    [
        ({"rounds": "100"}, "rounds", "an integer"),
        ({"rounds": 1.5}, "rounds", "an integer"),
        ({"rounds": True}, "rounds", "an integer"),
        ({"eta": "fast"}, "eta", "a number"),
        ({"compressor": 3}, "compressor", "a string"),
        ({"progress": "yes"}, "progress", "a boolean"),
        ({"gamma": [1.0, "x"]}, "gamma", "a number"),
        ({"eta": [0.1, 0.2]}, "eta", "one value, not an array"),
    ],
)
def test_wrong_type_names_key_expected_type_and_value(table, key, expected):
    with pytest.raises(ConfigFileError) as exc:
        config_values(parser(), table, source="run.toml")
    msg = str(exc.value)
    assert f"key '{key}'" in msg and expected in msg
    assert repr(table[key]) in msg


def test_choices_and_tables_are_checked():
    with pytest.raises(ConfigFileError, match="key 'dtype' must be one of 'float32', 'float64'"):
        config_values(parser(), {"dtype": "float16"})
    with pytest.raises(ConfigFileError, match="key 'rounds' is a table"):
        config_values(parser(), {"rounds": {"value": 3}})


def test_command_line_overrides_file(tmp_path):
    path = write(tmp_path, 'rounds = 50\ncompressor = "sign"\nprogress = true\n')
    args = parse_args_with_config(parser(), ["--config", str(path), "--rounds", "7"])
    assert (args.rounds, args.compressor, args.progress) == (7, "sign", True)
    assert args.config == str(path)


def test_bad_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigFileError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")
    bad = write(tmp_path, "rounds = = 3\n")
    with pytest.raises(ConfigFileError, match="not valid TOML"):
        load_toml(bad)


@pytest.mark.parametrize("text, fragment", [
    ("nodes = " + "[" * 50_000 + "]" * 50_000, "nested too deep"),
    ("nodes = " + "9" * 5000, "number too long"),
])
def test_a_hostile_file_is_a_config_error_naming_it(tmp_path, text, fragment):
    """Arrays nested 50,000 deep and a 5000-digit integer: one error naming the file, not
    Python's RecursionError or digit-limit ValueError."""
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigFileError, match=fragment) as exc:
        load_toml(path)
    assert str(path) in str(exc.value)


def test_scripts_read_config_and_report_errors(tmp_path, capsys):
    consensus = script("consensus")
    path = write(tmp_path, 'nodes = 5\ncompressor = ["none", "sign"]\ngamma = [1, 0.4]\n'
                           'log-every = 3\n')
    args = consensus.parse_args(["--config", str(path), "--dim", "7"])
    assert (args.nodes, args.compressor, args.gamma, args.log_every, args.dim) == (
        5, ["none", "sign"], [1.0, 0.4], 3, 7)
    bad = write(tmp_path, "nodes = 5\nrounds = \"many\"\n")
    with pytest.raises(SystemExit) as exc:
        consensus.parse_args(["--config", str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "key 'rounds' expects an integer" in err and "'many'" in err
    unknown = write(tmp_path, "nodez = 5\n")
    with pytest.raises(SystemExit):
        consensus.parse_args(["--config", str(unknown)])
    assert "unknown key 'nodez'" in capsys.readouterr().err


def test_optimize_and_train_read_shipped_configs():
    lead = str(ROOT / "experiments/configs/lead_check.toml")
    opt = script("optimize").parse_args(["--config", lead])
    assert opt.compare == ["lead@lead:2", "nids", "dgd", "choco@lead:2"]
    assert opt.dtype == "float64" and opt.samples_per_node == 200
    train = script("train")
    args = train.parse_args(["--config", str(ROOT / "experiments/configs/train_digits.toml"),
                             "--gamma", "auto"])
    assert (args.algorithm, args.compressor, args.gamma, args.batch_size) == (
        "choco", "topk:0.01", "auto", 32)
    assert script("consensus").parse_args(
        ["--config", str(ROOT / "experiments/configs/consensus_ring25.toml")]).nodes == 25


def test_converter_types_see_the_value(tmp_path, capsys):
    train = script("train")
    assert train.parse_args(["--config", str(write(tmp_path, 'gamma = "auto"\n'))]).gamma == "auto"
    assert train.parse_args(["--config", str(write(tmp_path, "gamma = 0.3\n"))]).gamma == 0.3
    with pytest.raises(SystemExit):
        train.parse_args(["--config", str(write(tmp_path, 'gamma = "fast"\n'))])
    err = capsys.readouterr().err
    assert "key 'gamma' expects a number or 'auto'" in err
