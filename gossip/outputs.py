"""Output files (the ``--out`` log, the ``--plot`` image, the ``--checkpoint-dir`` tree): checked
before a run starts, and written so that a failure loses nothing already written.

:func:`check_writable` looks at a path without creating or truncating anything (a refused run
leaves every file as it was): an existing file must be a writable file, not a directory; a
path that does not exist yet needs its nearest existing ancestor to be a directory it may
create entries in. :func:`write_all` appends a line whole or not at all, and
:func:`os_reason` / :func:`write_fix` turn an ``OSError`` into the reason and the fix of one
``error:`` line. The scripts' summary tables take what a run needed to reach a target (rounds,
bits, and the virtual or wall seconds of its clocks) from :func:`first_reached` and
:func:`clocks_of`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def os_reason(exc: OSError) -> str:
    """``"No space left on device [ENOSPC]"``: the reason without the path."""
    code = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} [{code}]" if code else text


def write_fix(code: int | None) -> str:
    """What to do about a file that could not be written, by its errno."""
    if code == errno.EFBIG:
        return "raise the file-size limit (ulimit -f) or write somewhere without one"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "free disk space (or quota) where it is written"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make the directory writable or use another one"
    return "check the disk and the path"


def write_all(fh: Any, data: bytes) -> None:
    """Append ``data`` to the unbuffered binary file ``fh`` whole or not at all: a write that
    fails part way (disk full, file-size limit) is taken back, so the file never ends in a torn
    line, and the error is raised."""
    start = fh.tell()
    try:
        view = memoryview(data)
        while view:
            n = fh.write(view)
            if not n:
                raise OSError(errno.EIO, "the file took no more bytes")
            view = view[n:]
    except OSError:
        try:
            os.ftruncate(fh.fileno(), start)
            fh.seek(start)
        except OSError:  # not a regular file (/dev/full): nothing to take back
            pass
        raise


def check_writable(path: str | Path, flag: str, directory: bool = False) -> str | None:
    """Why ``path`` (given to ``flag``) cannot be written, as one ``error:`` line; None when it
    can. ``directory``: the path is a directory that files are written in (``--checkpoint-dir``),
    else a file. Nothing is created, opened or truncated."""
    path = Path(path)
    what = "directory" if directory else "file"
    if path.exists():
        if directory and not path.is_dir():
            return f"error: {flag} {path} is not a directory; give {flag} a directory (or a new name)"
        if not directory and path.is_dir():
            return f"error: {flag} {path} is a directory; give {flag} a file name (in it, or elsewhere)"
        if not os.access(path, os.W_OK | (os.X_OK if directory else 0)):
            return f"error: {flag} {path}: the {what} is not writable (permission denied); {_fix(flag)}"
        return None
    parent = path.parent
    while not parent.exists():  # the directories to make: the nearest existing one decides
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        return (f"error: {flag} {path}: {parent} is not a directory, so the {what} cannot be "
                f"created there; {_fix(flag)}")
    if not os.access(parent, os.W_OK | os.X_OK):
        reason = "read-only file system" if _read_only(parent) else "permission denied"
        return (f"error: {flag} {path}: cannot create the {what} in {parent} ({reason}); "
                f"{_fix(flag)}")
    return None


def _fix(flag: str) -> str:
    return f"give {flag} a path in a directory you can write to"


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


# -- summary tables: what a run took to reach a target ---------------------------------------------

CLOCKS: tuple[tuple[str, str], ...] = (("time_virtual_s", "virtual s"), ("wall_s", "wall s"))
"""The round records' clocks and their table headings: ``time_virtual_s``, the virtual time of
the network's timing models (``compute=``, ``slow=``, ``delay=``: stragglers, asynchronous
runs), and ``wall_s``, the wall seconds of a ``--free-run``. Rounds say how many exchanges a run
needed; with stragglers what matters is how long they took."""


def first_reached(records: Iterable[Mapping[str, Any]], key: str, target: float,
                  higher: bool = False) -> Mapping[str, Any] | None:
    """The first round record whose ``key`` is at or below ``target`` (at or above it when
    ``higher``, e.g. an accuracy); None when no record reached it."""
    for rec in records:
        value = rec.get(key)
        if rec.get("type", "round") == "round" and value is not None and (
                value >= target if higher else value <= target):
            return rec
    return None


def clocks_of(runs: Iterable[Iterable[Mapping[str, Any]]]) -> list[tuple[str, str]]:
    """The :data:`CLOCKS` that some round record of ``runs`` (each a list of records) carries:
    the time columns a summary table shows (none for untimed runs)."""
    have = {k for recs in runs for r in recs if r.get("type", "round") == "round" for k in r}
    return [(key, head) for key, head in CLOCKS if key in have]


def to_target_cell(reached: Mapping[str, Any] | None, key: str, spec: str = ".4g") -> str:
    """One "to target" cell: the reached record's ``key`` formatted, ``not reached`` when the
    run never got there, ``—`` when the record has no such value (an untimed run)."""
    if reached is None:
        return "not reached"
    value = reached.get(key)
    return "—" if value is None else format(value, spec)
