"""Run an experiment script (``SCRIPT ARGS...``) as ``__main__`` and report, as the very last
thing this process does, whether the torch.distributed process group was left alive.

Its :mod:`atexit` hook is registered before the script runs, so it runs after every hook the
script's run registered (they run last in, first out): the line ``process group alive at exit:
False`` means the run tore its group down itself."""

from __future__ import annotations

import atexit
import runpy
import sys

import torch.distributed as dist


def _report() -> None:
    print(f"process group alive at exit: {dist.is_initialized()}", flush=True)


atexit.register(_report)
script, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
