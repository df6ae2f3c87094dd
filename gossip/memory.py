"""How much memory a run will need, estimated from its flags before anything is allocated.

A script adds up what its run allocates (:class:`Footprint`: the block of per-node vectors the
algorithm keeps, the message rows it sends and receives, the problem's data and its central
solver) and calls :func:`check`, which refuses a run larger than the memory the process may
use (:func:`available_memory`: ``MemAvailable`` of ``/proc/meminfo``, the cgroup's limit and
``RLIMIT_AS``, or ``--max-memory``) with one line: needed vs available, and which flag to lower.

The estimate is an upper-ish bound of what the run adds to the interpreter (torch's own few
hundred MB are not counted): the algorithms declare how many model-sized vectors they keep per
node (:attr:`gossip.algorithms.Algorithm.state_copies`, ``neighbor_copies``), measured for the
built-in ones by ``tests/algorithms/test_memory.py``, which also checks that a medium run's peak
RSS stays below it. Under MPI each rank checks its own share: the nodes placed on it.

This module imports neither torch nor numpy.
"""

from __future__ import annotations

import math
import re
import resource
from dataclasses import dataclass, field

from gossip.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def parse_size(text: str) -> int:
    """Bytes of a size such as ``4G``, ``512M``, ``1.5GiB``, ``800k`` or ``1000000`` (binary
    units: K = 1024); an ``argparse`` type (a bad or non-positive size is an argparse error)."""
    import argparse

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgGtTpP]?)(?:i?[bB])?\s*", str(text))
    value = float(m[1]) * _UNITS[m[2].upper()] if m else math.nan
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"expected a size such as 4G, 512M or 1000000 (bytes), "
                                         f"got {text!r}")
    return int(value)


def format_size(nbytes: float) -> str:
    """``3.2 GiB``, ``512 MiB``, ``8.0 TiB``: a byte count for a message."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def _proc_bytes(path: str, field: str) -> int | None:
    """The ``field:`` line of a ``/proc`` file in kB (``/proc/meminfo``, ``/proc/self/status``)
    as bytes; None where the file or the field is missing."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _meminfo_available() -> int | None:
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def _cgroup_available() -> int | None:
    """What the cgroup (v2) still lets this process take, when it has a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as fh:
            current = int(fh.read().strip())
        return max(0, int(limit) - current)
    except (OSError, ValueError):
        return None


def _address_space_left() -> int | None:
    """``RLIMIT_AS`` minus the address space already mapped (``VmSize``), when limited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = _proc_bytes("/proc/self/status", "VmSize") or 0
    return max(0, soft - used)


def peak_rss() -> int:
    """This process's peak resident memory in bytes: ``VmHWM`` of ``/proc/self/status``, the
    peak of its own memory map. Not ``ru_maxrss``, which ``exec`` carries over from the map it
    replaces, so a child of a large process reads its parent's size (``ru_maxrss`` is the
    fallback where ``/proc`` is missing)."""
    peak = _proc_bytes("/proc/self/status", "VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def available_memory() -> tuple[int | None, str]:
    """(bytes this process may still allocate, where that figure comes from), or (None, "")
    when nothing says (not Linux): the smallest of ``MemAvailable``, the cgroup's limit and
    ``RLIMIT_AS``."""
    found = [(v, what) for v, what in ((_meminfo_available(), "MemAvailable"),
                                       (_cgroup_available(), "the cgroup's memory.max"),
                                       (_address_space_left(), "RLIMIT_AS (ulimit -v)"))
             if v is not None]
    if not found:
        return None, ""
    return min(found)


@dataclass
class Footprint:
    """What a run will allocate, part by part (name -> bytes)."""

    parts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, nbytes: float) -> Footprint:
        if nbytes > 0:
            self.parts[name] = self.parts.get(name, 0) + int(math.ceil(nbytes))
        return self

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """The largest parts first: ``node state 7.45 GiB, messages 1.2 GiB``."""
        big = sorted(self.parts.items(), key=lambda kv: -kv[1])[:3]
        return ", ".join(f"{name} {format_size(b)}" for name, b in big)


def message_bytes(spec: str, numel: int, itemsize: int, shape: tuple[int, ...] | None = None) -> float:
    """An upper-ish bound of one compressed message of a ``numel``-entry vector (bytes), from
    the compressor spec alone (no compressor is built): dense specs send ``itemsize`` (``fp16``,
    ``bf16``: 2) per entry, sparsifiers 4 bytes of index plus a value per kept entry, quantizers
    their bits, ``lowrank:R`` R (m + k) entries; a user's compressor counts as dense."""
    name, _, rest = str(spec).strip().lower().partition(":")
    param = rest.split(":")[0]
    header = 64
    if name in ("fp16", "bf16"):
        return 2 * numel + header
    if name in ("topk", "randk"):
        try:
            k = float(param)
        except ValueError:
            return numel * (4 + itemsize) + header
        kept = min(numel, math.ceil(k * numel) if k <= 1 and "." in param else int(k))
        return kept * (4 + itemsize) + header
    if name in ("sign", "sign_l1", "sign_l2"):
        return numel / 8 + 8 + header
    if name in ("qsgd", "lead"):
        digits = re.match(r"s?=?(\d+)", param)
        bits = min(int(digits[1]), 17) if digits else 16
        if param.startswith("s="):
            bits = max(1, int(digits[1]).bit_length() + 1) if digits else 17
        return numel * (bits + 1) / 8 + 8 + header
    if name == "natural":
        return numel * 9 / 8 + header
    if name == "lowrank" and shape is not None and len(shape) == 2:
        try:
            r = int(param)
        except ValueError:
            r = min(shape)
        return min(r, *shape) * (shape[0] + shape[1]) * itemsize + header
    return numel * itemsize + header


WIDER_ITEMSIZE = {2: 4, 4: 8}
"""Bytes per entry of the wider dtype a channel keeps its copies and sums in, by the model's
(:data:`gossip.core.channel.WIDER`: float16/bfloat16 -> float32, float32 -> float64)."""

ROW_BYTES = 128
"""What one message row adds to its entries (bytes): its 8-byte header, rounded up to the
64-byte alignment every row starts at (``x`` lives in message rows too)."""

NODE_BYTES = 2048
"""The engine's own bytes per node whatever its model's size: routing (row indices and
weights), random-stream keys, id lists, the round's per-row index temporaries (measured for
CHOCO on a ring: ~1.4 KiB per node at peak with 2 arcs, counted with a margin for the
allocator's run-to-run variation; :data:`ARC_BYTES` per arc on top)."""

ARC_BYTES = 192
"""The engine's bytes per arc (in-neighbor) of a node: each routing slot's source, target and
weight, in the slots and again fused (:class:`gossip.core.routing.MixPlan`)."""


EVENT_NODE_BYTES = 2048
"""What an asynchronous run's event loop keeps per node (:class:`gossip.network.events.EventLoop`):
its wake in the heap, clock counters, the cached clock and peer draws (a chunk each), the
counts of its arcs' messages, its out-neighbor list (counted ~1.8 KiB a node on a ring of 10⁵
nodes; measured with the engine: ~3.1 KiB a node besides x's rows after construction, +0.4 KiB
over 3 sweeps)."""


def block_footprint(*, nodes: int, numel: int, itemsize: int, state_copies: int,
                    neighbor_copies: int = 0, degree: int = 0, message: float = 0.0,
                    remote_rows: int = 0, wide_copies: int = 0, block_mix: bool = True,
                    footprint: Footprint | None = None) -> Footprint:
    """The engine's share of a run on ``nodes`` local nodes of ``numel`` entries each:
    ``state_copies`` (+ ``neighbor_copies`` × ``degree``) model-sized vectors per node, of
    which ``wide_copies`` at the wider dtype's size (:data:`WIDER_ITEMSIZE`), one sent
    ``message`` per node and the ``remote_rows`` messages received from other ranks, each row
    with its header and alignment (:data:`ROW_BYTES`, ``x``'s rows too), and with ``block_mix``
    (rounds that mix the whole block; an asynchronous run mixes a pair at a time) the mix's
    scratch: two blocks of one message per node."""
    fp = footprint or Footprint()
    vec = float(numel) * itemsize
    wide = min(wide_copies, state_copies)
    wide_vec = float(numel) * WIDER_ITEMSIZE.get(itemsize, itemsize)
    fp.add("node state", nodes * ((state_copies - wide + neighbor_copies * degree) * vec
                                  + wide * wide_vec))
    fp.add("messages", (nodes + remote_rows) * (message + ROW_BYTES) + nodes * ROW_BYTES)
    # the mix decodes one neighbour slot at a time: that slot's messages gathered into one
    # block, then their weighted values (peak of D-PSGD at 10⁵ x 1000, measured)
    if block_mix:
        fp.add("mixing scratch", 2.0 * nodes * (message + ROW_BYTES))
    return fp


def check(footprint: Footprint, *, lower: str, limit: int | None = None,
          where: str = "") -> None:
    """Raise :class:`ConfigError` when ``footprint`` exceeds ``limit`` (``--max-memory``,
    which replaces the machine's figure) or else the memory available to this process;
    ``lower`` names the flags that shrink the run, ``where`` the share checked (e.g. "rank 1's share: 4 of 8 nodes")."""
    need = footprint.total
    if limit is not None:
        have, source = limit, "--max-memory"
    else:
        have, source = available_memory()
        if have is None:
            return
    if need <= have:
        return
    share = f" ({where})" if where else ""
    raise ConfigError(
        f"this run needs about {format_size(need)} of memory{share} ({footprint.describe()}) but "
        f"{format_size(have)} is available ({source}); lower {lower}"
        + ("" if limit is not None else ", or pass --max-memory SIZE if the estimate is wrong")
    )


def add_memory_argument(group) -> None:
    """``--max-memory SIZE`` on an argparse group."""
    group.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE",
                       help="the memory a run may use (e.g. 4G, 512M): a run whose estimate "
                            "exceeds it is refused before anything is allocated; under MPI, per "
                            "rank (default: the memory available: MemAvailable, the cgroup's "
                            "limit, ulimit -v)")


def local_share(nodes: int, world_size: int) -> int:
    """The most nodes one rank hosts (contiguous blocks, as :meth:`World.local_nodes`)."""
    return -(-nodes // max(1, world_size))


__all__ = ["ARC_BYTES", "EVENT_NODE_BYTES", "NODE_BYTES", "Footprint", "add_memory_argument",
           "available_memory", "block_footprint", "check",
           "format_size", "local_share", "message_bytes", "parse_size"]
