"""Run an experiment script (``SCRIPT ARGS...``) as ``__main__`` under torchrun, except that the
rank named by ``GOSSIP_TEST_STOP_RANK`` hangs (sleeps) before the script starts: the other
ranks then wait for it at the process group's rendezvous (test_torch_dist.py). A sleeping rank
ends at once when torchrun stops the job (SIGTERM), unlike a stopped one."""

from __future__ import annotations

import os
import runpy
import sys
import time

if os.environ.get("RANK") == os.environ.get("GOSSIP_TEST_STOP_RANK"):
    time.sleep(600)
script, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
