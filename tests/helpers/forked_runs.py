"""Many runs of the experiment scripts from one interpreter, each in a fork of it: what
``python SCRIPT FLAGS`` does, without importing torch and the library once per run.

``forked_runs.py CASES.json RESULTS.json [AS_LIMIT_BYTES]``: CASES is a list of
``[script, [flag, ...]]``; RESULTS gets, for each case in order, ``{"returncode", "stderr",
"seconds"}``. The parent imports torch, numpy and every script named (not their ``main``), then
runs the cases one after the other, each in a child process that runs the script as
``__main__`` the way the interpreter does: ``sys.argv`` and ``sys.path[0]`` of the script, its
exit status from ``SystemExit`` (an uncaught exception prints its traceback and exits 1, as
Python does), exit handlers run, standard output dropped, standard error kept. A child runs
under an address-space limit (default 3 GiB) and is killed after 60 s (status -9). The modules
a child imported (the run's own, lazily imported in its functions) are then imported by the
parent too, so that later children find them loaded (MPI's never: it starts at import).

Used by tests/scripts/test_hostile_flags.py: ~80 refusals in seconds instead of a start-up of
the interpreter and torch each.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import resource
import runpy
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60.0


def _exit_code(exc: SystemExit) -> int:
    """The status Python exits with for ``exc`` (a message is printed to stderr, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


NEVER_PRELOADED = ("__main__", "__mp_main__", "mpi4py", "_forked_runs")
"""Modules the parent does not import after a child did: MPI initialises itself at import."""


def _child(script: str, flags: list[str], err_fd: int, mods_fd: int, limit: int) -> None:
    """Run ``script`` as ``python script flags`` would, in this (forked) process, and write the
    names of the modules it imported to ``mods_fd``; never returns."""
    code = 1
    before = set(sys.modules)
    try:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err_fd, 2)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        sys.argv = [script, *flags]
        sys.path[0] = str((ROOT / script).parent)
        try:
            runpy.run_path(str(ROOT / script), run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught one)
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(mods_fd, "\n".join(sorted(set(sys.modules) - before)).encode())
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        os._exit(code)


def run_case(script: str, flags: list[str], limit: int) -> dict:
    """One case in a fork: its exit status (``-signal`` when killed), stderr and seconds."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as mods:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(script, flags, err.fileno(), mods.fileno(), limit)
        deadline = start + TIMEOUT_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        mods.seek(0)
        _preload(mods.read().decode().split())
    return {"returncode": os.waitstatus_to_exitcode(status), "stderr": stderr,
            "seconds": time.monotonic() - start}


def _preload(names: list[str]) -> None:
    """Import ``names`` here (those a child imported), but MPI's and the scripts' own."""
    for name in names:
        if name not in sys.modules and not name.startswith(NEVER_PRELOADED):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  (a child imports it anew: slower, no less right)
                pass


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 3 << 30
    import numpy  # noqa: F401
    import torch

    torch.set_num_threads(1)
    sys.path[0] = str(ROOT / "experiments")  # not this helper's folder: the scripts' own
    for script in sorted({s for s, _ in cases}):  # their imports, once (not their main)
        runpy.run_path(str(ROOT / script), run_name="_forked_runs_preload")
    results = [run_case(script, flags, limit) for script, flags in cases]
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
