"""Which algorithms each script offers, and the compressor optimize.py gives each by default."""

from __future__ import annotations

import pytest

from gossip.algorithms import REGISTRY, algorithm_class, make_algorithm
from gossip.algorithms.base import ConfigError
from gossip.compress import make as make_compressor
from tests.test_config import script
from topologies import build


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_takes_compressor_matches_validate(name):
    cls = algorithm_class(name)
    topology = build("complete", 4)
    algorithm = make_algorithm(name)
    algorithm.validate(topology, make_compressor("none"))  # every algorithm takes 'none'
    if cls.takes_compressor:
        make_algorithm(name).validate(topology, make_compressor("lead:2"))
    else:
        with pytest.raises(ConfigError, match="none"):
            make_algorithm(name).validate(topology, make_compressor("lead:2"))


def test_optimize_default_compressor_per_algorithm():
    optimize = script("optimize")
    for name in sorted(n for n in REGISTRY if algorithm_class(n).trains):
        (_, _, _, comp), = optimize.run_specs(optimize.parse_args(["--algorithm", name]))
        assert comp == ("lead:2" if algorithm_class(name).takes_compressor else "none"), name
    # a compressor the user names is kept, refused or not
    (_, _, _, comp), = optimize.run_specs(optimize.parse_args(["--algorithm", "adasum",
                                                               "--compressor", "sign"]))
    assert comp == "sign"


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
    assert all(not algorithm_class(n).needs_oracle for n in consensus.averaging())
    with pytest.raises(SystemExit, match="--algorithm lead needs gradients and consensus has none: use one of "
                                         "choco, "):
        consensus.main(["--algorithm", "lead", "--nodes", "4", "--dim", "8", "--rounds", "2"])
