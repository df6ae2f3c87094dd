"""Every script meets hostile flags with one ``error:`` line and exit status 2: no traceback,
no allocation beyond a bound (each case runs under a 3 GiB address-space limit), within
seconds."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from tests.helpers.launch import ROOT

C, O, T, P, F = ("experiments/consensus.py", "experiments/optimize.py", "experiments/train.py",
                 "experiments/compare.py", "experiments/federated_digits.py")
SWEEP = "experiments/configs/sweep_consensus.toml"
LAUNCHES_MARKED_PER_TEST = True  # none launches: mpiexec is only named in a hint (tests/conftest.py)
CASES = [
    (C, "--nodes 0"), (C, "--nodes -3"), (C, "--nodes 1000000 --dim 1000000"),
    (C, "--dim 1000000000000"), (C, "--shape 100000000x100000000"), (C, "--shape 3xq"),
    (C, "--shape 0x4"), (C, "--dim 0"), (C, "--rounds -1"), (C, "--rounds abc"),
    (C, "--gamma nan"), (C, "--gamma -1"), (C, "--gamma inf"), (C, "--compressor bogus"),
    (C, "--compressor topk:2.0"), (C, "--compressor topk:0"), (C, "--compressor qsgd:99bit"),
    (C, "--compressor lowrank:0 --shape 10x10"), (C, "--topology moebius"),
    (C, "--topology file:/nonexistent.edgelist"), (C, "--algorithm chocolate"),
    (C, "--nodes 4 --topology torus:3x3"), (C, "--seed -5"), (C, "--dtype float17"),
    (C, "--device tpu"), (C, "--timeout -1"), (C, "--config /nonexistent.toml"),
    (C, "--max-memory 0"), (C, "--max-memory 1K --nodes 8 --dim 100000"),
    (C, "--compressor none topk:0.1 --gamma 1 2 3"), (C, "--checkpoint-every 5"),
    (C, "--resume /nonexistent"), (C, "--log-every 0"),
    (O, "--algorithm chocolate"), (O, "--problem nonsense"), (O, "--dim -1"),
    (O, "--iterations 0"), (O, "--eta nan"), (O, "--algorithm gossip"),
    (O, "--algorithm onebit-adam --topology ring"), (O, "--hparam gamma"),
    (O, "--hparam nosuch=1"), (O, "--estimator magic"), (O, "--batch-size 0"),
    (O, "--data /nonexistent.npz"), (O, "--compressor randk:5.0"),
    (O, "--nodes 100000 --dim 1000000"), (O, "--dim 200000"),
    (O, "--nodes 1000 --samples-per-node 100000000"), (O, "--overlap --algorithm lead"),
    (O, "--link-latency -1"), (C, "--transport gloo"), (C, "--transport carrier-pigeon"),
    (C, "--nodse 4"), (C, "--threads 100000"), (C, "--threads 0"), (C, "--link-latency 1e9"),
    (O, "--link-latency 500"), (O, "--algorithm choco --hparam gamma=[1,2]"),
    (T, "--algorithm choco --compressor sign --hparam gamma=abc"),
    (T, "--model nosuchnet"), (T, "--lr nan"), (T, "--epochs -1"), (T, "--batch-size 0"),
    (T, "--dataset nosuchdata"), (T, "--algorithm chocolate"),
    (T, "--hidden 1000000000"), (T, "--model cnn --width 100000"), (T, "--nodes 100000000"),
    (T, "--eval-every inf"), (T, "--warmup-epochs -3"), (T, "--milestones 1 nan"),
    (T, "--lr-decay 0"), (T, "--tune-fraction nan"), (C, "--target nan"), (O, "--target -1"),
    (P, "/nonexistent.toml"), (P, "--only x"), (P, f"{SWEEP} --out /dev/full"),
    (P, f"{SWEEP} --no-run --out /nonexistent/logs"), (P, f"{SWEEP} --set rouns=5"),
    (F, "--rounds 0"), (F, "--only nosuch"), (F, "--out /dev/full"), (F, "--plot fd.zzz"),
]


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _run(case: tuple[str, str]) -> tuple[tuple[str, str], subprocess.CompletedProcess]:
    script, flags = case
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("GOSSIP_DEBUG", None)
    res = subprocess.run([sys.executable, script, *flags.split()], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, preexec_fn=_limit)
    return case, res


@pytest.mark.slow
def test_hostile_flags_end_in_one_error_line_with_status_2(tmp_path):
    """Each case runs as ``python SCRIPT FLAGS`` does, in a fork of one interpreter that imported
    torch and the scripts once (tests/helpers/forked_runs.py), under the 3 GiB limit."""
    assert len(CASES) >= 40
    cases, results = tmp_path / "cases.json", tmp_path / "results.json"
    control = ["tests/helpers/forked_runs.py", []]  # an uncaught IndexError: its traceback, status 1
    cases.write_text(json.dumps([[script, flags.split()] for script, flags in CASES] + [control]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("GOSSIP_DEBUG", None)
    res = subprocess.run([sys.executable, "tests/helpers/forked_runs.py", str(cases), str(results),
                          str(3 << 30)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    *got_cases, got_control = json.loads(results.read_text())
    assert got_control["returncode"] == 1 and "Traceback" in got_control["stderr"], got_control
    bad = []
    for (script, flags), got in zip(CASES, got_cases, strict=True):
        lines = [ln for ln in got["stderr"].splitlines() if "error" in ln.lower()]
        if got["returncode"] != 2 or "Traceback" in got["stderr"] or not lines:
            bad.append(f"{script} {flags}: exit {got['returncode']}: {got['stderr'].strip()[-300:]}")
    assert not bad, "\n".join(bad)


def test_a_memory_refusal_says_how_more_processes_would_help():
    """In process: start it on several; under a world: more processes than it has, up to one
    per node; a world of one node per process is told nothing about spreading."""
    from gossip.cli.checks import spread_hint

    assert "mpiexec -n 4" in spread_hint(1, 8)
    assert spread_hint(2, 4) == (" (or start more than 2 processes, up to one per node, to "
                                 "spread the nodes further)")
    assert spread_hint(8, 1) == ""


def test_train_refuses_a_huge_model_before_building_it():
    """The model is counted on the meta device: a 10^9-wide hidden layer is refused at once,
    under a 3 GiB address space, with the flags that shrink it."""
    (_, _), res = _run((T, "--hidden 1000000000 --rounds 1"))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: this run needs about ") and "Traceback" not in res.stderr
    assert "lower --nodes, --hidden or --width" in res.stderr


def test_an_hparam_of_the_wrong_kind_names_the_kind_and_an_example():
    from gossip.cli import check_hparam_types

    with pytest.raises(SystemExit) as info:
        check_hparam_types("choco", {"gamma": "[1,2]"})
    assert str(info.value) == ("error: --hparam gamma=[1,2]: choco's gamma is a number (default "
                               "set by the run); give one, e.g. --hparam gamma=0.1")
    check_hparam_types("choco", {"gamma": 0.5, "eta": 1})  # numbers pass, ints for floats too
