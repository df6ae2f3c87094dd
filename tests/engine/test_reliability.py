"""Faults and hostile input end in one clean error, never a hang, a lost log or a traceback."""

from __future__ import annotations

import math

import pytest

from gossip.comm.world import World
from gossip.errors import CommConfigError
from tests.helpers.launch import run_py

LAUNCHES_MARKED_PER_TEST = True  # none launches: the launchers are named in strings (tests/conftest.py)

CONSENSUS = ["experiments/consensus.py", "--nodes", "4", "--dim", "16", "--rounds", "10"]


def clean_error(res, *needles: str) -> str:
    """The run failed with one clean line (no traceback) that contains every needle."""
    err = res.stderr
    assert res.returncode != 0, res.stdout + err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "soon"])
def test_timeout_must_be_positive_seconds(value):
    with pytest.raises(CommConfigError, match="positive number of seconds"):
        World(None, timeout=value)
    with pytest.raises(CommConfigError, match="positive number of seconds"):
        World(None).configure(timeout=value)


@pytest.mark.parametrize("kind", ["device", "directory", "oversized", "binary"])
def test_config_files_are_checked_before_reading(tmp_path, kind):
    from gossip.config import load_toml
    from gossip.errors import ConfigFileError

    path = {"device": "/dev/zero", "directory": str(tmp_path), "oversized": tmp_path / "big.toml",
            "binary": tmp_path / "bin.toml"}[kind]
    if kind == "oversized":
        path.write_text("# padding\n" * 200_000)
    if kind == "binary":
        path.write_bytes(b"\xff\xfe\x00 = 1")
    expected = {"device": "not a regular file", "directory": "is a directory",
                "oversized": "bytes, more than", "binary": "not UTF-8"}[kind]
    with pytest.raises(ConfigFileError, match=expected):
        load_toml(path)


def test_config_flag_refuses_a_device_with_one_line():
    clean_error(run_py([*CONSENSUS, "--config", "/dev/zero"]), "config file /dev/zero is not a regular file")


def test_compare_dry_run_does_not_import_the_sweeps_script(tmp_path):
    marker = tmp_path / "imported"
    script = tmp_path / "mine.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef parse_args(argv=None):\n    return argv\n")
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'script = "{script}"\nout = "{tmp_path / "out"}"\n[[run]]\nlabel = "a"\nrounds = 3\n')
    res = run_py(["experiments/compare.py", str(sweep), "--dry-run"])
    assert res.returncode == 0, res.stderr
    assert "mine.py --rounds=3" in res.stdout
    assert not marker.exists()


@pytest.mark.slow
def test_diverged_or_failed_runs_exit_non_zero(tmp_path):
    res = run_py(["experiments/optimize.py", "--nodes", "4", "--dim", "10", "--iterations", "20",
                  "--algorithm", "dgd", "--eta", "100"])
    clean_error(res, "1 of 1 run(s) did not finish", "diverged at round")
    assert "| diverged at round" in res.stdout  # the table is still printed
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'script = "consensus"\nout = "{tmp_path / "out"}"\n[defaults]\nnodes = 4\n'
                     'dim = 8\nrounds = 4\n[[run]]\nlabel = "fine"\n[[run]]\nlabel = "bad"\n'
                     'init = "missing.npy"\n')
    res = run_py(["experiments/compare.py", str(sweep)])
    clean_error(res, "run 'bad'", "missing.npy")  # refused before any run started
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _npy_files(tmp_path):
    """Broken --init files: what each is, and a phrase its error must contain."""
    import numpy as np

    files = {}
    np.save(tmp_path / "scalar.npy", np.float64(3.0))
    files["scalar.npy"] = "has shape ()"
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 16)))
    files["a.npz"] = "is an .npz archive"
    np.save(tmp_path / "t.npy", np.zeros((4, 16)))
    (tmp_path / "t.npy").write_bytes((tmp_path / "t.npy").read_bytes()[:-40])
    files["t.npy"] = "only 472 bytes follow"
    raw = bytearray((tmp_path / "t.npy").read_bytes())
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (4, 4000000000000), }"
    raw[10:128] = header + b" " * (117 - len(header)) + b"\n"
    (tmp_path / "huge.npy").write_bytes(bytes(raw))
    files["huge.npy"] = "announces shape (4, 4000000000000)"
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}] * 4, dtype=object), allow_pickle=True)
    files["obj.npy"] = "holds object values"
    (tmp_path / "dir.npy").mkdir()
    files["dir.npy"] = "is a directory"
    return files


def test_configuration_errors_are_one_clean_line(tmp_path, capsys):
    """Each bad flag or file ends in SystemExit with one message naming it, before round 1."""
    from gossip.cli import guarded
    from tests.helpers.launch import script

    consensus = script("consensus")
    cases = [(["--log-every", "0"], "--log-every: expected a positive integer"),
             (["--seed", "-1"], "--seed: expected a non-negative integer"),
             (["--nodes", "0"], "--nodes: expected a positive integer"),
             (["--checkpoint-every", "-2"], "--checkpoint-every: expected a non-negative"),
             (["--timeout", "0"], "--timeout: timeout must be a positive number of seconds"),
             (["--timeout", "nan"], "--timeout: timeout must be a positive number of seconds"),
             (["--resume", str(tmp_path / "missing")], "no such directory"),
             (["--resume", str(tmp_path)], "holds no checkpoint"),
             (["--device", "bogus"], "--device 'bogus' is not a torch device"),
             (["--weights", "bogus"], "unknown weight rule 'bogus'"),
             (["--nodes", "1"], "needs n >= 2 nodes"),
             (["--compressor", "topk:100"], "cannot compress node 0's model of 16 entries"),
             (["--plot", str(tmp_path / "p.txt")], "'.txt' is not an image format"),
             (["--plot", str(tmp_path / "x"), "--out", str(tmp_path / "x")], "are the same file")]
    cases += [(["--init", str(tmp_path / name)], needle) for name, needle in _npy_files(tmp_path).items()]
    for extra, needle in cases:
        with pytest.raises(SystemExit) as exc:
            guarded(lambda extra=extra: consensus.main([*CONSENSUS[1:], *extra]))
        assert exc.value.code not in (0, None), extra
        assert isinstance(exc.value.code, int) or exc.value.code.startswith("error: "), exc.value.code
        message = str(exc.value.code) + capsys.readouterr().err
        assert needle in message, (extra, message)
    assert not (tmp_path / "x").exists()  # nothing was written before the refusal
    optimize = script("optimize")
    base = ["--nodes", "4", "--dim", "8", "--iterations", "3"]
    for extra, needle in ((["--data", "/dev/zero"], "--data /dev/zero is not a regular file"),
                          (["--estimator", "sgd", "--batch-size", "500"], "batch_size must be"),
                          (["--batch-size", "0"], "--batch-size: expected a positive integer")):
        with pytest.raises(SystemExit) as exc:
            guarded(lambda extra=extra: optimize.main([*base, *extra]))
        assert needle in str(exc.value.code) + capsys.readouterr().err, extra


@pytest.mark.parametrize("nodes, world_size, fix", [
    (5, 1, "--nodes is 5; pass --nodes 4 or leave --nodes out"),
    (None, 2, "the MPI world has 2 ranks; run mpiexec -n 4, or pass --nodes 4 to host several"),
    (None, 6, "the MPI world has 6 ranks; run at most mpiexec -n 4"),
    (8, 2, "--nodes is 8; pass --nodes 4"),
])
def test_graph_file_size_mismatch_says_what_works(tmp_path, nodes, world_size, fix):
    """The advice of a graph file of the wrong size fits the world: no --nodes below it."""
    import argparse
    import types

    from gossip.cli.start import build_topology

    path = tmp_path / "g.edgelist"
    path.write_text("0 1\n1 2\n2 3\n3 0\n")
    args = argparse.Namespace(topology=str(path), nodes=nodes, weights="metropolis", lazy=False, seed=0)
    with pytest.raises(SystemExit) as exc:
        world = types.SimpleNamespace(size=world_size, kind="MPI world", launch_hint="mpiexec -n {}".format)
        build_topology(args, world)
    assert str(exc.value.code) == f"error: graph file {path} has 4 nodes but {fix}" + (
        " nodes per rank" if "several" in fix else "")


def test_exit_status_hints_at_smaller_steps_only_after_a_divergence():
    from gossip.cli import exit_status
    from gossip.errors import RunFailed

    exit_status([{"run": "a", "status": "ok"}])
    with pytest.raises(RunFailed, match=r"\(b: diverged at round 3\); a diverged run wants a smaller step"):
        exit_status([{"run": "a", "status": "ok"}, {"run": "b", "status": "diverged at round 3"}])
    with pytest.raises(RunFailed) as exc:
        exit_status({"run": "c", "status": "failed: boom"})
    assert str(exc.value) == "1 of 1 run(s) did not finish (c: failed: boom)"


@pytest.mark.parametrize("problem_dtype", ["float32", "float64"])
def test_a_problem_in_another_dtype_is_refused_before_round_1(problem_dtype):
    import torch

    import topologies
    from gossip import Engine, make_problem
    from gossip.algorithms import make_algorithm
    from gossip.errors import ConfigError

    problem = make_problem("least-squares", n_nodes=4, dim=10, dtype=getattr(torch, problem_dtype))
    engine_dtype = torch.float64 if problem_dtype == "float32" else torch.float32
    with pytest.raises(ConfigError, match=f"computes in dtype torch.{problem_dtype}.*--dtype"):
        Engine(make_algorithm("dpsgd", eta=0.01), topologies.build("ring", 4),
               lambda i: torch.zeros(10, dtype=engine_dtype),
               oracles=lambda i, gen: problem.oracle(i, gen), dtype=engine_dtype)


def test_an_error_line_is_left_for_torchrun(tmp_path, monkeypatch):
    """gossip.cli.guard.tell_torchrun writes the worker's error file torchrun names (its failure
    summary reads the line from it), and does nothing outside torchrun."""
    import json

    from gossip.cli.guard import TORCHRUN_ERROR_FILE, tell_torchrun

    monkeypatch.delenv(TORCHRUN_ERROR_FILE, raising=False)
    tell_torchrun("error: x")  # no file named: nothing written, no error
    path = tmp_path / "error.json"
    monkeypatch.setenv(TORCHRUN_ERROR_FILE, str(path))
    tell_torchrun("error: --rounds: bad")
    message = json.loads(path.read_text())["message"]
    assert message["message"] == message["extraInfo"]["py_callstack"] == "error: --rounds: bad"
    assert int(message["extraInfo"]["timestamp"]) > 0
    monkeypatch.setenv(TORCHRUN_ERROR_FILE, str(tmp_path / "missing" / "error.json"))
    tell_torchrun("error: y")  # an unwritable path is ignored


def test_ctrl_c_is_one_line_and_keeps_the_log(tmp_path):
    """SIGINT (Ctrl-C) during a run without checkpoints: exit status 130, one error: line
    instead of the traceback of wherever the run was, and every record written so far kept."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.launch import ROOT

    log = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "experiments/consensus.py", "--nodes", "8", "--dim",
                             "16", "--rounds", "10000000", "--log-every", "10", "--out", str(log)],
                            cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                                               PYTHONFAULTHANDLER="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # Ctrl-C's default even where this test was started in the background
                            # (a shell's `cmd &` ignores SIGINT, and the run would keep going)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline and (not log.exists() or log.read_text().count('"type": "round"') < 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # where it waits: faulthandler prints every thread's stack
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"the run did not end within 60 s of SIGINT; its stacks:\n{err[-6000:]}")
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [
        "error: interrupted (Ctrl-C): the log (--out) keeps every record written so far, without "
        "the run's summary; with --checkpoint-every K a run stopped so can be continued with "
        "--resume"], err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(r["type"] == "round" for r in records) >= 3


@pytest.mark.parametrize("env, launcher", [({"PMI_SIZE": "3", "PMI_RANK": "1"}, "mpiexec"),
                                           ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x",
                                             "MASTER_PORT": "1"}, "torchrun")])
def test_a_world_of_one_under_a_launcher_of_several_is_refused(monkeypatch, env, launcher):
    """--transport local under a launcher that started several processes: each would run the
    whole job and write the same log, so it is refused, naming the launcher and the count."""
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(CommConfigError) as info:
        World.detect(transport="local")
    size = env.get("PMI_SIZE") or env["WORLD_SIZE"]
    assert str(info.value) == (
        f"--transport local runs every node in this process, but {launcher} started {size} "
        "processes: each would run the whole job and write the same files; leave --transport "
        "out (auto) to join them, or start the script without a launcher")


def test_a_world_of_one_without_a_launcher_is_fine(monkeypatch):
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert World.detect(transport="local").size == 1
