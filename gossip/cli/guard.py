"""How a script ends when something goes wrong: one ``error:`` line and an exit status
(:data:`BAD_INPUT` for input refused, :data:`FAILED` for a run that could not finish), under
MPI with every rank stopped; :func:`guarded` wraps a script's ``main``."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from gossip.comm.world import World

log = logging.getLogger("gossip")


BAD_INPUT = 2
"""Exit status of a run refused for its input (a bad flag or file, a run too large for the
memory), like argparse's own refusals."""
FAILED = 1
"""Exit status of a run that started and could not finish (a diverged or failed run, a silent
neighbor, memory exhausted mid-run, an internal error)."""

DEBUG_VAR = "GOSSIP_DEBUG"
"""Set to 1 to see an unexpected exception's traceback instead of its one-line summary."""

DEFAULT_MEMORY_HINT = "--nodes or the model's size (--dim, --shape)"


def guarded(main_fn, world_of=None, memory_hint: str = DEFAULT_MEMORY_HINT):
    """Run ``main_fn``; every error ends the job with one clean ``error:`` line, and under MPI
    with an abort.

    Exit status :data:`BAD_INPUT` (2, as argparse) for bad input: a ``SystemExit`` with a
    message (the scripts' own checks of flags and files) or a :class:`gossip.ConfigError` (a
    bad flag, file, compressor spec, or a run too large for the memory). Exit status
    :data:`FAILED` (1) for a run that could not finish: any other :class:`gossip.GossipError`
    (a refused checkpoint, a silent rank, runs that diverged), memory exhausted during the run
    (``MemoryError``, torch's out-of-memory errors; the line names ``memory_hint``, the flags to
    lower), and any other exception, printed as ``error: internal error: Type: message`` with a
    hint to set ``GOSSIP_DEBUG=1``, which shows the full traceback instead.

    Under MPI the job is then aborted, since the other ranks would otherwise wait for the failed
    one until their timeout. An error every rank meets alike (a configuration error) is printed
    by rank 0 only: when every rank reaches it within a few seconds they all exit with its
    status, without an abort (no launcher noise after the line); otherwise the other ranks wait
    a moment before printing, and rank 0's abort ends them first. A silent neighbor
    (:class:`CommError`), memory exhausted or an internal error is reported at once by every
    rank that saw it.
    SIGINT/SIGTERM during a checkpointed run end with exit status 128 + signal, after the
    final checkpoint (every rank stops at the same round, so nothing is aborted).
    ``world_of`` gives the world (default :meth:`World.current`, imported only on an error:
    the world the script detected, never a second wait at start-up).
    """
    from gossip.errors import CommError, ConfigError, GossipError, Interrupted

    if world_of is None:
        def world_of() -> World:
            from gossip.comm.world import World

            return World.current()

    try:
        return main_fn()
    except Interrupted as exc:
        log.warning("%s", exc)
        raise SystemExit(128 + int(exc.signum)) from None
    except SystemExit as exc:
        if exc.code in (0, None) or isinstance(exc.code, int):
            raise
        _fail(world_of(), str(exc.code), BAD_INPUT, at_once=False)
    except KeyboardInterrupt:
        if os.environ.get(DEBUG_VAR, "") not in ("", "0"):
            raise
        _interrupted()
    except Exception as exc:
        oom = out_of_memory(exc)
        if oom is not None:
            _fail(world_of(), f"out of memory during the run ({oom}); lower {memory_hint}, or "
                  "spread the nodes over more MPI ranks", FAILED, at_once=True)
        if isinstance(exc, GossipError):
            code = BAD_INPUT if isinstance(exc, ConfigError) else FAILED
            _fail(world_of(), str(exc), code, at_once=isinstance(exc, CommError))
        if os.environ.get(DEBUG_VAR, "") not in ("", "0"):
            world = world_of()
            if world.size > 1:
                log.error("rank %d stopping the job: %s", world.rank, exc, exc_info=True)
                world.abort(FAILED)  # after the log has been forwarded
            raise
        _fail(world_of(), f"internal error: {type(exc).__name__}: {one_line(str(exc))}; run with "
              f"{DEBUG_VAR}=1 for the traceback", FAILED, at_once=True)


INTERRUPTED = 130
"""Exit status of a run stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""


def _interrupted() -> NoReturn:
    """Ctrl-C outside a checkpointed run: one line (from the first rank alone; a launcher
    hands the signal to every rank) instead of the traceback of wherever the run was."""
    from gossip.comm.launch import launcher_rank

    if launcher_rank() == 0:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # below a progress bar's line
        print("error: interrupted (Ctrl-C): the log (--out) keeps every record written so far, "
              "without the run's summary; with --checkpoint-every K a run stopped so can be "
              "continued with --resume", file=sys.stderr, flush=True)
    raise SystemExit(INTERRUPTED) from None


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


_OOM_TEXTS = ("can't allocate memory", "out of memory", "not enough memory", "cannot allocate memory")


def out_of_memory(exc: BaseException) -> str | None:
    """What ran out, when ``exc`` (or an exception it was raised from) is an allocation failure:
    ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA), or the ``RuntimeError`` torch's CPU
    allocator raises ("can't allocate memory"); else None. torch is not imported for this."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        names = {c.__name__ for c in type(exc).__mro__}
        text = str(exc)
        if isinstance(exc, MemoryError) or "OutOfMemoryError" in names or (
                isinstance(exc, RuntimeError) and any(t in text.lower() for t in _OOM_TEXTS)
                and "GossipError" not in names):
            first = one_line(text, 160)
            return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        exc = exc.__cause__ or exc.__context__
    return None


def _fail(world: World, text: str, code: int, at_once: bool):
    """End the job with ``text`` as one ``error:`` line and exit status ``code``."""
    text = text if text.startswith("error:") else f"error: {text}"
    tell_torchrun(text)
    if _stop_job(world, text, code, at_once=at_once):
        raise SystemExit(code) from None
    if world.is_root or at_once:  # ranks whose group never formed: rank 0 says what all met
        print(text, file=sys.stderr, flush=True)
    raise SystemExit(code) from None


TORCHRUN_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun asks each worker to leave its error (the path, in the worker's environment)."""


def tell_torchrun(text: str) -> None:
    """Under torchrun, leave ``text`` in the worker's error file: torchrun's failure summary
    (the ``ChildFailedError`` report it prints after any worker fails) then shows this line as
    the root cause instead of "traceback: To enable traceback see ...". Elsewhere nothing."""
    import json

    path = os.environ.get(TORCHRUN_ERROR_FILE)
    if not path:
        return
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text,
                                                       "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except OSError:  # torchrun then reports the exit status alone, as before
        pass


AGREE_S = 3.0  # seconds the ranks take to find that all of them met the same error


def _stop_job(world: World, text: str, code: int, at_once: bool) -> bool:
    """Across processes: print ``text`` with the rank and end every process (all exit when all
    met a configuration error, else an abort), returning True; in process: False, the caller
    prints."""
    if world.size <= 1:
        return False
    if not at_once and world.all_stop(AGREE_S):  # every rank met it: rank 0 says it, all exit
        if world.is_root:
            print(f"[rank {world.rank}] {text}", file=sys.stderr, flush=True)
        return True
    if not at_once and not world.is_root:
        time.sleep(1.5)  # rank 0 meets the same error and aborts the job before this prints
    print(f"[rank {world.rank}] {text}", file=sys.stderr, flush=True)
    world.abort(code)  # after mpiexec has forwarded the message
    return True
