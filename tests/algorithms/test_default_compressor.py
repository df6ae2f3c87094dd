"""Which algorithms each script offers, and the compressor optimize.py gives each by default
(exact messages, ``none``, unless one is named, with --algorithm and --compare alike)."""

from __future__ import annotations

import pytest

from gossip.algorithms import REGISTRY, algorithm_class, make_algorithm
from gossip.compress import make as make_compressor
from gossip.errors import ConfigError
from tests.helpers.launch import script
from topologies import build


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_identity_only_algorithms_refuse_a_lossy_compressor(name):
    cls = algorithm_class(name)
    topology = build("star" if cls.requires.graph.star else "complete", 4)
    algorithm = make_algorithm(name)
    for spec in ("none", "lead:2"):
        compressor = make_compressor(spec)
        if spec == "lead:2" and cls.requires.compressor == "identity":
            with pytest.raises(ConfigError, match="none"):
                cls.requires.check(topology, compressor, True, name=name)
            continue
        cls.requires.check(topology, compressor, True, name=name)  # every algorithm takes 'none'
        algorithm.validate(topology, compressor)


def test_optimize_sends_exact_messages_unless_a_compressor_is_named():
    optimize = script("optimize")
    for name in sorted(n for n in REGISTRY if algorithm_class(n).trains):
        (label, _, _, comp), = optimize.run_specs(optimize.parse_args(["--algorithm", name]))
        (clabel, _, _, ccomp), = optimize.run_specs(optimize.parse_args(["--compare", name]))
        assert comp == ccomp == "none", name  # one rule for both forms
        assert label == clabel == f"{name}@none", name
    # a compressor the user names is kept, refused or not, in both forms
    (_, _, _, comp), = optimize.run_specs(optimize.parse_args(["--algorithm", "adasum",
                                                               "--compressor", "sign"]))
    assert comp == "sign"
    specs = optimize.run_specs(optimize.parse_args(["--compare", "lead@lead:2", "nids", "dgd"]))
    assert [(s[0], s[3]) for s in specs] == [("lead@lead:2", "lead:2"), ("nids@none", "none"),
                                             ("dgd@none", "none")]


def test_algorithm_and_compare_run_the_same_method_and_log_the_compressor(tmp_path):
    import json

    optimize = script("optimize")
    common = ["--nodes", "4", "--dim", "10", "--samples-per-node", "10", "--iterations", "20",
              "--log-every", "20"]
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    rows = optimize.main([*common, "--algorithm", "dpsgd", "--out", str(one)])
    compared = optimize.main([*common, "--compare", "dpsgd", "lead@lead:2", "--out", str(many)])
    assert rows[0]["run"] == compared[0]["run"] == "dpsgd@none"
    assert rows[0]["final"] == compared[0]["final"]  # the same run, not a quantized one
    assert compared[1]["run"] == "lead@lead:2"
    for path in (one, many):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        configs = [r for r in records if r["type"] == "config"]
        assert configs and all("@" in r["label"] and r["label"].endswith("@" + r["compressor"])
                               for r in configs)
        assert all(r["label"] in {c["label"] for c in configs} for r in records if "label" in r)


def test_optimize_refuses_an_algorithm_without_gradients():
    optimize = script("optimize")
    with pytest.raises(SystemExit, match="gossip uses no gradients, so it cannot minimize a problem; use"):
        optimize.run_specs(optimize.parse_args(["--algorithm", "gossip"]))


def test_optimize_runs_an_allreduce_method_with_no_compressor_flag(capsys):
    rows = script("optimize").main(["--algorithm", "adasum", "--topology", "complete", "--nodes", "4",
                                    "--dim", "10", "--samples-per-node", "10", "--iterations", "5"])
    assert rows[0]["run"] == "adasum@none" and rows[0]["status"] == "ok"


def test_consensus_lists_and_runs_only_algorithms_without_gradients():
    consensus = script("consensus")
    assert "choco" in consensus.averaging() and "lead" not in consensus.averaging()
    assert all(not algorithm_class(n).requires.gradients for n in consensus.averaging())
    with pytest.raises(SystemExit, match="--algorithm lead needs gradients and consensus has none: use one of "
                                         "async-choco, .*, choco, "):
        consensus.main(["--algorithm", "lead", "--nodes", "4", "--dim", "8", "--rounds", "2"])


def test_optimize_hparam_reaches_the_algorithm_and_an_unknown_key_is_named(tmp_path):
    import json

    from gossip.errors import GossipError

    optimize = script("optimize")
    common = ["--algorithm", "onebit-adam", "--topology", "complete", "--nodes", "4", "--dim", "10",
              "--samples-per-node", "20", "--iterations", "4", "--log-every", "2"]
    out = tmp_path / "o.jsonl"
    optimize.main([*common, "--hparam", "codec=sign_l1", "freeze_step=2", "--out", str(out)])
    config = next(r for r in map(json.loads, out.read_text().splitlines()) if r["type"] == "config")
    assert config["hparams"]["codec"] == "sign_l1" and config["hparams"]["freeze_step"] == 2
    with pytest.raises((SystemExit, GossipError), match=r"does not take \['bogus'\]"):
        optimize.main([*common, "--hparam", "bogus=1"])
    # with --compare, a key goes only to the runs whose algorithm takes it
    both = tmp_path / "both.jsonl"
    optimize.main([*common[2:], "--compare", "lead@lead:2", "onebit-adam", "--hparam", "freeze_step=3",
                   "--out", str(both)])
    configs = {r["label"]: r["hparams"] for r in map(json.loads, both.read_text().splitlines())
               if r["type"] == "config"}
    # the label names the codec and the --hparam the run took (issue 26)
    assert "freeze_step" not in configs["lead@lead:2"]
    assert configs["onebit-adam@sign_l2 freeze_step=3"]["freeze_step"] == 3
