"""Every built-in algorithm's trajectory, recorded two ways, so a change of numbers is seen on
any machine and a refactoring can show it changed no bit.

The scenarios are those of the MPI equality scripts (every algorithm at least once) plus
Prox-LEAD and BEER, 8 nodes in one process, float64, 12 to 20 rounds, and the asynchronous
methods (:data:`ASYNC`). Those run in virtual time on the event loop, without rounds: there a
round is a *sweep*, one :meth:`Engine.step <gossip.engine.Engine.step>` (the events up to n more
activations; what ``Engine.run`` records as one round), so their checkpoints are taken after
sweeps 1, 2, 5, 10 and 20. Each run gives:

* **checkpoints** (portable): after rounds :data:`CHECKPOINTS` (and the last), the bytes sent
  so far and three float64 values of the stacked models ``X`` (nodes in id order): ``Σ|x|``
  and two fixed projections ``Σ w·x`` (:func:`snapshot`). These values are a function of
  ``X``'s bits alone (exact products, :func:`math.fsum`), so the only difference between
  machines is the trajectory's own rounding. ``tests/algorithms/test_trajectories.py`` compares
  them with the recorded ones within :data:`RTOL` on every machine (its docstring says why
  that tolerance).
* **bits** (exact, per platform): one SHA-256 per scenario over every round's models and byte
  counts (an asynchronous run's also over each sweep's event-loop clock and counters: virtual
  time, activations, messages, messages lost, rejoins). Which bits come out depends on more
  than the code: torch's build and CPU kernels, MKL's and OpenBLAS's code paths for the CPU's
  vendor and model, the CPU target numba's JIT compiles for (FMA contraction), the libraries'
  versions and the environment variables that steer them. :func:`platform` reads all of that;
  the test compares the hashes only on a platform recorded with exactly those fields and skips
  elsewhere.

Both live in ``tests/data/trajectories.json`` (sorted, one trajectory per line)::

    python tests/helpers/trajectories.py --write          # after a change meant to alter numbers:
                                                          # checkpoints + this platform's bits
                                                          # (other platforms' bits are dropped)
    python tests/helpers/trajectories.py --add-platform   # code unchanged, another machine:
                                                          # add its bits (checkpoints must match)
    python tests/helpers/trajectories.py --save /tmp/before.json     # a refactoring: before ...
    python tests/helpers/trajectories.py --compare /tmp/before.json  # ... after: what changed

``--save``/``--compare`` need no recorded platform: the same machine before and after, every
bit compared; ``--compare`` names the trajectories that changed and whether their checkpoints
stayed within tolerance (rounding only) or not. ``make trajectories`` saves on its first call
and compares on the later ones. Without options, a run is compared with the recorded file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform as _platform
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.comm.world import World  # noqa: E402
from gossip.engine import Engine  # noqa: E402
from gossip.problems import make_problem  # noqa: E402
from gossip.rng import generator, init_seed  # noqa: E402
from tests.helpers import mpi_adaptive, mpi_scenarios, mpi_tracking_scenarios  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "trajectories.json"
NODES = 8
CHECKPOINTS = (1, 2, 5, 10)
"""Rounds after which a checkpoint is taken, besides a scenario's last round."""
RTOL = 1e-10
"""The portable check's tolerance: a checkpoint value may move by ``RTOL · Σ|x|`` (the
recorded ``Σ|x|`` of that checkpoint); tests/algorithms/test_trajectories.py says why."""
ENV_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
            "OPENBLAS_CORETYPE", "OPENBLAS_VERBOSE", "NPY_DISABLE_CPU_FEATURES",
            "NPY_ENABLE_CPU_FEATURES", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT",
            "NUMBA_FASTMATH", "NUMBA_DISABLE_JIT", "NUMBA_LOOP_VECTORIZE", "NUMBA_SLP_VECTORIZE")
"""Environment variables that steer which kernels run (part of the platform when set)."""
SIMD_FLAGS = re.compile(r"^(avx|fma|sse|ssse|f16c|amx|vnni|bmi|adx|sha_ni|vpclmulqdq|vaes|gfni"
                        r"|asimd|sve|sme(?!p)|fphp|neon|vfp)")
"""The CPU flags that decide vectorized code paths (the rest: virtualization, power, ...)."""
CPU_ID = ("cpu family", "model", "stepping", "CPU implementer", "CPU architecture", "CPU variant",
          "CPU part", "CPU revision")
"""The /proc/cpuinfo fields that name a CPU's generation (x86; Arm), where the model name is
generic (a virtual machine's "AMD EPYC") or missing."""


def _extra(name: str, n: int, world: World) -> tuple[Engine, dict]:
    """Prox-LEAD (with an l1 prox) and BEER, which the MPI scripts do not cover."""
    alg, kind, spec = {"prox-lead-lasso": ("prox-lead", "lasso", "qsgd:4bit"),
                       "beer-topk": ("beer", "least-squares", "topk:0.25")}[name]
    problem = make_problem(kind, n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    eta = 0.2 / problem.smoothness().L
    x0 = problem.initial_point()
    engine = Engine(make_algorithm(alg, eta=eta), topologies.build("ring", n), lambda i: x0,
                    compressor=spec, seed=11, world=world.configure(timeout=60),
                    oracles=lambda i, gen: problem.oracle(i, gen, "sgd", 2))
    return engine, {}


ASYNC: dict[str, tuple[str, dict, str, str | None, bool]] = {
    "async-pairwise": ("pairwise-gossip", {}, "none", None, False),
    "async-pairwise-lossy": ("pairwise-gossip", {}, "none", "loss=0.3", False),
    "async-pairwise-churn": ("pairwise-gossip", {}, "none", "churn=at:3@2-4,fresh;loss=0.1",
                             False),
    "async-ad-psgd": ("ad-psgd", {}, "none", None, True),
    "async-ad-psgd-compute": ("ad-psgd", {}, "none", "loss=0.2;compute=exp:1", True),
    "async-choco-topk": ("async-choco", {"gamma": 0.6}, "topk:0.5", None, False),
    "async-choco-qsgd-sgd": ("async-choco", {"gamma": 0.6}, "qsgd:4", "loss=0.25", True),
    "async-choco-randk-churn": ("async-choco", {"gamma": 0.6}, "randk:0.3",
                                "churn=at:2@3-9+7@5-inf,fresh;loss=0.2", False),
    "async-choco-none": ("async-choco", {"gamma": 0.5}, "none", None, False),
    "async-gossip-learning-delay": ("gossip-learning", {}, "none", "delay=exp:0.5;loss=0.2", True),
    "async-sgp-delay": ("async-sgp", {}, "none", "delay=exp:0.3;loss=0.1", True),
}
"""The asynchronous methods, each at least once: name -> (algorithm, hyper-parameters,
compressor, network, whether the nodes take gradient steps). Between them: loss, churn with
fresh restarts, delays, compute times, a deterministic compressor (top-k) and two randomized
ones (QSGD, rand-k), averaging and SGD."""


def _distinct(i: int) -> torch.Tensor:
    """Node i's starting point for averaging: standard normal, drawn from its own seed."""
    return torch.randn(20, generator=generator(init_seed(5, i)), dtype=torch.float64)


def _async(name: str, n: int, world: World) -> tuple[Engine, dict]:
    """An asynchronous method in virtual time on a ring: averaging from distinct starting
    points, or SGD on a heterogeneous least-squares problem from a common one (step size a
    fifth of ``1/L``)."""
    alg, hp, spec, network, trains = ASYNC[name]
    problem = make_problem("least-squares", n_nodes=n, dim=20, samples_per_node=15, seed=4,
                           heterogeneity=2.0, dtype=torch.float64)
    x0 = problem.initial_point()
    if trains:
        hp = hp | {"eta": 0.2 / problem.smoothness().L}
    engine = Engine(make_algorithm(alg, **hp), topologies.build("ring", n),
                    (lambda i: x0) if trains else _distinct,
                    compressor=spec, seed=11, world=world, network=network,
                    oracles=(lambda i, gen: problem.oracle(i, gen, "sgd", 2)) if trains else None)
    return engine, {}


def scenarios() -> dict[str, Callable[[str, int, World], Any]]:
    """Scenario name -> ``engine_for(name, n, world)`` (an engine and options, or None)."""
    table: dict[str, Callable[[str, int, World], Any]] = {}
    for module in (mpi_scenarios, mpi_tracking_scenarios, mpi_adaptive):
        table.update({name: module.engine_for for name in module.SCENARIOS})
    table.update({"prox-lead-lasso": _extra, "beer-topk": _extra})
    table.update({name: _async for name in ASYNC})
    return table


# -- one run -------------------------------------------------------------------------------------
@dataclass
class Trace:
    """One scenario's run: its SHA-256 (:func:`trace`) and its checkpoints."""

    digest: str
    rounds: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    values: list[list[float]] = field(default_factory=list)

    def checkpoints(self) -> dict[str, list]:
        """The checkpoints as the JSON file holds them."""
        return {"rounds": self.rounds, "bytes": self.bytes, "values": self.values}


def _golden_weights(size: int, ratio: float) -> np.ndarray:
    """``size`` fixed weights in [-1, 1): ``2·frac(k·ratio) − 1``, k = 1..size (exact IEEE
    operations, the same bits on every machine)."""
    return np.modf(np.arange(1, size + 1, dtype=np.float64) * ratio)[0] * 2.0 - 1.0


def snapshot(X: np.ndarray) -> list[float]:
    """``[Σ|x|, Σ w_a·x, Σ w_b·x]`` over the stacked models ``X`` ([n, d] float64, nodes in id
    order), ``w_a``, ``w_b`` fixed pseudo-random weights in [-1, 1). Each product is one IEEE
    multiplication and each sum correctly rounded (:func:`math.fsum`), so the values depend on
    ``X``'s bits alone, not on the machine that sums them; ``Σ|x|`` bounds what rounding ``X``
    differently can move any of them (``|Δ Σ w·x| ≤ max|Δx/x| · Σ|x|``)."""
    flat = np.ascontiguousarray(X, dtype=np.float64).reshape(-1)
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    return [math.fsum(np.abs(flat)),
            math.fsum(_golden_weights(flat.size, golden) * flat),
            math.fsum(_golden_weights(flat.size, math.sqrt(2.0)) * flat)]


def models(engine: Engine) -> np.ndarray:
    """Every node's model as rows of one [n, d] float64 array, in node id order."""
    return np.stack([engine.nodes[i].x.detach().cpu().to(torch.float64).numpy().reshape(-1)
                     for i in sorted(engine.nodes)])


def total_bytes(engine: Engine) -> int:
    """Bytes the nodes have sent so far (the transport's count)."""
    return sum(int(engine.transport.bytes_sent.get(i, 0)) for i in sorted(engine.nodes))


def trace(engine: Engine, rounds: int,
          after_round: Callable[[Engine, int], None] | None = None) -> Trace:
    """Run ``rounds`` rounds: the SHA-256 of every node's model and cumulative bytes after each
    round, and the checkpoints. ``after_round(engine, t)`` runs after round t, before anything
    is read (tests use it to perturb a run)."""
    h = hashlib.sha256()
    out = Trace("")
    at = {t for t in CHECKPOINTS if t < rounds} | {rounds}
    events = engine.network.events if engine.algorithm.asynchronous else None
    for t in range(1, rounds + 1):
        engine.step()
        if after_round is not None:
            after_round(engine, t)
        for i in sorted(engine.nodes):
            h.update(engine.nodes[i].x.detach().cpu().contiguous().numpy().tobytes())
            h.update(int(engine.transport.bytes_sent.get(i, 0)).to_bytes(8, "little"))
        if events is not None:  # the event loop's clock and counters
            h.update(json.dumps(events.log_fields(), sort_keys=True).encode())
        if t in at:
            out.rounds.append(t)
            out.bytes.append(total_bytes(engine))
            out.values.append(snapshot(models(engine)))
    out.digest = h.hexdigest()
    return out


def compute(names: Iterable[str] | None = None,
            after_round: Callable[[Engine, int], None] | None = None,
            build: Callable[[str, Callable, World], Any] | None = None) -> dict[str, Trace]:
    """Every scenario's (or those in ``names``) :class:`Trace`, on one thread of torch and of
    numpy's BLAS (a thread count would change how sums are split). ``build(name, engine_for,
    world)``: how to build a scenario's engine (default ``engine_for(name, NODES, world)``)."""
    from threadpoolctl import threadpool_limits

    wanted = set(names) if names else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            world = World.detect()
            out = {}
            for name, engine_for in scenarios().items():
                if wanted is not None and name not in wanted:
                    continue
                built = (build or (lambda nm, ef, w: ef(nm, NODES, w)))(name, engine_for, world)
                if built is None:
                    continue
                engine, options = built
                out[name] = trace(engine, options.get("rounds", 20), after_round)
            return out
    finally:
        torch.set_num_threads(threads)


# -- the portable check --------------------------------------------------------------------------
def compare_checkpoints(recorded: dict[str, list], got: dict[str, list],
                        rtol: float = RTOL) -> list[str]:
    """What differs between a scenario's recorded checkpoints and a run's (empty: none): the
    rounds and bytes exactly, each value within ``rtol`` times the recorded ``Σ|x|`` of its
    checkpoint."""
    if recorded["rounds"] != got["rounds"]:
        return [f"checkpoint rounds {got['rounds']}, recorded {recorded['rounds']}"]
    problems = []
    for t, want, have in zip(recorded["rounds"], recorded["bytes"], got["bytes"], strict=True):
        if want != have:
            problems.append(f"round {t}: {have} bytes sent, recorded {want}")
    for t, want, have in zip(recorded["rounds"], recorded["values"], got["values"], strict=True):
        scale = abs(want[0])
        for k, (a, b) in enumerate(zip(want, have, strict=True)):
            if not abs(a - b) <= rtol * scale:  # NaN fails too
                problems.append(f"round {t}: value {k} is {b!r}, recorded {a!r} "
                                f"({abs(a - b) / scale if scale else math.inf:.1e} of Σ|x|)")
    return problems


def deviation(recorded: dict[str, list], got: dict[str, list]) -> float:
    """The largest ``|Δvalue| / Σ|x|`` over the checkpoints (what :data:`RTOL` bounds)."""
    worst = 0.0
    for want, have in zip(recorded["values"], got["values"], strict=True):
        scale = abs(want[0])
        for a, b in zip(want, have, strict=True):
            dev = abs(a - b) / scale if scale else (0.0 if a == b else math.inf)
            worst = max(worst, dev if dev == dev else math.inf)
    return worst


# -- the exact check -----------------------------------------------------------------------------
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "absent"


def platform() -> dict[str, str]:
    """What the bits depend on besides the code, as far as it reads cheaply: the CPU (vendor,
    model, family/model/stepping, SIMD flags; numba's LLVM target), torch's build and CPU
    capability, numpy's BLAS, the versions of the numerical libraries, Python, the C library,
    and the environment variables of :data:`ENV_VARS` that are set."""
    import llvmlite.binding

    cpu = _cpuinfo()
    flags = sorted(f for f in cpu.get("flags", cpu.get("Features", "")).split() if SIMD_FLAGS.match(f))
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        numpy_blas = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError, TypeError):
        numpy_blas = "unknown"
    mkl = re.search(r"Math Kernel Library Version ([^\n]*)", torch.__config__.show())
    libc = " ".join(_platform.libc_ver()).strip() or "unknown"
    fields = {
        "machine": f"{_platform.system()} {_platform.machine()}",
        "cpu": cpu.get("model name") or _platform.processor() or "unknown",
        "cpu_vendor": cpu.get("vendor_id", "unknown"),
        "cpu_id": " ".join(f"{k} {cpu[k]}" for k in CPU_ID if k in cpu) or "unknown",
        "cpu_simd": " ".join(flags),
        "llvm_cpu": llvmlite.binding.get_host_cpu_name(),
        "torch": f"{torch.__version__} ({torch.version.git_version[:12]})",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_blas": f"MKL {mkl.group(1).split(' for ')[0].strip()}" if mkl else "no MKL",
        "numpy": f"{np.__version__}, {numpy_blas}",
        "numba": _version("numba"),
        "scipy": _version("scipy"),
        "python": ".".join(_platform.python_version_tuple()[:2]),
        "libc": libc,
    }
    fields.update({f"env {var}": os.environ[var] for var in ENV_VARS if var in os.environ})
    return fields


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The fields in which platform ``a`` differs from ``b``, as ``key: a-value (b-value)``."""
    return [f"{k}: {a.get(k, 'unset')!r} (recorded {b.get(k, 'unset')!r})"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def recorded_bits(data: dict[str, Any], fields: dict[str, str]) -> dict[str, str] | None:
    """The hashes recorded for exactly the platform ``fields`` (None: not recorded)."""
    for entry in data.get("platforms", []):
        if entry["platform"] == fields:
            return entry["hashes"]
    return None


def skip_reason(data: dict[str, Any], fields: dict[str, str]) -> str:
    """Why this platform's exact bits cannot be checked: how it differs from the closest
    recorded platform."""
    entries = data.get("platforms", [])
    if not entries:
        return "no platform's exact trajectory bits are recorded"
    closest = min(entries, key=lambda e: len(differences(fields, e["platform"])))
    diff = differences(fields, closest["platform"])
    return (f"the exact trajectory bits are recorded for {len(entries)} other platform(s); the "
            f"closest differs in {'; '.join(diff)}. Record this one with "
            "`python tests/helpers/trajectories.py --add-platform` (code unchanged) "
            "or compare a change locally with --save/--compare")


# -- the file ------------------------------------------------------------------------------------
def load(path: Path = GOLDEN) -> dict[str, Any]:
    """The recorded file (empty sections when there is none)."""
    return json.loads(path.read_text()) if path.exists() else {"checkpoints": {}, "platforms": []}


def dumps(data: dict[str, Any]) -> str:
    """The file's text: sorted keys, one scenario per line (checkpoints and hashes), the
    platforms sorted by their fields."""
    def block(mapping: dict[str, Any], indent: str) -> str:
        lines = [f"{indent}{json.dumps(k)}: {json.dumps(mapping[k], sort_keys=True)}"
                 for k in sorted(mapping)]
        return "{\n" + ",\n".join(lines) + "\n" + indent[:-1] + "}"

    platforms = sorted(data.get("platforms", []),
                       key=lambda e: json.dumps(e["platform"], sort_keys=True))
    entries = [f'  {{"platform": {block(e["platform"], "    ")},\n'
               f'   "hashes": {block(e["hashes"], "    ")}}}' for e in platforms]
    return ('{\n "checkpoints": ' + block(data.get("checkpoints", {}), "  ") + ",\n"
            ' "platforms": [\n' + ",\n".join(entries) + ("\n" if entries else "") + " ]\n}\n")


def write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(dumps(data))


# -- command line --------------------------------------------------------------------------------
def _report(traces: dict[str, Trace], data: dict[str, Any], bits: dict[str, str] | None,
            only_changed: bool = False) -> list[str]:
    """Print each scenario against a record (``bits``: its hashes, None: none to compare):
    whether its bits are the same, and whether its checkpoints are within :data:`RTOL` (bits
    that changed with checkpoints within it: rounding only). The names of those that changed."""
    changed = []
    for name, tr in traces.items():
        want = data.get("checkpoints", {}).get(name)
        problems = ["unrecorded"] if want is None else compare_checkpoints(want, tr.checkpoints())
        portable = "; ".join(problems[:2]) if problems else "within tolerance"
        exact = "-" if bits is None else ("same" if bits.get(name) == tr.digest else "DIFF")
        if problems or exact == "DIFF":
            changed.append(name)
        elif only_changed:
            continue
        print(f"{exact:4}  {name:24} {tr.digest[:16]}  checkpoints: {portable}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Every built-in algorithm's trajectory: portable checkpoints and exact bits "
                    "(module docstring: tests/helpers/trajectories.py).",
        epilog="without options: compare a run with the recorded file")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true",
                        help=f"record the checkpoints and this platform's bits in {GOLDEN.name} "
                             "(after a change meant to alter numbers: the other platforms' bits "
                             "are dropped)")
    action.add_argument("--add-platform", action="store_true",
                        help="add this platform's bits to the recorded ones (refused when the "
                             "checkpoints do not match: then the numbers changed, use --write)")
    action.add_argument("--save", metavar="PATH", type=Path,
                        help="save every scenario's bits and checkpoints (before a refactoring)")
    action.add_argument("--compare", metavar="PATH", type=Path,
                        help="compare with a file of --save, bit for bit (after it)")
    parser.add_argument("--golden", type=Path, default=GOLDEN, help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    args = parser.parse_args(argv)

    traces = compute(args.names)
    fields = platform()
    hashes = {name: tr.digest for name, tr in traces.items()}
    checkpoints = {name: tr.checkpoints() for name, tr in traces.items()}
    if args.save:
        write(args.save, {"checkpoints": checkpoints,
                          "platforms": [{"platform": fields, "hashes": hashes}]})
        print(f"saved {len(traces)} trajectories to {args.save}")
        return 0
    if args.compare:
        before = load(args.compare)
        saved = (before["platforms"] or [{}])[0]
        if saved.get("platform") != fields:
            print("warning: saved on another platform, its bits may differ: " + "; ".join(
                differences(fields, saved.get("platform", {}))))
        changed = _report(traces, before, saved.get("hashes", {}), only_changed=True)
        gone = sorted(set(before["checkpoints"]) - set(traces)) if not args.names else []
        for name in gone:
            print(f"GONE  {name}")
        total = len(set(before["checkpoints"]) | set(traces))  # the new ones count as changed
        print(f"{len(changed) + len(gone)} of {total} trajectories changed"
              + (f": {', '.join(changed + gone)}" if changed or gone else " (every bit the same)"))
        return 1 if changed or gone else 0
    data = load(args.golden)
    if args.write:
        if args.names:
            parser.error("--write records every scenario: give no names")
        write(args.golden, {"checkpoints": checkpoints,
                            "platforms": [{"platform": fields, "hashes": hashes}]})
        print(f"recorded {len(traces)} trajectories: checkpoints and the bits of this platform")
        return 0
    if args.add_platform:
        if args.names:
            parser.error("--add-platform records every scenario: give no names")
        wrong = {name: compare_checkpoints(want, checkpoints[name])
                 for name, want in data["checkpoints"].items() if name in checkpoints}
        wrong = {name: p for name, p in wrong.items() if p}
        if wrong or set(data["checkpoints"]) != set(checkpoints):
            _report(traces, data, None)
            print("refused: the checkpoints differ from the recorded ones (the numbers changed: "
                  "record everything with --write)")
            return 1
        others = [e for e in data["platforms"] if e["platform"] != fields]
        write(args.golden, {"checkpoints": data["checkpoints"],
                            "platforms": others + [{"platform": fields, "hashes": hashes}]})
        print(f"added this platform's bits ({len(others) + 1} platforms recorded)")
        return 0
    bits = recorded_bits(data, fields)
    changed = _report(traces, data, bits)
    if bits is None:
        print("exact bits not checked: " + skip_reason(data, fields))
    print(f"{len(changed)} of {len(traces)} trajectories changed"
          + (f": {', '.join(changed)}" if changed else ""))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
