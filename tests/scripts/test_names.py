"""Names a user types: a misspelt one gets a "did you mean" suggestion, and ``--list`` prints
every registered one (exit 0, without importing torch)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gossip.algorithms import make_algorithm
from gossip.compress import make
from gossip.errors import CompressionError, ConfigError
from gossip.problems import make_problem
from gossip.problems.data import partition
from gossip.training.datasets import load_dataset
from tests.helpers.launch import ROOT
from topologies import build
from topologies.errors import TopologyError


@pytest.mark.parametrize("call, error, suggestion", [
    (lambda: make_algorithm("chocoo"), ConfigError, "'choco'"),
    (lambda: make_algorithm("dpsdg"), ConfigError, "'dpsgd'"),
    (lambda: make("topkk:0.1"), CompressionError, "'topk'"),
    (lambda: make("qsdg:4"), CompressionError, "'qsgd'"),
    (lambda: make_problem("lasoo"), ConfigError, "'lasso'"),
    (lambda: build("rign", 4), TopologyError, "'ring'"),
    (lambda: build("ring", 4, weights="metropolsi"), TopologyError, "'metropolis'"),
    (lambda: load_dataset("digitz"), ConfigError, "'digits'"),
    (lambda: partition(list(range(20)), 4, "dirichlt:0.5"), ConfigError, "'dirichlet'"),
])
def test_a_misspelt_name_gets_a_suggestion(call, error, suggestion):
    with pytest.raises(error, match=f"did you mean {suggestion}\\?"):
        call()


def test_a_name_close_to_nothing_gets_no_suggestion():
    with pytest.raises(ConfigError) as info:
        make_algorithm("zzzzzzzz")
    assert "did you mean" not in str(info.value)


def _script(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import runpy, sys; sys.argv = sys.argv[1:]\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "finally:\n    print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
    return subprocess.run([sys.executable, "-c", code, f"experiments/{script}", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", ["consensus.py", "optimize.py", "train.py", "compare.py"])
def test_list_prints_every_kind_and_exits_0(script):
    res = _script(script, "--list")
    assert res.returncode == 0, res.stderr
    for head in ("algorithms (--algorithm): ", "compressors (--compressor):", "topk:RATIO",
                 "topologies (--topology):", "erdos-renyi:p=P", "weights (--weights): metropolis",
                 "problems (--problem, optimize.py): least-squares"):
        assert head in res.stdout, res.stdout
    assert res.stderr.strip() == "no torch"


def test_list_of_one_kind_shows_the_names_the_script_runs():
    def names(script: str) -> set[str]:
        out = _script(script, "--list", "algorithms").stdout
        assert out.count("\n") == 1 and out.startswith("algorithms (--algorithm): "), out
        return set(out.split(": ", 1)[1].split("; ")[0].split(", "))

    consensus = names("consensus.py")
    assert "choco" in consensus and "lead" not in consensus  # consensus has no gradients
    optimize = names("optimize.py")
    assert {"lead", "nids"} <= optimize and "gossip" not in optimize


def test_list_is_not_a_config_key(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text('list = "algorithms"\n')
    res = _script("consensus.py", "--config", str(run))
    assert res.returncode == 2 and "unknown key 'list'" in res.stderr


def test_a_plugin_that_raises_at_import_is_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "bad_part.py"
    bad.write_text("import math\nraise RuntimeError('boom at import')\n")
    res = _script("consensus.py", "--algorithm", f"{bad}:Mine", "--nodes", "4", "--rounds", "2")
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(errors) == 1 and str(bad) in errors[0] and "RuntimeError: boom at import" in errors[0]
    with pytest.raises(TopologyError, match=r"bad_part\.py raised RuntimeError: boom at import"):
        build(f"{bad}:graph", 4)
    (tmp_path / "broken.py").write_text("def graph(n:\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(TopologyError, match=r"module 'broken' raised SyntaxError"):
            build("broken:graph", 4)
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("name, typo, flag", [("consensus", "--seedd", "--seed"),
                                              ("optimize", "--iteratons", "--iterations"),
                                              ("train", "--optimzer", "--optimizer"),
                                              ("compare", "--dry-rum", "--dry-run")])
def test_a_misspelt_flag_gets_a_suggestion(name, typo, flag, capsys):
    """Every script answers a mistyped flag with exit status 2 and the closest flag it has;
    a token close to no flag gets none."""
    from tests.helpers.launch import script

    argv = [typo, "--zzzzzzzz"] + (["sweep.toml"] if name == "compare" else [])
    with pytest.raises(SystemExit) as exc:
        script(name).main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {typo} --zzzzzzzz (did you mean {flag}?)" in err, err


def test_python_m_gossip_list_prints_what_list_prints():
    """``python -m gossip list [KIND]``: the same listing as a script's --list, no torch; an
    unknown kind is argparse's one line and status 2."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import runpy, sys; sys.argv = ['gossip', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('gossip', run_name='__main__')\n"
            "finally:\n    print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)")
    run = lambda *a: subprocess.run([sys.executable, "-c", code, *a], cwd=ROOT, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    res = run("list")
    assert res.returncode == 0 and res.stderr.strip() == "no torch", res.stderr
    fresh = subprocess.run([sys.executable, "-c", "from gossip.cli import listing; print(listing())"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # (a fresh process: this one may hold algorithms other tests registered)
    assert res.stdout == fresh.stdout and "topologies (--topology):" in res.stdout
    res = run("list", "weights")
    assert res.stdout.startswith("weights (--weights): metropolis") and res.returncode == 0
    res = run("list", "bogus")
    assert res.returncode == 2 and "invalid choice: 'bogus'" in res.stderr


def test_a_mistyped_choice_gets_the_closest_one():
    """argparse's choices (--optimizer, --dtype, ...) answer a typo with the closest choice
    and still list them all; a choice close to nothing is listed without a suggestion."""
    import argparse

    from gossip.config import suggest_flags

    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--optimizer", choices=["sgd", "momentum", "adam", "adamw"])
    suggest_flags(parser)
    messages = []
    parser.exit = lambda status=0, message=None: messages.append((status, message))  # type: ignore
    parser.error("argument --optimizer: invalid choice: 'adamm' (choose from 'sgd', 'momentum', "
                 "'adam', 'adamw')")
    parser.error("argument --optimizer: invalid choice: 'zzzz' (choose from 'sgd', 'adam')")
    assert messages[0] == (2, "p: error: argument --optimizer: invalid choice: 'adamm' (did you "
                              "mean 'adam'?); choose from 'sgd', 'momentum', 'adam', 'adamw'\n")
    assert messages[1][1] == "p: error: argument --optimizer: invalid choice: 'zzzz' (choose " \
                             "from 'sgd', 'adam')\n"


@pytest.mark.parametrize("args, hint", [
    (["--rouns", "3"], "unrecognized arguments: --rouns 3 (did you mean --rounds?)"),
    (["--only", "FedAvgg"], "invalid choice: 'FedAvgg' (did you mean 'FedAvg'?)"),
])
def test_federated_digits_suggests_too(args, hint):
    res = _script("federated_digits.py", *args)
    assert res.returncode == 2 and hint in res.stderr, res.stderr
