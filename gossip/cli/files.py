"""The files a run reads and writes, checked before anything runs: ``--out``, ``--plot``, the
checkpoint directories (none overwriting another or an input), and ``.npy`` inputs."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def check_outputs(args: argparse.Namespace, root: bool = True) -> None:
    """--out, --plot and --checkpoint-dir (or --resume), checked before anything runs: each
    can be created and written (nothing is created or truncated here), --out and --plot are
    distinct files, and the plot's format is one matplotlib writes. ``root``: this process
    writes the log and the plot (under MPI only rank 0 does; every rank writes checkpoints)."""
    from gossip.outputs import check_writable

    out, plot = getattr(args, "out", None), getattr(args, "plot", None)
    paths = [("--out", out, False), ("--plot", plot, False)] if root else []
    paths += [("--checkpoint-dir", getattr(args, "checkpoint_dir", None), True),
              ("--resume", getattr(args, "resume", None), True)]
    for flag, path, directory in paths:
        problem = None if path is None else check_writable(path, flag, directory)
        if problem:
            raise SystemExit(problem)
    check_no_overlap(args, [(flag, path) for flag, path, _ in paths
                            if path is not None and flag != "--resume"])
    if plot is None or not root:
        return
    suffix = Path(plot).suffix.lower().lstrip(".")
    if suffix:
        try:
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError as exc:
            raise SystemExit(f"error: --plot {plot} needs matplotlib, which cannot be imported "
                             f"({exc}); install it (pip install matplotlib) or leave --plot "
                             "out") from None

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise SystemExit(f"error: --plot {plot}: '.{suffix}' is not an image format matplotlib "
                             f"writes; use one of {', '.join('.' + f for f in sorted(formats))}")


INPUT_FLAGS = (("config", "--config"), ("init", "--init"), ("data", "--data"),
               ("topology", "--topology"))
"""The flags that may name a file a run reads, which no output may overwrite."""


def check_no_overlap(args: argparse.Namespace, outputs: list[tuple[str, str]]) -> None:
    """Refuse outputs (``(flag, path)``: --out, --plot, --checkpoint-dir) that name the same
    path as each other, or as a file the run reads (:data:`INPUT_FLAGS`): the run would write
    over its own input (a --config or --init file) or its log over its checkpoints."""
    seen: dict[Path, str] = {}
    for flag, path in outputs:
        where = Path(path).resolve()
        if where in seen:
            if {flag, seen[where]} == {"--out", "--plot"}:
                raise SystemExit(f"error: --plot and --out are the same file ({path}); the plot "
                                 "would overwrite the log: give the plot its own name, e.g. run.png")
            raise SystemExit(f"error: {seen[where]} and {flag} are the same path ({path}); give "
                             "each its own name")
        seen[where] = flag
    for dest, flag in INPUT_FLAGS:
        value = getattr(args, dest, None)
        if not isinstance(value, str) or not Path(value).is_file():
            continue
        used = seen.get(Path(value).resolve())
        if used:
            raise SystemExit(f"error: {used} {value} is the {flag} file this run reads; writing "
                             f"there would destroy it: give {used} another path")


def read_npy(path: str, flag: str) -> np.ndarray:
    """A numeric array from a ``.npy`` file given to ``flag``, memory-mapped, checked first.

    The file must be a regular file holding one ``.npy`` array (not ``.npz``, not pickled
    objects) whose header agrees with the file's length: the header alone is read and checked
    against the bytes that follow, so a header claiming a huge shape costs nothing and is
    refused; the array is then memory-mapped, and nothing is allocated until rows are read.
    """
    import numpy as np

    from gossip.config import user_file
    from gossip.errors import ConfigFileError

    try:
        file = user_file(path, flag)
    except ConfigFileError as exc:
        raise SystemExit(f"error: {exc}") from None
    fmt = np.lib.format
    readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    with open(file, "rb") as fh:
        magic = fh.read(6)
        if magic != b"\x93NUMPY":
            what = "an .npz archive" if magic[:2] == b"PK" else "not a .npy file"
            raise SystemExit(f"error: {flag} {path} is {what}; save one array with "
                             "numpy.save(path, a)")
        fh.seek(0)
        try:
            version = fmt.read_magic(fh)
            shape, _, dtype = readers[version](fh)
        except (KeyError, ValueError, OSError) as exc:
            why = "format version not supported" if isinstance(exc, KeyError) else str(exc)
            raise SystemExit(f"error: {flag} {path} has an unreadable .npy header ({why}); save "
                             "it again with numpy.save") from None
        body = file.stat().st_size - fh.tell()
    if dtype.hasobject or dtype.kind not in "biuf":
        raise SystemExit(f"error: {flag} {path} holds {dtype} values; expected numbers")
    need = math.prod(shape) * dtype.itemsize
    if need > body:
        raise SystemExit(f"error: {flag} {path}: its header announces shape {shape} ({need} bytes) "
                         f"but only {body} bytes follow; the file is truncated or corrupt")
    return np.load(file, mmap_mode="r", allow_pickle=False)


def checkpoint_options(args: argparse.Namespace, index: int) -> dict[str, Any]:
    """Keyword arguments of :func:`gossip.runner.execute` for the ``index``-th run of a script."""
    root = args.resume or args.checkpoint_dir
    if args.checkpoint_every and root is None:
        raise SystemExit("--checkpoint-every needs --checkpoint-dir DIR (where to write them)")
    if root is None:
        return {}
    if args.resume is not None:
        resume = Path(args.resume)
        if not resume.is_dir():
            raise SystemExit(f"error: --resume {args.resume}: no such directory; give the "
                             "--checkpoint-dir of the run to continue")
        if not any(resume.glob("run*/manifest.json")):
            raise SystemExit(f"error: --resume {args.resume} holds no checkpoint (no "
                             "run*/manifest.json); to start a new run use --checkpoint-dir")
    from gossip.config import flag_defaults

    return {"checkpoint_dir": os.path.join(root, f"run{index:02d}"),
            "checkpoint_every": args.checkpoint_every, "resume": args.resume is not None,
            "flags": flag_defaults(args)}
