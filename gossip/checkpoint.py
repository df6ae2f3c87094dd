"""Checkpoints a run can resume from bit for bit, and the stop signals that trigger a last one.

Layout of a run's directory::

    DIR/run00/manifest.json              last round every node completed + the run's identity
    DIR/run00/records.jsonl              every log record so far (replayed on resume)
    DIR/run00/round-000120/node-0003.pt  one file per node: its whole state

Each node file holds the model, the algorithm's state, the node's and its edges' generator
states, stateful compressors (low-rank warm starts), the oracle's estimator/optimizer state and
the node's byte counter. Files are written to a temporary name, fsynced and renamed; the
manifest moves to a round only after every process wrote its nodes, and the previous round is
kept until the new one is complete. Loading uses ``torch.load(weights_only=True)``: tensors
and plain containers only, never arbitrary objects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import torch

from gossip.errors import GossipError

log = logging.getLogger(__name__)

FORMAT = 1


class CheckpointError(GossipError, RuntimeError):
    """A checkpoint cannot be used (corrupt, incomplete, or made by a different run)."""


class Interrupted(GossipError, RuntimeError):
    """The run stopped on SIGINT/SIGTERM after writing a final checkpoint."""

    def __init__(self, round_: int, signum: int):
        super().__init__(f"stopped by signal {signal.Signals(signum).name} at round {round_}; "
                         "a checkpoint of this round was written (resume with --resume DIR)")
        self.round = round_
        self.signum = signum


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write, fsync and rename, so a reader sees the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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
        if self.is_root:
            self.dir.mkdir(parents=True, exist_ok=True)

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
        path = self.dir / "manifest.json"
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise CheckpointError(
                f"{path} is corrupt ({exc}); delete the directory to restart"
            ) from exc

    def _write_manifest(self, rounds: list[int], complete: bool = False) -> None:
        data = {"format": FORMAT, "fingerprint": self.fingerprint, "identity": self.identity,
                "rounds": rounds, "complete": complete}
        atomic_write_bytes(self.dir / "manifest.json", json.dumps(data, default=str).encode())

    def mark_complete(self) -> None:
        """The run finished: a resume replays its records instead of running it again."""
        if self.is_root:
            m = self.manifest() or {"rounds": []}
            self._write_manifest(m["rounds"], complete=True)

    # -- save ------------------------------------------------------------------------------
    def after_round(self, engine: Any) -> None:
        """Called by the engine after every round: periodic saves and signal stops."""
        if self.every and engine.round % self.every == 0:
            self.save(engine)
        if self._old_handlers and engine.round % 10 == 0:
            stop = engine.world.any(self._stop_signal is not None)
            if stop:
                self.save(engine)
                raise Interrupted(engine.round, self._stop_signal or signal.SIGTERM)

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
            self._write_manifest(rounds)
            for old in self.dir.glob("round-*"):
                if int(old.name.split("-")[1]) not in rounds:
                    shutil.rmtree(old, ignore_errors=True)
        engine.world.barrier()

    # -- load ------------------------------------------------------------------------------
    def check_identity(self, manifest: dict[str, Any]) -> None:
        if manifest.get("fingerprint") == self.fingerprint:
            return
        theirs = manifest.get("identity", {})
        diffs = [k for k in sorted(set(theirs) | set(self.identity))
                 if json.dumps(theirs.get(k), sort_keys=True, default=str)
                 != json.dumps(self.identity.get(k), sort_keys=True, default=str)]
        detail = "; ".join(f"{k}: checkpoint {theirs.get(k)!r}, now {self.identity.get(k)!r}"
                           for k in diffs[:4])
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
        for round_ in sorted(m["rounds"], reverse=True):
            try:
                self._load_round(engine, round_)
                return round_
            except CheckpointError as exc:
                log.warning("%s; trying an older checkpoint", exc)
        raise CheckpointError(f"no intact checkpoint left in {self.dir} (rounds {m['rounds']})")

    def _load_round(self, engine: Any, round_: int) -> None:
        rdir = self.dir / f"round-{round_:06d}"
        blobs = {}
        ok = True
        try:
            for i in engine.nodes:
                blobs[i] = torch.load(rdir / f"node-{i:04d}.pt", weights_only=True,
                                      map_location="cpu")
            run_state = torch.load(rdir / "engine.pt", weights_only=True)
        except Exception as exc:  # missing, truncated or corrupt file
            ok = False
            reason = f"checkpoint of round {round_} is unreadable ({type(exc).__name__}: {exc})"
        if not engine.world.any(not ok) and ok:
            engine.load_state_dicts(blobs, run_state)
            return
        raise CheckpointError(reason if not ok else f"checkpoint of round {round_} is "
                              "unreadable on another process")

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
