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
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import torch

from gossip.errors import CheckpointError, GossipError, Interrupted

log = logging.getLogger(__name__)

FORMAT = 2  # 2: per-file SHA-256 in the manifest ("files"); 1 (no checksums) is still read
ROUND_DIR = re.compile(r"round-(\d{6,})")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write, fsync and rename, so a reader sees the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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
    """

    def __init__(self, directory: str | Path, identity: dict[str, Any], every: int = 0,
                 world: Any = None, keep: int = 2):
        self.dir = Path(directory)
        self.identity = identity
        self.fingerprint = fingerprint(identity)
        self.every = int(every)
        self.world = world
        self.keep = keep
        self._stop_signal: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self._lock: Any = None
        if self.is_root:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._acquire_lock()

    def _acquire_lock(self) -> None:
        """Hold ``DIR/lock`` while this run uses the directory (freed when the process dies)."""
        fh = open(self.dir / "lock", "a+", encoding="utf-8")  # noqa: SIM115 (closed in close())
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
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._lock = fh

    def close(self) -> None:
        """Release the directory lock."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @property
    def is_root(self) -> bool:
        return self.world is None or self.world.is_root

    # -- records -------------------------------------------------------------------------
    def append_record(self, record: dict[str, Any]) -> None:
        if self.is_root:
            with open(self.dir / "records.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, default=str) + "\n")

    def records_until(self, round_: int) -> list[dict[str, Any]]:
        """Stored records up to ``round_`` (config first), to replay into a fresh log."""
        path = self.dir / "records.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a torn last line from a kill: ignore it
                continue
            if rec.get("type") == "round" and rec["round"] > round_:
                continue
            if rec.get("type") == "summary" and round_ < rec.get("rounds", 0):
                continue
            out.append(rec)
        return out

    def reset_records(self, records: list[dict[str, Any]]) -> None:
        if self.is_root:
            data = "".join(json.dumps(r, default=str) + "\n" for r in records)
            atomic_write_bytes(self.dir / "records.jsonl", data.encode())

    # -- manifest ------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any] | None:
        """The manifest (None when there is none), checked field by field."""
        path = self.dir / "manifest.json"
        if not path.exists():
            return None
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(
                f"{path} is unreadable ({exc}); delete the directory to restart"
            ) from None
        problem = _manifest_problem(m)
        if problem:
            raise CheckpointError(f"{path} is not a valid manifest: {problem}; delete the "
                                  "directory to restart")
        return m

    def _write_manifest(self, rounds: list[int], files: dict[str, dict[str, str]],
                        complete: bool = False) -> None:
        data = {"format": FORMAT, "fingerprint": self.fingerprint, "identity": self.identity,
                "rounds": rounds, "files": files, "complete": complete}
        atomic_write_bytes(self.dir / "manifest.json", json.dumps(data, default=str).encode())

    def mark_complete(self, complete: bool = True) -> None:
        """The run finished: a resume replays its records instead of running it again
        (``complete=False``: it goes on, a finished run being continued)."""
        if self.is_root:
            m = self.manifest() or {"rounds": [], "files": {}}
            self._write_manifest(m["rounds"], m.get("files", {}), complete=complete)

    def saved_rounds(self) -> list[int]:
        m = self.manifest()
        return list(m["rounds"]) if m else []

    # -- save ------------------------------------------------------------------------------
    def after_round(self, engine: Any) -> None:
        """Called by the engine after every round: periodic saves and signal stops."""
        if self.every and engine.round % self.every == 0:
            self.save(engine)
        if self._old_handlers and engine.round % 10 == 0:
            stop = engine.world.any(self._stop_signal is not None)
            if stop:
                self.save(engine)
                raise Interrupted(self._stop_signal or signal.SIGTERM, round=engine.round,
                                  rank=engine.world.rank)

    def save(self, engine: Any) -> None:
        """Write every local node's state for the current round (collective)."""
        rdir = self.dir / f"round-{engine.round:06d}"
        if self.is_root:
            rdir.mkdir(parents=True, exist_ok=True)
        engine.world.barrier()
        rdir.mkdir(parents=True, exist_ok=True)
        for i, blob in engine.node_state_dicts().items():
            atomic_save(blob, rdir / f"node-{i:04d}.pt")
        if self.is_root:
            atomic_save(engine.run_state_dict(), rdir / "engine.pt")
        engine.world.barrier()
        if self.is_root:
            m = self.manifest()
            rounds = [r for r in (m["rounds"] if m else []) if r != engine.round] + [engine.round]
            rounds = rounds[-self.keep:]
            files = {k: v for k, v in (m.get("files", {}) if m else {}).items()
                     if int(k) in rounds}
            files[str(engine.round)] = {f.name: sha256_of(f) for f in sorted(rdir.glob("*.pt"))}
            self._write_manifest(rounds, files)
            for old in self.dir.glob("round-*"):
                match = ROUND_DIR.fullmatch(old.name)
                if match and int(match[1]) not in rounds:  # other names are not ours: left alone
                    shutil.rmtree(old, ignore_errors=True)
        engine.world.barrier()

    # -- load ------------------------------------------------------------------------------
    def check_identity(self, manifest: dict[str, Any]) -> None:
        if manifest.get("fingerprint") == self.fingerprint:
            return
        theirs = _leaves(manifest.get("identity", {}))
        ours = _leaves(json.loads(json.dumps(self.identity, default=str)))
        diffs = [k for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
        missing = "(not set)"
        detail = "; ".join(f"{k}: checkpoint {theirs.get(k, missing)!r}, now {ours.get(k, missing)!r}"
                           for k in diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise CheckpointError(
            f"checkpoint in {self.dir} was made by a different run ({detail}); resume with the "
            "same topology, algorithm, compressor, world layout and code version, or use a new "
            "--checkpoint-dir"
        )

    def restore(self, engine: Any) -> int:
        """Load the newest intact checkpoint into ``engine``; returns its round (0: none)."""
        m = self.manifest()
        if m is None:
            return 0
        self.check_identity(m)
        reasons = []
        for round_ in sorted(m["rounds"], reverse=True):
            try:
                self._load_round(engine, round_, m.get("files", {}).get(str(round_)))
                return round_
            except CheckpointError as exc:
                reasons.append(str(exc))
                log.warning("%s; trying an older checkpoint", exc)
        raise CheckpointError(f"no intact checkpoint left in {self.dir} (rounds {m['rounds']}): "
                              + "; ".join(reasons))

    def _load_round(self, engine: Any, round_: int, sums: dict[str, str] | None) -> None:
        """Load one round on every process; any file failing anywhere fails it everywhere."""
        rdir = self.dir / f"round-{round_:06d}"
        reason = None
        path = rdir / "engine.pt"
        try:
            run_state = self._read(path, sums)
            for i in engine.nodes:
                path = rdir / f"node-{i:04d}.pt"
                engine.load_state_dicts({i: self._read(path, sums)}, run_state)
            if int(run_state["round"]) != round_:
                path = rdir / "engine.pt"
                raise CheckpointError(f"it holds round {run_state['round']}", round=round_)
        except Exception as exc:  # missing, torn, altered, or not this run's state
            reason = f"checkpoint of round {round_} is unreadable ({path}: {_describe(exc)})"
        if not engine.world.any(reason is not None):
            return
        raise CheckpointError(reason or f"checkpoint of round {round_} is unreadable on another "
                              "process (see its warning)")

    @staticmethod
    def _read(path: Path, sums: dict[str, str] | None) -> Any:
        data = path.read_bytes()
        if sums is not None:
            want = sums.get(path.name)
            if want is None:
                raise CheckpointError("the manifest lists no checksum for it")
            if hashlib.sha256(data).hexdigest() != want:
                raise CheckpointError("its SHA-256 differs from the manifest's (the file was altered "
                                      "or damaged after it was written)")
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")

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


def _manifest_problem(m: Any) -> str | None:
    """What is wrong with a parsed manifest (None when it is usable)."""
    if not isinstance(m, dict):
        return f"expected a JSON object, got {type(m).__name__}"
    if m.get("format") not in (1, FORMAT):
        return f"format {m.get('format')!r} is not one this version reads (1, {FORMAT})"
    if not isinstance(m.get("fingerprint"), str) or not isinstance(m.get("identity"), dict):
        return "'fingerprint' (a string) or 'identity' (an object) is missing"
    rounds = m.get("rounds")
    if not isinstance(rounds, list) or not all(isinstance(r, int) and r >= 0 for r in rounds):
        return f"'rounds' must be a list of round numbers, got {rounds!r}"
    if m["format"] >= 2:
        files = m.get("files")
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and all(isinstance(h, str) for h in v.values())
            for v in files.values()
        ):
            return "'files' (the checksums of each round's files) is missing or malformed"
    return None


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
    if isinstance(exc, GossipError):  # the library's own reason: its text says it all
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
