"""docs/network.md's loss-rate and lag tables are the ones benchmarks/bench_loss.py prints, and
the benchmark runs end to end (on a tiny round budget: the real one takes minutes)."""

from __future__ import annotations

import contextlib
import io
import shlex
from types import ModuleType

from tests.helpers.launch import ROOT, script

DOC = ROOT / "docs" / "network.md"
SECTION = "## Measured: what loss does to each method"
STALE_SECTION = "## Measured: what late messages do"


def section(text: str, title: str) -> str:
    """The docs' section ``title``, up to the next one."""
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def bench() -> ModuleType:
    """benchmarks/bench_loss.py as a module."""
    return script("bench_loss", "benchmarks")


def fake(methods, keys: tuple[str, ...], networks) -> dict:
    row = dict.fromkeys(keys, 0.5) | {"bits": 8.0}
    return {(alg, comp, net): [row] for alg, comp in methods for net in networks}


def rounds_in_doc(text: str) -> int:
    """The ``--rounds`` of the command the docs' table was made with (the benchmark's default
    when the command gives none)."""
    command = next(line for line in text.splitlines()
                   if line.strip().startswith("python benchmarks/bench_loss.py"))
    words = command.split("#")[0].split()
    return int(words[words.index("--rounds") + 1]) if "--rounds" in words else 1000


def check_tables(measured: str, networks, count: str, methods, late: bool = False) -> None:
    """``measured`` has the benchmark's two tables' columns (``count``: the lost or late
    column) and exactly one row per (method, network) of ``methods``."""
    b = bench()
    averaging = b.averaging_table(fake(b.AVERAGING, ("consensus", "drift", "exact", count),
                                       networks), late=late)
    optimization = b.optimization_table(
        fake(b.OPTIMIZERS, ("distance", "distance_half", "consensus", count), networks),
        rounds_in_doc(measured), late=late)
    for table in (averaging, optimization):
        assert table.splitlines()[0] in measured  # the same columns
    for alg, comp in methods:
        for net in networks:  # one row per (method, network)
            assert measured.count(f"| {alg} | {comp} | {net} | ") == 1, (alg, comp, net)


def test_docs_table_is_the_benchmarks():
    b = bench()
    text = DOC.read_text()
    assert SECTION in text
    check_tables(section(text, SECTION), b.NETWORKS, "lost", b.AVERAGING + b.OPTIMIZERS)


def test_docs_lag_table_is_the_benchmarks():
    b = bench()
    late = [(a, c) for a, c in b.AVERAGING + b.OPTIMIZERS
            if b.algorithm_class(a).on_loss not in b.NOT_LATE]
    check_tables(section(DOC.read_text(), STALE_SECTION), b.STALE_NETWORKS, "late", late,
                 late=True)


def test_lag_benchmark_runs_end_to_end():
    b = bench()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        out = b.main(["--networks", "stale", "--rounds", "8", "--seeds", "0", "--methods",
                      "gossip", "choco", "choco-arcs"])  # 8: its first half outlives stale=3
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
             if line.startswith("| ") and not line.startswith("| method")]
    assert len(cells) == 3 * len(b.STALE_NETWORKS)  # gossip, choco x 2 compressors; no -arcs
    assert all(c[-1] == "1.000" for c in cells)  # every message moves, in its round
    assert all((c[-3] == "0") == (c[2] == "none") for c in cells)  # late only with a lag
    assert [int(c[-3]) for c in cells if c[2] == "stale=1"] == [16 * 2 * 8] * 3


def test_benchmark_runs_end_to_end():
    b = bench()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        out = b.main(["--rounds", "5", "--seeds", "0"])  # 5: K-GT's first exchange (K = 5)
    lines = out.splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| method")]
    assert len(rows) == (len(b.AVERAGING) + len(b.OPTIMIZERS)) * len(b.NETWORKS)
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in rows]
    ideal = [c for c in cells if c[2] == "none"]
    assert len(ideal) == len(b.AVERAGING) + len(b.OPTIMIZERS)
    assert all(c[-3] == "0" and c[-1] == "1.000" for c in ideal)  # nothing lost, every bit sent
    lossy = [c for c in cells if c[2] == "loss=0.3"]
    assert all(int(c[-3]) > 0 and float(c[-1]) < 1 for c in lossy)  # a lost message sends no bits


def test_benchmark_runs_a_subset():
    b = bench()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        out = b.main(["--rounds", "2", "--seeds", "0", "--methods", "choco-arcs"])
    rows = [line for line in out.splitlines() if line.startswith("| choco-arcs |")]
    assert len(rows) == 2 * len(b.NETWORKS) and "Averaging" not in out


NOISE_SECTION = "## A noisy channel (`noise=`)"
ACTIVE_SECTION = "## Partial activation (`active=`)"


def _documented_methods(measured: str) -> list[tuple[str, str]]:
    """The (method, compressor) of the benchmark the section's command names (--methods)."""
    b = bench()
    command = next(line for line in measured.splitlines()
                   if line.strip().startswith("python benchmarks/bench_loss.py"))
    words = command.split("#")[0].split()
    names = words[words.index("--methods") + 1:]
    return [(a, c) for a, c in b.AVERAGING + b.OPTIMIZERS if a in names]


def test_docs_noise_and_activity_tables_are_the_benchmarks():
    b = bench()
    text = DOC.read_text()
    for title, networks, refused in ((NOISE_SECTION, b.NOISE_NETWORKS, ("push-sum", "powergossip")),
                                     (ACTIVE_SECTION, b.ACTIVE_NETWORKS, ())):
        measured = section(text, title)
        methods = [m for m in _documented_methods(measured) if m[0] not in refused]
        check_tables(measured, networks, "lost", methods)


ACK_SECTION = "## Lost and late messages together: acknowledged per-arc copies"


def test_docs_ack_tables_are_the_benchmarks():
    """Each command of the section (``--networks ack``, its ``--rounds`` and ``--methods``) is
    followed by the benchmark's table for it: its columns, one row per method and network."""
    b = bench()
    measured = section(DOC.read_text(), ACK_SECTION)
    commands = [shlex.split(line.split("#")[0]) for line in measured.splitlines()
                if line.strip().startswith("python benchmarks/bench_loss.py")]
    assert commands

    def values(words: list[str], flag: str) -> list[str]:
        if flag not in words:
            return []
        rest = words[words.index(flag) + 1:]
        return rest[: next((k for k, w in enumerate(rest) if w.startswith("--")), len(rest))]

    for words in commands:
        assert values(words, "--networks") == ["ack"]
        rounds = int(values(words, "--rounds")[0])
        networks = [n for n in b.ACK_NETWORKS if n in (values(words, "--only") or b.ACK_NETWORKS)]
        methods = [m for m in b.ACK_OPTIMIZERS if m[0] in values(words, "--methods")]
        assert methods and networks, words
        table = b.optimization_table(
            fake(methods, ("distance", "distance_half", "consensus", "late"), networks),
            rounds, late=True)
        assert table.splitlines()[0] in measured
        for alg, comp in methods:
            for net in networks:
                assert measured.count(f"| {alg} | {comp} | {net} | ") == 1, (alg, comp, net)


def test_ack_benchmark_runs_end_to_end():
    b = bench()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        out = b.main(["--networks", "ack", "--rounds", "4", "--seeds", "0"])
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
             if line.startswith("| ") and not line.startswith("| method")]
    assert len(cells) == len(b.ACK_OPTIMIZERS) * len(b.ACK_NETWORKS) and "Averaging" not in out
    assert all((c[-3] == "0") == ("stale=" not in c[2]) for c in cells)  # late only with a lag
    assert all((c[-1] == "1.000") == ("loss=" not in c[2]) for c in cells)  # lost: fewer bits
