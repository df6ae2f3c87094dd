"""Every entry of a multi-run script (``--compare``, several ``--compressor``, a sweep file) is
built and checked before the first one runs: a refusal of the last entry names it, comes
before any record is written, and costs no earlier run."""

from __future__ import annotations

import time

import pytest

from tests.helpers.launch import script

LAUNCHES_MARKED_PER_TEST = True  # none launches: mpiexec commands are only printed (--dry-run) (tests/conftest.py)

STALE_LAST = ["--compare", "lead@lead:2", "choco@topk:0.25", "extra@none",
              "--network", "stale=2", "--nodes", "8", "--dim", "50"]


@pytest.mark.slow
def test_compare_refuses_its_last_entry_before_the_first_runs(tmp_path):
    optimize = script("optimize")
    log = tmp_path / "runs.jsonl"
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        optimize.main([*STALE_LAST, "--iterations", "3000", "--out", str(log)])
    took = time.perf_counter() - start
    assert "'extra@none'" in str(exc.value) and "stale" in str(exc.value)
    assert not log.exists()  # no partial run: the earlier entries never started
    assert took < 30  # the two runs before it take minutes at 3000 iterations


def test_consensus_refuses_a_later_compressor_before_the_first_run(tmp_path):
    consensus = script("consensus")
    log = tmp_path / "runs.jsonl"
    with pytest.raises(SystemExit) as exc:  # top-k of 500 entries of a 50-entry vector
        consensus.main(["--compressor", "none", "topk:500", "--dim", "50", "--nodes", "6",
                        "--rounds", "2000", "--out", str(log)])
    assert "--compressor 'topk:500'" in str(exc.value)
    assert not log.exists()


def test_sweep_refuses_its_last_run_before_any_run(tmp_path):
    compare = script("compare")
    sweep = tmp_path / "s.toml"
    sweep.write_text('script = "optimize"\n[defaults]\niterations = 3000\nnodes = 8\ndim = 50\n'
                     'network = "stale=2"\n'
                     '[[run]]\nlabel = "broadcast"\nalgorithm = "lead"\ncompressor = "lead:2"\n'
                     '[[run]]\nlabel = "edge"\nalgorithm = "extra"\ncompressor = "none"\n')
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        compare.main([str(sweep), "--out", str(out)])
    assert "run 'edge'" in str(exc.value) and "extra" in str(exc.value)
    assert not list(out.glob("*.jsonl"))  # the first run did not start


@pytest.mark.slow
def test_sweep_checks_a_training_run_whole(tmp_path):
    """Past its flags: a train.py entry whose algorithm refuses the graph is refused up front."""
    compare = script("compare")
    sweep = tmp_path / "s.toml"
    sweep.write_text('script = "train"\n[defaults]\nrounds = 2\nnodes = 4\nhidden = [8]\n'
                     '[[run]]\nlabel = "fine"\nalgorithm = "dpsgd"\n'
                     '[[run]]\nlabel = "needs a complete graph"\nalgorithm = "adasum"\n')
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        compare.main([str(sweep), "--out", str(out)])
    assert "run 'needs a complete graph'" in str(exc.value)
    assert not list(out.glob("*.jsonl"))


def test_sweep_checks_a_free_run_for_mpiexec_as_its_in_process_twin(tmp_path):
    """--free-run needs one node per rank: a run for mpiexec is checked without it (what
    depends on the ranks is checked when it starts), one in this process is refused."""
    compare = script("compare")
    sweep = tmp_path / "s.toml"
    body = ('[defaults]\niterations = 5\nnodes = 4\nnetwork = "compute=exp:1"\nfree-run = 0.01\n'
            '[[run]]\nlabel = "async"\nalgorithm = "ad-psgd"\n')
    sweep.write_text('script = "optimize"\nmpi = 4\n' + body)
    text = compare.main([str(sweep), "--dry-run", "--out", str(tmp_path / "out")])
    assert text.startswith("mpiexec -n 4 ") and "--free-run=0.01" in text
    sweep.write_text('script = "optimize"\nmpi = 0\n' + body)
    with pytest.raises(SystemExit, match="run 'async'.*--free-run needs mpiexec"):
        compare.main([str(sweep), "--dry-run", "--out", str(tmp_path / "out")])
