"""Checkpoints that were altered, damaged, shared or misused: a fallback or one clean error."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.checkpoint import Checkpointer
from gossip.engine import Engine
from gossip.errors import CheckpointError
from tests.helpers.launch import run_py

ARGS = ["experiments/consensus.py", "--nodes", "4", "--dim", "16", "--compressor", "topk:0.25",
        "--gamma", "0.2", "--dtype", "float64", "--log-every", "2"]


def rounds_of(path: Path) -> list[dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in recs if r["type"] == "round"]


def clean_error(res, *needles: str) -> str:
    assert res.returncode != 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr
    return res.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 12-round run checkpointed at rounds 10 and 12, plus a 20-round reference log."""
    base = tmp_path_factory.mktemp("finished")
    res = run_py([*ARGS, "--rounds", "12", "--checkpoint-dir", str(base / "ck"),
                  "--checkpoint-every", "5", "--out", str(base / "run.jsonl")])
    assert res.returncode == 0, res.stderr
    res = run_py([*ARGS, "--rounds", "20", "--out", str(base / "full20.jsonl")])
    assert res.returncode == 0, res.stderr
    return base


def copy_of(finished: Path, tmp_path: Path, complete: bool = False) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(finished / "ck", ck)
    m = json.loads((ck / "run00" / "manifest.json").read_text())
    assert m["rounds"] == [10, 12] and set(m["files"]["12"]) == {f"node-000{i}.pt" for i in range(4)} | {"engine.pt"}
    m["complete"] = complete  # as if killed after its last checkpoint
    (ck / "run00" / "manifest.json").write_text(json.dumps(m))
    return ck


def test_refused_resume_leaves_the_log_and_names_only_the_differing_keys(finished, tmp_path):
    log = tmp_path / "run.jsonl"
    shutil.copy(finished / "run.jsonl", log)
    before = log.read_bytes()
    res = run_py([*ARGS, "--rounds", "12", "--gamma", "0.5", "--out", str(log), "--resume",
                  str(copy_of(finished, tmp_path))])
    err = clean_error(res, "different run", "--gamma: checkpoint [0.2], now [0.5]", "--gamma 0.2")
    assert "--dim" not in err and "--compressor" not in err  # keys that agree are not listed
    assert log.read_bytes() == before
    res = run_py([*ARGS[:7], *ARGS[9:], "--rounds", "12", "--out", str(log), "--resume", str(tmp_path / "ck")])
    clean_error(res, "left out, so at their default now: --gamma (checkpoint [0.2], default None)",
                "resume with the checkpointed run's flags (--gamma 0.2)")
    assert "changed:" not in res.stderr and log.read_bytes() == before


def test_a_flag_given_only_now_says_the_checkpoint_left_it_out(finished, tmp_path):
    """A flag the checkpointed run left at its default and this one gives reads as such, not
    as a raw "checkpoint None"."""
    res = run_py([*ARGS, "--rounds", "12", "--shape", "4x4", "--out", str(tmp_path / "s.jsonl"),
                  "--resume", str(copy_of(finished, tmp_path))])
    err = clean_error(res, "changed: --shape: checkpoint left it out (default None), now '4x4'",
                      "(without --shape)")
    assert "checkpoint None" not in err


def test_a_flipped_bit_falls_back_to_the_older_round(finished, tmp_path):
    ck = copy_of(finished, tmp_path)
    node = ck / "run00" / "round-000012" / "node-0001.pt"
    data = bytearray(node.read_bytes())
    data[-200] ^= 0x01
    node.write_bytes(bytes(data))
    res = run_py([*ARGS, "--rounds", "20", "--out", str(tmp_path / "b.jsonl"), "--resume", str(ck)])
    assert res.returncode == 0, res.stderr
    assert "node-0001.pt" in res.stderr and "SHA-256" in res.stderr
    assert "resumed from the checkpoint of round 10" in res.stderr
    assert rounds_of(tmp_path / "b.jsonl") == rounds_of(finished / "full20.jsonl")


def test_a_finished_run_continues_with_more_rounds(finished, tmp_path):
    ck = copy_of(finished, tmp_path, complete=True)
    res = run_py([*ARGS, "--rounds", "20", "--out", str(tmp_path / "c.jsonl"), "--resume", str(ck)])
    assert res.returncode == 0, res.stderr
    assert "continuing the finished run from round 12 to 20" in res.stderr
    assert rounds_of(tmp_path / "c.jsonl") == rounds_of(finished / "full20.jsonl")
    recs = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [r["type"] for r in recs].count("summary") == 1 and recs[-1]["rounds"] == 20


@pytest.mark.parametrize("cut, complete", [("summary", True), ('"round": 12,', False),
                                           ('"round": 8,', False), ('"round": 8,', True)])
def test_a_cut_last_records_line_is_dropped_and_the_run_resumes_whole(finished, tmp_path, cut,
                                                                      complete):
    """A crash or a full disk cuts records.jsonl's last line (of a finished run, or of one
    killed after its last checkpoint): the resume drops it with a warning naming the line and
    restarts from a checkpoint whose records are intact (the last, round 10, or none: round 0),
    so the log is whole and ends with its summary."""
    ck = copy_of(finished, tmp_path, complete=complete)
    path = ck / "run00" / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    at = next(k for k, line in enumerate(lines) if cut.encode() in line)
    path.write_bytes(b"".join(lines[:at]) + lines[at][:len(lines[at]) // 2])
    log = tmp_path / "r.jsonl"
    res = run_py([*ARGS, "--rounds", "12", "--out", str(log), "--resume", str(ck)])
    assert res.returncode == 0, res.stderr
    assert f"records.jsonl, line {at + 1} (the last) is cut off" in res.stderr, res.stderr
    assert rounds_of(log) == rounds_of(finished / "run.jsonl")
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["type"] for r in recs].count("config") == 1
    assert recs[-1]["type"] == "summary" and recs[-1]["rounds"] == 12


# -- the library, in process -----------------------------------------------------------------------


def engine() -> Engine:
    topo = topologies.build("ring", 4)
    return Engine(make_algorithm("choco", gamma=0.2), topo,
                  lambda i: torch.arange(6, dtype=torch.float64) * (i + 1), compressor="topk:0.5")


def saved(tmp_path: Path) -> tuple[Engine, Checkpointer]:
    eng = engine()
    ck = Checkpointer(tmp_path / "run00", {"test": 1})
    for _ in range(2):
        eng.run(3, log_every=3)
        ck.save(eng)
    return eng, ck


def rewrite(ck: Checkpointer, round_: int, name: str, change) -> None:
    """Alter a file of a round and record its new checksum, as a consistent but wrong state."""
    path = ck.dir / f"round-{round_:06d}" / name
    blob = torch.load(path, weights_only=True)
    change(blob)
    torch.save(blob, path)
    m = json.loads((ck.dir / "manifest.json").read_text())
    m["files"][str(round_)][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (ck.dir / "manifest.json").write_text(json.dumps(m))


def wrong_shape(blob):
    blob["x"] = torch.zeros(3, dtype=torch.float64)


def no_generator(blob):
    del blob["generator"]


def bad_generator(blob):
    blob["generator"] = torch.zeros(5, dtype=torch.uint8)


@pytest.mark.parametrize("change", [wrong_shape, no_generator, bad_generator])
def test_unusable_node_state_falls_back_then_names_the_file(tmp_path, change):
    _, ck = saved(tmp_path)
    rewrite(ck, 6, "node-0002.pt", change)
    fresh = engine()
    assert ck.restore(fresh) == 3  # the newest round is refused, the older one loads
    rewrite(ck, 3, "node-0002.pt", change)
    with pytest.raises(CheckpointError, match=r"no intact checkpoint left.*round-000003/node-0002\.pt"):
        ck.restore(engine())
    ck.close()


@pytest.mark.parametrize("claimed_format", [3, 2])
def test_another_runs_files_under_a_forged_manifest_are_refused_naming_both_hashes(
        tmp_path, claimed_format):
    """Run A's files under a manifest forged to carry run B's identity (and A's checksums):
    every file names the run that wrote it, so B's resume refuses them, naming both config
    hashes, whatever format the manifest claims."""
    _, a = saved(tmp_path)
    b = Checkpointer(tmp_path / "b", {"test": 2})
    eng = engine()
    eng.run(3, log_every=3)
    b.save(eng)
    forged = json.loads((b.dir / "manifest.json").read_text())
    forged |= {k: json.loads((a.dir / "manifest.json").read_text())[k] for k in ("rounds", "files")}
    forged["format"] = claimed_format
    (a.dir / "manifest.json").write_text(json.dumps(forged))
    a.close()
    b.close()
    b_on_a = Checkpointer(a.dir, {"test": 2})
    with pytest.raises(CheckpointError, match="no intact checkpoint left") as exc:
        b_on_a.restore(engine())
    assert a.fingerprint in str(exc.value) and b.fingerprint in str(exc.value)
    b_on_a.close()


def test_files_of_an_older_version_load_with_a_warning_only_where_the_manifest_admits_them(
        tmp_path, caplog):
    """Files that name no run (written before checkpoints named their run) load with a warning
    under a format-2 manifest and the rounds it kept (``unbound`` once rewritten); a format-3
    manifest that does not list them refuses them."""
    from gossip.checkpoint import RUN_KEY

    _, ck = saved(tmp_path)
    for r in (3, 6):
        for name in ["engine.pt"] + [f"node-000{i}.pt" for i in range(4)]:
            rewrite(ck, r, name, lambda blob: blob.pop(RUN_KEY))
    with pytest.raises(CheckpointError, match="names no run"):
        ck.restore(engine())
    m = json.loads((ck.dir / "manifest.json").read_text())
    (ck.dir / "manifest.json").write_text(json.dumps(m | {"format": 2}))
    eng = engine()
    with caplog.at_level("WARNING", logger="gossip.checkpoint"):
        assert ck.restore(eng) == 6
    assert "written by an older version and name no run" in caplog.text
    eng.run(3, log_every=3)
    ck.save(eng)  # rewritten as format 3: round 6 is kept as unbound, round 9 names the run
    m = json.loads((ck.dir / "manifest.json").read_text())
    assert m["format"] == 3 and m["unbound"] == [6] and m["rounds"] == [6, 9]
    assert ck.restore(engine()) == 9
    ck.close()


class _Code:
    """An object whose unpickling would call a function: what weights_only refuses."""

    def __reduce__(self):
        return (print, ("code ran",))


def test_a_pickled_object_is_refused_without_advising_an_unsafe_load(tmp_path, caplog, capsys):
    """A node file holding a pickled object (its checksum forged to match) falls back to the
    older round; the warning names the object and never advises ``weights_only=False``."""
    _, ck = saved(tmp_path)
    rewrite(ck, 6, "node-0002.pt", lambda blob: blob.__setitem__("x", _Code()))
    with caplog.at_level("WARNING", logger="gossip.checkpoint"):
        assert ck.restore(engine()) == 3
    text = caplog.text
    assert "node-0002.pt" in text and "GLOBAL print" in text, text
    assert "weights_only" not in text and "trust" not in text, text
    assert "code ran" not in capsys.readouterr().out
    ck.close()


@pytest.mark.parametrize("text", ["[1, 2]", '{"format": 2}', "{not json", '{"format": 2, "fingerprint": "a", '
                                  '"identity": {}, "rounds": ["x"], "files": {}}'])
def test_a_bad_manifest_is_a_checkpoint_error(tmp_path, text):
    _, ck = saved(tmp_path)
    (ck.dir / "manifest.json").write_text(text)
    with pytest.raises(CheckpointError, match="manifest.json"):
        ck.restore(engine())
    ck.close()


def test_stray_round_directories_are_left_alone(tmp_path):
    eng, ck = saved(tmp_path)
    (ck.dir / "round-junk").mkdir()
    (ck.dir / "round-0000").mkdir()
    eng.run(3, log_every=3)
    ck.save(eng)
    assert sorted(p.name for p in ck.dir.glob("round-*")) == [
        "round-0000", "round-000006", "round-000009", "round-junk"]
    ck.close()


def test_two_runs_cannot_share_a_checkpoint_directory(tmp_path):
    first = Checkpointer(tmp_path / "run00", {"test": 1})
    with pytest.raises(CheckpointError, match="in use by another run"):
        Checkpointer(tmp_path / "run00", {"test": 2})
    first.close()
    Checkpointer(tmp_path / "run00", {"test": 2}).close()  # free again once the first is done


def test_a_finished_run_with_a_length_dependent_schedule_says_why_it_cannot_continue(tmp_path, capsys):
    from gossip.cli import guarded
    from tests.helpers.launch import script

    train = script("train")
    args = ["--data", "synthetic", "--synthetic-samples", "200", "--nodes", "2", "--hidden", "8",
            "--schedule", "cosine", "--log-every", "2"]
    train.main([*args, "--rounds", "4", "--checkpoint-dir", str(tmp_path / "ck")])
    log = tmp_path / "more.jsonl"
    with pytest.raises(SystemExit) as exc:
        guarded(lambda: train.main([*args, "--rounds", "6", "--resume", str(tmp_path / "ck"),
                                    "--out", str(log)]))
    assert exc.value.code == 1  # a refused checkpoint: the run could not go on
    err = capsys.readouterr().err
    assert "finished at round 4 and cannot be continued to round 6" in err
    assert "learning-rate schedule" in err
    assert not log.exists()


# -- damaged records and manifests, write failures (issue 26) -------------------------------------


@pytest.mark.parametrize("line", ["5", '{"type": "round"}', '{"type": "summary", "rounds": "x"}',
                                  "{not json"])
def test_a_damaged_records_line_is_named_by_its_number(tmp_path, line):
    _, ck = saved(tmp_path)
    path = ck.dir / "records.jsonl"
    path.write_text('{"type": "config"}\n' + line + '\n{"type": "round", "round": 3}\n')
    with pytest.raises(CheckpointError, match=r"records\.jsonl, line 2: .*repair or delete"):
        ck.records_until(6)
    path.write_text('{"type": "config"}\n{"type": "round", "round": 3}\n{"type": "ro')  # torn by a kill
    assert [r["type"] for r in ck.records_until(6)] == ["config", "round"]
    ck.close()


def test_a_manifest_over_the_size_bound_is_refused_unread(tmp_path, monkeypatch):
    import gossip.checkpoint as checkpoint

    _, ck = saved(tmp_path)
    monkeypatch.setattr(checkpoint, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(CheckpointError, match=r"manifest\.json is \d+ bytes, more than the 100"):
        ck.manifest()
    ck.close()


def test_many_unreadable_rounds_are_summed_up_in_one_warning(tmp_path, caplog):
    _, ck = saved(tmp_path)
    m = json.loads((ck.dir / "manifest.json").read_text())
    m["rounds"] = list(range(100, 200)) + m["rounds"]  # 100 rounds whose files are missing
    (ck.dir / "manifest.json").write_text(json.dumps(m))
    with caplog.at_level("WARNING", logger="gossip.checkpoint"):
        assert ck.restore(engine()) == 6
    assert len(caplog.records) == 4  # WARN_ROUNDS one by one, then one line for the other 97
    assert "97 older checkpoint(s) are unreadable too (rounds 100 to 196" in caplog.records[-1].message
    ck.close()


def test_a_format_1_manifest_is_loaded_with_a_warning_and_rewritten_as_the_current_format(tmp_path, caplog):
    eng, ck = saved(tmp_path)
    m = json.loads((ck.dir / "manifest.json").read_text())
    (ck.dir / "manifest.json").write_text(json.dumps({k: v for k, v in m.items() if k != "files"}
                                                     | {"format": 1}))
    with caplog.at_level("WARNING", logger="gossip.checkpoint"):
        assert ck.restore(engine()) == 6
    assert "is format 1 (no checksums)" in caplog.text and "without a SHA-256 check" in caplog.text
    eng.run(3, log_every=3)
    ck.save(eng)
    m2 = json.loads((ck.dir / "manifest.json").read_text())
    assert m2["format"] == 3 and m2["rounds"] == [6, 9] and set(m2["files"]) == {"6", "9"}
    assert m2["files"]["6"] == m["files"]["6"]  # the kept round's checksums, from its files
    ck.close()


def test_a_checkpoint_that_cannot_be_written_keeps_the_last_good_one(tmp_path, monkeypatch):
    import errno

    import gossip.checkpoint as checkpoint

    eng, ck = saved(tmp_path)
    real = checkpoint.atomic_save

    def full_disk(obj, path):
        if path.name == "node-0002.pt":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(obj, path)

    monkeypatch.setattr(checkpoint, "atomic_save", full_disk)
    eng.run(3, log_every=3)
    with pytest.raises(CheckpointError, match=r"round-000009/node-0002\.pt \(No space left on device "
                                              r"\[ENOSPC\]\).*checkpoint of round 6 are kept.*free "
                                              r"disk space.*resume with --resume"):
        ck.save(eng)
    assert ck.saved_rounds() == [3, 6] and not (ck.dir / "round-000009").exists()
    monkeypatch.setattr(checkpoint, "atomic_save", real)
    assert ck.restore(engine()) == 6
    ck.close()


def test_a_log_line_that_does_not_fit_is_taken_back(tmp_path):
    import errno

    from gossip.errors import OutputError
    from gossip.metrics import JsonlLogger

    log = JsonlLogger(tmp_path / "run.jsonl")
    log.write({"type": "config"})
    calls = []

    class Half:  # writes half of what it is given, then the disk is full
        def __init__(self, fh):
            self.fh = fh

        def write(self, data):
            if calls:
                raise OSError(errno.ENOSPC, "No space left on device")
            calls.append(1)
            return self.fh.write(data[: len(data) // 2])

        def __getattr__(self, name):
            return getattr(self.fh, name)

    log._fh = Half(log._fh)
    with pytest.raises(OutputError, match=r"run\.jsonl \(--out\): No space left on device \[ENOSPC\]; "
                                          r"the run stops here, with the 1 record\(s\)"):
        log.write({"type": "round", "round": 1, "pad": "x" * 100})
    log.close()
    assert (tmp_path / "run.jsonl").read_text() == '{"type": "config"}\n'
    with JsonlLogger("/dev/full") as full, pytest.raises(OutputError, match=r"cannot write the log "
                                                          r"/dev/full \(--out\): No space left"):
        full.write({"type": "config"})


def test_a_checkpoint_directory_that_cannot_be_made_is_one_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=r"cannot create the checkpoint directory .*file/ck/run00: "
                                              r"Not a directory \[ENOTDIR\]; give --checkpoint-dir"):
        Checkpointer(tmp_path / "file" / "ck" / "run00", {"test": 1})


def test_the_checkpoints_agreement_is_not_labelled_metrics(tmp_path, monkeypatch):
    """The vote on every node's write status after a save names the checkpoint in a timeout
    (it was "metrics: the per-node values of", as if a metric had stalled)."""
    from gossip.comm.world import World

    labels: list[str] = []
    real = World.node_values

    def spy(self, n, local, what="metrics: the per-node values of", **kw):
        labels.append(what)
        return real(self, n, local, what=what, **kw)

    monkeypatch.setattr(World, "node_values", spy)
    eng, ck = saved(tmp_path)
    ck.close()
    votes = [w for w in labels if "checkpoint" in w]
    assert votes and set(votes) == {"the write status of round 3's checkpoint from",
                                    "the write status of round 6's checkpoint from"}, labels
