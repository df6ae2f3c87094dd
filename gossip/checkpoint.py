"""Checkpoints a run can resume from bit for bit, and the stop signals that trigger a last one.

Layout of a run's directory::

    DIR/run00/manifest.json              last round every node completed + the run's identity
    DIR/run00/records.jsonl              every log record so far (replayed on resume)
    DIR/run00/round-000120/node-0003.pt  one file per node: its whole state
    DIR/run00/lock                       held (flock) by the run using the directory

Each node file holds the model, the algorithm's state, the node's generator state (the
counter-based streams of :mod:`gossip.rng` are keyed by round and need none), stateful
compressors (low-rank warm starts), the oracle's estimator/optimizer state and the node's
byte counter. Files are written to a temporary name, fsynced and renamed; the
manifest moves to a round only after every process wrote its nodes, and the previous round is
kept until the new one is complete. The manifest holds the SHA-256 of every file of a round;
a file whose bytes differ, that cannot be read or that does not fit the run (shapes, keys,
generator states) makes the resume fall back to the previous round, and a
:class:`CheckpointError` naming the file is raised only when no round is left. Loading uses
``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary objects.
A finished run saves its last round too, so a resume with more rounds continues it.

Every failure is one :class:`CheckpointError` whose message says what was wrong and the fix,
and loses nothing: a file that cannot be written (no permission, disk full, a file-size limit)
stops the run with every record written so far (a line that did not fit is taken back) and the
last good checkpoint (a round is in the manifest only once all its files were written); a
manifest larger than :data:`MAX_MANIFEST_BYTES` is refused unread; a damaged ``records.jsonl``
line is named by its number, except a cut last line (a crash or a full disk), which is dropped
with a warning, the resume starting from the newest checkpoint whose records are intact; rounds
that cannot be loaded are warned about one by one up to :data:`WARN_ROUNDS`, the rest in one
line with a count. A round loaded without a SHA-256 check
(a format-1 manifest, or a round the manifest lists no checksums for) says so in a warning; the
manifest is always rewritten as format 3, with the checksums of every round it keeps. Every file
also holds the fingerprint (config hash) of the run that wrote it: one naming another run is
refused, naming both hashes, whatever the manifest says (a round written by an older version,
whose files name no run, is loaded with a warning; the manifest lists such rounds as
``unbound``).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import pickle
import re
import shlex
import shutil
import signal
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gossip.errors import CheckpointError, GossipError, Interrupted
from gossip.outputs import os_reason, write_all, write_fix

log = logging.getLogger(__name__)

FORMAT = 3
"""3: every file names its run (:data:`RUN_KEY`); 2: per-file SHA-256 in the manifest
("files"); 1: no checksums. Formats 1 and 2 are still read."""
RUN_KEY = "run_fingerprint"
"""The key, in every node file and ``engine.pt``, of the fingerprint (config hash) of the run
that wrote it: a file of another run is refused even under a manifest altered to admit it."""
ROUND_DIR = re.compile(r"round-(\d{6,})")
MAX_MANIFEST_BYTES = 64 << 20
"""A manifest holds a run's identity and one checksum per file of the rounds it keeps (a few
hundred bytes per node); one larger than this is not a manifest this library wrote."""
WARN_ROUNDS = 3
"""Unreadable rounds warned about one by one on resume; the others are counted in one line."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write, fsync and rename, so a reader sees the old file or the whole new one (and a
    write that fails leaves the old one, and no temporary file, behind)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def atomic_save(obj: Any, path: Path) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(identity: dict[str, Any]) -> str:
    """A short hash of what makes a run this run (topology, algorithm, compressor, layout…)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Checkpointer:
    """Saves a run every ``every`` rounds under ``directory`` and restores it.

    ``identity`` describes the run (algorithm, hyper-parameters, compressor, topology, world
    layout, code version); a checkpoint made with another identity is refused on resume.
    ``flags`` (``{dest: (option string, default)}``, as :func:`gossip.config.flag_defaults`
    gives) lets that refusal name the command-line flags of the ``args`` that differ and say
    which of them differ only because the flag was left out (its default now).
    """

    def __init__(self, directory: str | Path, identity: dict[str, Any], every: int = 0,
                 world: Any = None, keep: int = 2,
                 flags: Mapping[str, tuple[str, Any]] | None = None):
        self.dir = Path(directory)
        self.identity = identity
        self.fingerprint = fingerprint(identity)
        self.every = int(every)
        self.world = world
        self.keep = keep
        self.flags = dict(flags or {})
        self._stop_signal: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self._lock: Any = None
        self._saved_round: int | None = None
        self._torn: int | None = None  # see records_intact_until()
        self._torn_warned = False
        self._unnamed = False  # the round being loaded has a file naming no run
        if self.is_root:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot create the checkpoint directory {self.dir}: {os_reason(exc)}; give "
                    "--checkpoint-dir a directory you can write to"
                ) from None
            self._acquire_lock()

    def _acquire_lock(self) -> None:
        """Hold ``DIR/lock`` while this run uses the directory (freed when the process dies)."""
        path = self.dir / "lock"
        try:
            fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (closed in close())
        except OSError as exc:
            raise self._unwritable(path, exc) from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            owner = fh.read().strip() or "another process"
            fh.close()
            raise CheckpointError(
                f"{self.dir} is in use by another run ({owner}); two runs sharing a checkpoint "
                "directory overwrite each other's files: give this one its own --checkpoint-dir"
            ) from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()}\n")
            fh.flush()
        except OSError as exc:
            fh.close()
            raise self._unwritable(path, exc) from None
        self._lock = fh

    def _unwritable(self, path: Path, exc: OSError) -> CheckpointError:
        return CheckpointError(
            f"cannot write in the checkpoint directory {self.dir} ({path}: {os_reason(exc)}); a "
            f"run, and a resume, writes there: {write_fix(exc.errno)}, or give another "
            "--checkpoint-dir"
        )

    def close(self) -> None:
        """Release the directory lock."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @property
    def is_root(self) -> bool:
        return self.world is None or self.world.is_root

    # -- write failures --------------------------------------------------------------------
    def _write_error(self, what: str, code: int | None, round: int | None = None) -> CheckpointError:
        """One error for a file that could not be written: what, what is kept, and the fix."""
        return CheckpointError(f"cannot write {what}; the run stops here. {self._kept()}: "
                               f"{write_fix(code)}, then {self._next_step()}", round=round)

    def _last_good(self) -> int | None:
        try:
            m = self.manifest()
        except CheckpointError:
            return None
        return max(m["rounds"]) if m and m["rounds"] else None

    def _kept(self) -> str:
        last = self._last_good()
        if last is None:
            return "Every record written so far is kept in records.jsonl (no checkpoint was complete yet)"
        return (f"Every record written so far and the checkpoint of round {last} are kept in "
                f"{self.dir}")

    def resume_note(self) -> str:
        """How to go on after a failure outside the checkpoint directory (e.g. the ``--out``
        log): the last good checkpoint and the command that resumes it ("" when none)."""
        last = self._last_good()
        if last is None:
            return ""
        return (f"The checkpoint of round {last} is kept in {self.dir}: {self._next_step()} (the "
                "log is written again from its records)")

    def _next_step(self) -> str:
        if self._last_good() is None:
            return "run it again"
        root = self.dir.parent if re.fullmatch(r"run\d+", self.dir.name) else self.dir
        return f"resume with --resume {root}"

    # -- records -------------------------------------------------------------------------
    def append_record(self, record: dict[str, Any]) -> None:
        """Append one record to ``records.jsonl``, whole or not at all."""
        if self.is_root:
            path = self.dir / "records.jsonl"
            line = (json.dumps(record, default=str) + "\n").encode()
            try:
                with open(path, "ab", buffering=0) as fh:
                    write_all(fh, line)
            except OSError as exc:
                raise self._write_error(f"{path} ({os_reason(exc)})", exc.errno) from None

    def records_until(self, round_: int) -> list[dict[str, Any]]:
        """Stored records up to ``round_`` (config first), to replay into a fresh log."""
        out = []
        for rec in self._records():
            if rec["type"] == "round" and rec["round"] > round_:
                continue
            if rec["type"] == "summary" and round_ < rec["rounds"]:
                continue
            out.append(rec)
        return out

    def _records(self) -> list[dict[str, Any]]:
        """Every stored record, each checked. A torn last line (what a kill, a crash or a full
        disk leaves) is dropped with a warning; :meth:`records_intact_until` then bounds the
        rounds a resume may restart from. An undecodable line before the last is an error
        naming it."""
        path = self.dir / "records.jsonl"
        out: list[dict[str, Any]] = []
        torn: tuple[int, bytes] | None = None
        try:
            with open(path, "rb") as fh:
                for number, line in enumerate(fh, 1):
                    if torn is not None:  # an undecodable line that was not the last
                        raise self._bad_record(path, torn[0], "not JSON")
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except (ValueError, RecursionError):
                        torn = (number, line)
                        continue
                    problem = _record_problem(rec)
                    if problem:
                        raise self._bad_record(path, number, problem)
                    out.append(rec)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {os_reason(exc)}; make it readable, or "
                                  "start the run again with a new --checkpoint-dir") from None
        self._torn = None
        if torn is not None:
            self._torn = _torn_limit(torn[1], out)
            if not self._torn_warned and self.is_root:  # every process reads it: one says so
                self._torn_warned = True
                log.warning("%s, line %d (the last) is cut off, as a crash or a full disk "
                            "leaves it: dropped; a resume starts from a checkpoint whose records "
                            "are all intact (%s)", path, torn[0],
                            "only the summary was cut" if self._torn is None
                            else f"round {max(self._torn, 0)} at most")
        return out

    def records_intact_until(self) -> int | None:
        """The last round a resume may restart from with every record up to it kept: None when
        ``records.jsonl`` is whole (or only a summary was cut), else the round before the cut
        line's (-1: no round's records are intact)."""
        self._records()
        return self._torn

    def _bad_record(self, path: Path, number: int, problem: str) -> CheckpointError:
        return CheckpointError(
            f"{path}, line {number}: {problem}; the file was altered or damaged: repair or delete "
            "that line (records after the checkpoint's round are recomputed anyway), or start the "
            "run again with a new --checkpoint-dir"
        )

    def reset_records(self, records: list[dict[str, Any]]) -> None:
        if self.is_root:
            path = self.dir / "records.jsonl"
            data = "".join(json.dumps(r, default=str) + "\n" for r in records)
            try:
                atomic_write_bytes(path, data.encode())
            except OSError as exc:
                raise self._write_error(f"{path} ({os_reason(exc)}; the file is as it was)",
                                        exc.errno) from None

    # -- manifest ------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any] | None:
        """The manifest (None when there is none), checked field by field; one larger than
        :data:`MAX_MANIFEST_BYTES` is refused before it is read."""
        path = self.dir / "manifest.json"
        restart = "start the run again with a new --checkpoint-dir (or delete the directory)"
        try:
            info = path.stat()
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError(f"{path} is not a regular file; {restart}")
            if info.st_size > MAX_MANIFEST_BYTES:
                raise CheckpointError(
                    f"{path} is {info.st_size} bytes, more than the {MAX_MANIFEST_BYTES} a manifest "
                    "may have (it holds the run's identity and one checksum per file of a few "
                    f"rounds): it is not one this library wrote; {restart}")
            with open(path, "rb") as fh:
                data = fh.read(MAX_MANIFEST_BYTES + 1)
            if len(data) > MAX_MANIFEST_BYTES:
                raise CheckpointError(f"{path} grew past {MAX_MANIFEST_BYTES} bytes while it was "
                                      f"read; {restart}")
            m = json.loads(data.decode("utf-8"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(f"{path} is unreadable ({os_reason(exc)}); {restart}") from None
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
            raise CheckpointError(f"{path} is unreadable ({_describe(exc)}); {restart}") from None
        problem = _manifest_problem(m)
        if problem:
            raise CheckpointError(f"{path} is not a valid manifest: {problem}; {restart}")
        return m

    def _write_manifest(self, rounds: list[int], files: dict[str, dict[str, str]],
                        complete: bool = False) -> None:
        """Write a format-3 manifest: rounds kept without checksums (read from a format-1
        manifest) get theirs now, from their files as they are; rounds kept from a format-1 or
        2 manifest, whose files name no run, are listed as ``unbound``."""
        try:
            old = self.manifest()
        except CheckpointError:
            old = None
        legacy = (set() if old is None else set(old.get("unbound", [])) if old["format"] >= 3
                  else set(old["rounds"]))
        sums = {}
        for r in rounds:
            sums[str(r)] = files.get(str(r))
            if sums[str(r)] is None:
                sums[str(r)] = self._checksums(r)
                log.info("%s: the checkpoint of round %d had no checksums; the manifest holds "
                         "those of its files now", self.dir, r)
        data = {"format": FORMAT, "fingerprint": self.fingerprint, "identity": self.identity,
                "rounds": rounds, "files": sums, "complete": complete,
                "unbound": sorted(r for r in set(rounds) if r in legacy)}
        atomic_write_bytes(self.dir / "manifest.json", json.dumps(data, default=str).encode())

    def _checksums(self, round_: int) -> dict[str, str]:
        rdir = self.dir / f"round-{round_:06d}"
        return {f.name: sha256_of(f) for f in sorted(rdir.glob("*.pt"))}

    def mark_complete(self, complete: bool = True) -> None:
        """The run finished: a resume replays its records instead of running it again
        (``complete=False``: it goes on, a finished run being continued)."""
        if self.is_root:
            m = self.manifest() or {"rounds": [], "files": {}}
            try:
                self._write_manifest(m["rounds"], m.get("files", {}), complete=complete)
            except OSError as exc:
                raise self._write_error(f"{self.dir / 'manifest.json'} ({os_reason(exc)}; the "
                                        "file is as it was)", exc.errno) from None

    def saved_rounds(self) -> list[int]:
        m = self.manifest()
        return list(m["rounds"]) if m else []

    # -- save ------------------------------------------------------------------------------
    def acts_at(self, round_: int) -> bool:
        """Whether :meth:`after_round` may save or stop after ``round_`` (the engine then
        leaves that round's state its own: no gradient of the next round drawn ahead)."""
        return bool((self.every and round_ % self.every == 0)
                    or (self._old_handlers and round_ % 10 == 0))

    def after_round(self, engine: Any) -> None:
        """Called by the engine after every round: periodic saves and signal stops."""
        if self.every and engine.round % self.every == 0:
            self.save(engine)
        if self._old_handlers and engine.round % 10 == 0:
            stop = engine.world.any(self._stop_signal is not None)
            if stop:
                if self._saved_round != engine.round:  # not twice: the manifest has its sums
                    self.save(engine)
                raise Interrupted(self._stop_signal or signal.SIGTERM, round=engine.round,
                                  rank=engine.world.rank)

    def save(self, engine: Any) -> None:
        """Write every local node's state for the current round (collective).

        A file that cannot be written on any process stops every process with the same
        :class:`CheckpointError`: the round's directory is removed, and the manifest still
        names the last good round.
        """
        round_ = engine.round
        rdir = self.dir / f"round-{round_:06d}"
        failure: tuple[Path, OSError] | None = None
        listed: list[int] = []
        if self.is_root:
            path = self.dir / "manifest.json"
            try:
                m = self.manifest()
                listed = list(m["rounds"]) if m else []
                if round_ in listed:  # written again: out of the manifest while it changes
                    listed.remove(round_)
                    self._write_manifest(listed, m.get("files", {}), complete=m.get("complete", False))
                path = rdir
                rdir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                failure = (path, exc)
        self._agree(engine, failure)  # nothing written yet: the manifest is as it was
        path = rdir
        try:
            rdir.mkdir(parents=True, exist_ok=True)
            for i, blob in engine.node_state_dicts().items():
                path = rdir / f"node-{i:04d}.pt"
                atomic_save({**blob, RUN_KEY: self.fingerprint}, path)
            if self.is_root:
                path = rdir / "engine.pt"
                atomic_save({**engine.run_state_dict(), RUN_KEY: self.fingerprint}, path)
        except OSError as exc:
            failure = (path, exc)
        self._agree(engine, failure, rdir)
        if self.is_root:
            path = self.dir / "manifest.json"
            try:
                m = self.manifest()
                rounds = [r for r in listed if r != round_] + [round_]
                rounds = rounds[-self.keep:]
                files = {k: v for k, v in (m.get("files", {}) if m else {}).items()
                         if int(k) in rounds}
                files[str(round_)] = self._checksums(round_)
                self._write_manifest(rounds, files)
            except OSError as exc:
                failure = (path, exc)
            else:
                for old in self.dir.glob("round-*"):
                    match = ROUND_DIR.fullmatch(old.name)
                    if match and int(match[1]) not in rounds:  # other names are not ours: left alone
                        shutil.rmtree(old, ignore_errors=True)
        self._agree(engine, failure, rdir)
        self._saved_round = round_

    def _agree(self, engine: Any, failure: tuple[Path, OSError] | None,
               rdir: Path | None = None) -> None:
        """Every process learns whether any failed to write (collective: also the barrier)
        and, if one did, all stop with the same error after the root removed ``rdir`` (the
        round being written, which the manifest does not list)."""
        code = 0 if failure is None else (failure[1].errno or -1)
        codes = [int(c) for c in engine.world.node_values(
            engine.n, {i: float(code) for i in engine.nodes},
            what=f"the write status of round {engine.round}'s checkpoint from")]
        if not any(codes):
            return
        round_ = engine.round
        if self.is_root and rdir is not None:
            shutil.rmtree(rdir, ignore_errors=True)
        if failure is not None:
            what = f"{failure[0]} ({os_reason(failure[1])})"
        else:
            first = next(c for c in codes if c)
            nodes = [i for i, c in enumerate(codes) if c]
            reason = f"{os.strerror(first)} (errno {first})" if first > 0 else "an I/O error"
            what = f"the files of node(s) {_short(nodes)} on another process ({reason})"
            code = first
        raise self._write_error(f"the checkpoint of round {round_}: {what}",
                                code if code > 0 else None, round=round_)

    # -- load ------------------------------------------------------------------------------
    def check_identity(self, manifest: dict[str, Any]) -> None:
        """Refuse a checkpoint of another run, naming what differs: the flags (``args``) a
        user changed, those at their default now because they were left out, the MPI world
        size and the code version; settings derived from the flags only when no flag differs."""
        if manifest.get("fingerprint") == self.fingerprint:
            return
        theirs = _leaves(manifest.get("identity", {}))
        ours = _leaves(json.loads(json.dumps(self.identity, default=str)))
        diffs = [k for k in sorted(set(theirs) | set(ours))
                 if theirs.get(k, _MISSING) != ours.get(k, _MISSING)]
        args = [k for k in diffs if k.startswith("args.")]
        own = [k for k in diffs if k in ("script", "world_size", "gossip")]
        derived = [k for k in diffs if k not in args and k not in own]

        def shown(k: str) -> str:
            return _show(theirs.get(k, _MISSING))

        changed, left_out, gives, drops = [], [], [], []
        for k in args:
            dest = k[len("args."):].split(".")[0]
            flag, default = self.flags.get(dest, (f"--{dest.replace('_', '-')}", _MISSING))
            default = _MISSING if default is _MISSING else _jsonish(default)
            now = ours.get(k, _MISSING)
            if default is not _MISSING and now == default:
                left_out.append(f"{flag} (checkpoint {shown(k)}, default {_show(now)})")
            elif default is not _MISSING and theirs.get(k, _MISSING) == default:
                changed.append(f"{flag}: checkpoint left it out (default {shown(k)}), "
                               f"now {_show(now)}")
            else:
                changed.append(f"{flag}: checkpoint {shown(k)}, now {_show(now)}")
            then = theirs.get(k, _MISSING)
            given = _flag_text(flag, then, default)
            (drops if given is None else gives).append(flag if given is None else given)
        parts = []
        if changed:
            parts.append("changed: " + _first(changed))
        if left_out:
            parts.append("left out, so at their default now: " + _first(left_out))
        parts += [f"{k}: checkpoint {shown(k)}, now {_show(ours.get(k, _MISSING))}" for k in own]
        if args and derived:
            parts.append(f"{len(derived)} setting(s) derived from the flags differ as a result")
        elif derived:
            parts.append(_first([f"{k}: checkpoint {shown(k)}, now {_show(ours.get(k, _MISSING))}"
                                 for k in derived]))
        if args:
            fix = " ".join(gives) + (", " if gives and drops else "")
            fix += f"without {', '.join(drops)}" if drops else ""
            fix = f"resume with the checkpointed run's flags ({fix})"
        else:
            fix = ("resume with the same topology, algorithm, compressor, world layout and code "
                   "version")
        raise CheckpointError(
            f"checkpoint in {self.dir} was made by a different run ({'; '.join(parts)}); {fix}, "
            "or use a new --checkpoint-dir"
        )

    def restore(self, engine: Any) -> int:
        """Load the newest intact checkpoint into ``engine``; returns its round (0: none)."""
        m = self.manifest()
        if m is None:
            return 0
        self.check_identity(m)
        failed: list[tuple[int, str]] = []
        rounds = sorted(set(m["rounds"]), reverse=True)
        intact = self.records_intact_until()
        if intact is not None and any(r > intact for r in rounds):
            later = [r for r in rounds if r > intact]
            rounds = [r for r in rounds if r <= intact]
            if self.is_root:
                log.warning("%s: the checkpoint(s) of round(s) %s are past the cut in "
                            "records.jsonl (records up to round %d are intact): %s", self.dir,
                            sorted(later), max(intact, 0), f"resuming from round {rounds[0]}"
                            if rounds else "no checkpoint is left before it, so the run starts "
                            "again from round 0")
            if not rounds:
                return 0
        for round_ in rounds:
            sums = m.get("files", {}).get(str(round_)) if m["format"] >= 2 else None
            bound = m["format"] >= 3 and round_ not in m.get("unbound", [])
            try:
                self._load_round(engine, round_, sums, bound)
            except CheckpointError as exc:
                failed.append((round_, str(exc)))
                if len(failed) <= WARN_ROUNDS:
                    log.warning("%s; trying an older checkpoint", exc)
                continue
            if len(failed) > WARN_ROUNDS:
                log.warning("%s", _more_failures(failed))
            if sums is None:
                why = ("is format 1 (no checksums)" if m["format"] < 2
                       else f"lists no checksums for round {round_}")
                log.warning("%s %s: the checkpoint of round %d was loaded without a SHA-256 check "
                            "(its next save writes them)", self.dir / "manifest.json", why, round_)
            if self._unnamed:
                log.warning("%s: the files of round %d were written by an older version and name "
                            "no run: loaded without checking they are this run's (config hash %s)",
                            self.dir, round_, self.fingerprint)
            return round_
        if len(failed) > WARN_ROUNDS:
            log.warning("%s", _more_failures(failed))
        which = (f"rounds {rounds[::-1]}" if len(rounds) <= 6
                 else f"{len(rounds)} rounds, {rounds[-1]} to {rounds[0]}")
        reasons = "; ".join(r for _, r in failed[:WARN_ROUNDS])
        more = f"; and {len(failed) - WARN_ROUNDS} older ones" if len(failed) > WARN_ROUNDS else ""
        raise CheckpointError(f"no intact checkpoint left in {self.dir} ({which}): {reasons}{more}; "
                              "start the run again with a new --checkpoint-dir")

    def _load_round(self, engine: Any, round_: int, sums: dict[str, str] | None,
                    bound: bool = True) -> None:
        """Load one round on every process; any file failing anywhere fails it everywhere.
        ``bound``: every file must name this run (else a file naming no run is accepted)."""
        rdir = self.dir / f"round-{round_:06d}"
        reason = None
        path = rdir / "engine.pt"
        self._unnamed = False  # set by _read: a file of this round names no run
        try:
            run_state = self._read(path, sums, bound)
            for i in engine.nodes:
                path = rdir / f"node-{i:04d}.pt"
                engine.load_state_dicts({i: self._read(path, sums, bound)}, run_state)
            if int(run_state["round"]) != round_:
                path = rdir / "engine.pt"
                raise CheckpointError(f"it holds round {run_state['round']}", round=round_)
        except Exception as exc:  # missing, torn, altered, or not this run's state
            reason = f"checkpoint of round {round_} is unreadable ({path}: {_describe(exc)})"
        if not engine.world.any(reason is not None):
            return
        raise CheckpointError(reason or f"checkpoint of round {round_} is unreadable on another "
                              "process (see its warning)", round=round_)

    def _read(self, path: Path, sums: dict[str, str] | None, bound: bool) -> Any:
        """One file's state, its checksum (``sums``) and run (:data:`RUN_KEY`) checked."""
        data = path.read_bytes()
        if sums is not None:
            want = sums.get(path.name)
            if want is None:
                raise CheckpointError("the manifest lists no checksum for it")
            if hashlib.sha256(data).hexdigest() != want:
                raise CheckpointError("its SHA-256 differs from the manifest's (the file was altered "
                                      "or damaged after it was written)")
        blob = load_plain(io.BytesIO(data), CheckpointError)
        theirs = blob.pop(RUN_KEY, None) if isinstance(blob, dict) else None
        self._unnamed |= theirs is None
        if theirs is None and bound:
            raise CheckpointError("it names no run (no config hash), so it is not a file this "
                                  "version wrote for this checkpoint")
        if theirs is not None and theirs != self.fingerprint:
            raise CheckpointError(
                f"it was written by the run with config hash {_short(theirs, 40)}, not by this "
                f"run ({self.fingerprint}): the manifest was altered, or the files were copied "
                "from another run's checkpoint")
        return blob

    # -- signals ---------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM: finish the round, write a checkpoint, stop with :class:`Interrupted`."""
        def handler(signum, _frame):
            self._stop_signal = signum

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def remove_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()


def load_plain(source: Any, error: type[GossipError]) -> Any:
    """``torch.load(source, weights_only=True)`` on the CPU: tensors, numbers, strings, lists
    and dicts only. A file holding other Python objects raises ``error`` with
    :func:`pickle_refusal`'s reason (torch's own text advises loading it with code execution
    allowed, which is never the fix for a file this library reads)."""
    try:
        return torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise error(pickle_refusal(exc)) from None


def pickle_refusal(exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, without torch's advice."""
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)|Unsupported operand \d+|"
                      r"Unsupported class [\w.]+", str(exc))
    what = f" ({found[0]})" if found else ""
    return ("it holds Python objects other than tensors, numbers, strings, lists and dicts"
            f"{what}, which no file this library reads may hold: it was refused (no code in it "
            "ran); use a file made by this library (or torch.save of plain tensors) instead")


def _manifest_problem(m: Any) -> str | None:
    """What is wrong with a parsed manifest (None when it is usable)."""
    if not isinstance(m, dict):
        return f"expected a JSON object, got {type(m).__name__}"
    if m.get("format") not in (1, 2, FORMAT):
        return f"format {_short(m.get('format'))} is not one this version reads (1, 2, {FORMAT})"
    unbound = m.get("unbound", [])
    if not isinstance(unbound, list) or not all(_is_count(r) for r in unbound):
        return f"'unbound' must be a list of round numbers, got {_short(unbound)}"
    if not isinstance(m.get("fingerprint"), str) or not isinstance(m.get("identity"), dict):
        return "'fingerprint' (a string) or 'identity' (an object) is missing"
    rounds = m.get("rounds")
    if not isinstance(rounds, list) or not all(_is_count(r) for r in rounds):
        return f"'rounds' must be a list of round numbers, got {_short(rounds)}"
    if m["format"] >= 2:
        files = m.get("files")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and k.isdigit() and isinstance(v, dict)
            and all(isinstance(h, str) for h in v.values())
            for k, v in files.items()
        ):
            return "'files' (the checksums of each round's files) is missing or malformed"
    return None


_ROUND_HEAD = re.compile(rb'\{"type": "round", "round": (\d+)[,}]')


def _torn_limit(line: bytes, before: list[dict[str, Any]]) -> int | None:
    """The last round whose records a cut ``line`` leaves intact: the round before its own
    when it is a round record whose number survived the cut, None when the records before it
    end with a summary (only the summary is lost), else the round of the last whole round
    record (-1 when there is none)."""
    head = _ROUND_HEAD.match(line)
    if head:
        return int(head[1]) - 1
    if before and before[-1].get("type") == "summary":
        return None
    rounds = [r["round"] for r in before if r.get("type") == "round"]
    return rounds[-1] if rounds else -1


def _record_problem(rec: Any) -> str | None:
    """What is wrong with one parsed line of ``records.jsonl`` (None when it is a record)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
        return f"{_short(rec)} is not a log record (a JSON object with a 'type')"
    if rec["type"] == "round" and not _is_count(rec.get("round")):
        return f"a round record without a round number ('round': {_short(rec.get('round', _MISSING))})"
    if rec["type"] == "summary" and not _is_count(rec.get("rounds")):
        return f"a summary record without its round count ('rounds': {_short(rec.get('rounds', _MISSING))})"
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a list says how long it is)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} items)" if isinstance(value, list | dict) else ""
    return text[:limit] + "…" + size


class _Missing:
    def __repr__(self) -> str:
        return "(not set)"


_MISSING: Any = _Missing()


def _show(value: Any) -> str:
    return _short(value, 60)


def _jsonish(value: Any) -> Any:
    """``value`` as it reads back from a JSON config record (tuples become lists...)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return _MISSING


def _flag_text(flag: str, value: Any, default: Any) -> str | None:
    """The command-line words that set ``flag`` to ``value`` (None: leave the flag out)."""
    if value is _MISSING or value is None or value is False or value == default:
        return None
    if value is True:
        return flag
    if isinstance(value, list):
        return f"{flag} {' '.join(shlex.quote(str(v)) for v in value)}" if value else None
    return f"{flag} {shlex.quote(str(value))}"


def _first(items: list[str], count: int = 6) -> str:
    more = f"; and {len(items) - count} more" if len(items) > count else ""
    return "; ".join(items[:count]) + more


def _more_failures(failed: list[tuple[int, str]]) -> str:
    """One line for the unreadable rounds past the first :data:`WARN_ROUNDS`."""
    rest = [r for r, _ in failed[WARN_ROUNDS:]]
    span = f"round {rest[0]}" if len(rest) == 1 else f"rounds {min(rest)} to {max(rest)}"
    return (f"{len(rest)} older checkpoint(s) are unreadable too ({span}; the oldest: "
            f"{failed[-1][1]})")


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"args.gamma": 0.2, ...}``: nested objects flattened to dotted keys."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing entry {exc.args[0]!r}"
    if isinstance(exc, OSError):  # the path is named already
        return os_reason(exc)
    if isinstance(exc, GossipError):  # the library's own reason: its text says it all
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
