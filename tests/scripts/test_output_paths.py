"""Output paths a run cannot write: one `error:` line, no traceback, files left as they were."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys

import pytest

from tests.helpers.launch import ROOT

RUN = ["experiments/consensus.py", "--nodes", "4", "--rounds", "3", "--dim", "8"]


def run(args, fsize=None, no_root=False):
    cmd = [sys.executable, *RUN, *args]
    if no_root and os.geteuid() == 0:  # root ignores permissions: drop the capability that does it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions are not enforced")
        caps = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", *cmd]

    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=limit)


def one_error(res, *needles):
    assert res.returncode in (1, 2), res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def ro(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    (d / "old.jsonl").write_text("keep\n")
    (d / "old.jsonl").chmod(0o444)
    d.chmod(0o555)
    yield d
    d.chmod(0o755)


@pytest.mark.parametrize("flag, name", [("--out", "a.jsonl"), ("--out", "old.jsonl"),
                                        ("--out", "sub/a.jsonl"), ("--plot", "p.png"),
                                        ("--checkpoint-dir", "ck")])
def test_a_read_only_directory_is_refused_before_the_run(ro, flag, name):
    one_error(run([flag, str(ro / name)], no_root=True), flag, str(ro / name))
    assert sorted(p.name for p in ro.iterdir()) == ["old.jsonl"]
    assert (ro / "old.jsonl").read_text() == "keep\n"


@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_a_directory_given_as_a_file_is_refused(tmp_path, flag):
    one_error(run([flag, str(tmp_path)]), flag, "is a directory")


def test_a_parent_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    for flag in ("--out", "--checkpoint-dir"):
        one_error(run([flag, str(tmp_path / "f" / "x")]), flag, "is not a directory")


def test_dev_full_stops_before_round_1():
    one_error(run(["--out", "/dev/full"]), "/dev/full (--out)", "No space left on device")


def test_a_plot_that_cannot_be_written_after_the_run_is_status_1():
    res = run(["--plot", "/dev/full"])
    one_error(res, "cannot write the plot /dev/full (--plot)", "No space left on device [ENOSPC]")
    assert res.returncode == 1 and "| choco none " in res.stdout  # the run happened, its table too
    assert not os.path.exists("/dev/full.png")  # the path given, never one with a suffix added


def test_a_bad_plot_suffix_is_one_line(tmp_path):
    one_error(run(["--plot", str(tmp_path / "p.xyz")]), "--plot", "not an image format")
    assert not list(tmp_path.iterdir())


def test_a_file_size_limit_mid_run_keeps_whole_records(tmp_path):
    log = tmp_path / "a.jsonl"
    res = run(["--rounds", "30", "--log-every", "1", "--out", str(log)], fsize=3000)
    one_error(res, "(--out): File too large [EFBIG]", "record(s) written before kept whole")
    assert res.returncode == 1, "the run had started: a failed run, not bad input"
    text = log.read_text()
    assert text.endswith("\n") and all(line.startswith("{") for line in text.splitlines())


def test_a_file_size_limit_on_the_checkpoint_keeps_the_last_good_round(tmp_path):
    ck = tmp_path / "ck"
    args = ["--rounds", "40", "--log-every", "1", "--checkpoint-dir", str(ck),
            "--checkpoint-every", "5"]
    one_error(run(args, fsize=8000), "records.jsonl (File too large [EFBIG])",
              "the checkpoint of round", f"resume with --resume {ck}")
    res = run(["--rounds", "40", "--log-every", "1", "--resume", str(ck), "--out",
               str(tmp_path / "r.jsonl")])
    assert res.returncode == 0, res.stderr
    assert "resumed from the checkpoint of round" in res.stderr


@pytest.mark.parametrize("flags, needle", [
    (["--out", "/dev/full"], "error: --out /dev/full is not a directory"),
    (["--plot", "digits.zzz"], "'.zzz' is not an image format matplotlib writes"),
])
def test_federated_digits_checks_its_paths_before_the_first_run(tmp_path, flags, needle):
    """federated_digits.py's --out is a folder of logs and --plot an image: a path that cannot
    be either is one error: line, status 2, before any training (no log folder made)."""
    logs = tmp_path / "logs"
    args = ["--out", str(logs), *(str(tmp_path / f) if f.endswith(".zzz") else f for f in flags)]
    res = subprocess.run([sys.executable, "experiments/federated_digits.py", "--only", "FedAvg",
                          "--rounds", "1", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert res.returncode == 2, res.stderr
    one_error(res, needle)
    assert not logs.exists()


def test_an_output_over_an_input_file_is_refused_and_the_input_kept(tmp_path):
    """--out naming the --config file (or --plot the --init file) would destroy the input the
    run reads: refused before the run, the file untouched."""
    import numpy as np

    config = tmp_path / "run.toml"
    config.write_text("nodes = 4\ndim = 8\nrounds = 3\n")
    res = run(["--config", str(config), "--out", str(config)])
    one_error(res, f"--out {config} is the --config file this run reads", "another path")
    assert config.read_text() == "nodes = 4\ndim = 8\nrounds = 3\n"
    init = tmp_path / "x0.npy"
    np.save(init, np.ones((4, 8)))
    before = init.read_bytes()
    res = run(["--init", str(init), "--plot", str(init)])
    one_error(res, f"--plot {init} is the --init file this run reads")
    assert init.read_bytes() == before


def test_a_log_and_checkpoints_at_one_path_are_refused(tmp_path):
    res = run(["--out", str(tmp_path / "a"), "--checkpoint-dir", str(tmp_path / "a")])
    one_error(res, f"--out and --checkpoint-dir are the same path ({tmp_path / 'a'})")
    assert res.returncode == 2 and not (tmp_path / "a").exists()
