"""Output files (the ``--out`` log, the ``--checkpoint-dir`` tree), written so that a failure
loses nothing already written: :func:`write_all` appends a line whole or not at all, and
:func:`os_reason` / :func:`write_fix` turn an ``OSError`` into the reason and the fix of one
``error:`` line.
"""

from __future__ import annotations

import errno
import os
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
