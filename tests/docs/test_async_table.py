"""docs/asynchronous.md's measured tables are the ones benchmarks/bench_async.py prints, and the
benchmark runs end to end (a tiny configuration, in this process: the real one takes a minute)."""

from __future__ import annotations

import contextlib
import io
import math
from types import ModuleType

from tests.helpers.launch import ROOT, script

# none launches (tests/conftest.py): the benchmark runs --in-process, its --mpi table is fed given runs
LAUNCHES_MARKED_PER_TEST = True

DOC = ROOT / "docs" / "asynchronous.md"
SECTION = "## Measured: a straggler, and pairwise gossip on 10⁴ nodes"
TINY = ["--sweeps", "40", "--seeds", "0", "--targets", "0.5", "--pairwise-nodes", "200",
        "--pairwise-graphs", "ring", "--pairwise-sweeps", "2", "--dims", "1", "--in-process"]


def bench() -> ModuleType:
    """benchmarks/bench_async.py as a module."""
    return script("bench_async", "benchmarks")


def measured() -> str:
    """What lies between the benchmark's markers in the page."""
    b = bench()
    text = DOC.read_text()
    assert SECTION in text
    section = text[text.index(SECTION):]
    assert b.BEGIN in section and b.END in section
    return section.split(b.BEGIN, 1)[1].split(b.END, 1)[0]


def sweeps_in_doc(text: str) -> int:
    """The ``--sweeps`` the docs' tables were made with (in their captions)."""
    caption = next(line for line in text.splitlines() if line.startswith("Time to "))
    return int(caption.split(" sweeps,")[0].rsplit(" ", 1)[1])


def test_docs_tables_are_the_benchmarks():
    b = bench()
    text = measured()
    run = {"trace": [(0.5, 1.0, 1, 8.0)], "final": 0.5, "diverged": 0.0}
    runs = {(alg, net): [run] for alg in b.METHODS for net in b.NETWORKS}
    straggler = b.straggler_table(runs, 0.5, "ring", sweeps_in_doc(text))
    assert straggler.splitlines()[0] in text  # the same columns
    targets = text.count("| method | graph | network |")
    assert targets >= 1
    for alg in b.METHODS:
        for net in b.NETWORKS:  # one row per (method, network) and target
            assert text.count(f"| {alg} | ring | {net} | ") == targets, (alg, net)
    row = dict.fromkeys(("setup", "rate", "last_us", "rss", "consensus", "virtual", "events"), 1.0)
    pairwise = b.pairwise_table({("ring", 1, "engine"): row}, 10_000, 10)
    assert pairwise.splitlines()[0] in text
    for graph in ("ring", "geometric:r=0.03"):
        for d in (1, 100):
            for impl in b.IMPLEMENTATIONS:
                assert text.count(f"| {graph} (n = 10000) | {d} | {impl} | ") == 1, (graph, d, impl)


def test_benchmark_runs_end_to_end(tmp_path):
    b = bench()
    page = tmp_path / "page.md"
    page.write_text(f"before\n{b.BEGIN}\nold\n{b.END}\nafter\n")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        out = b.main([*TINY, "--write", str(page)])
    assert page.read_text() == f"before\n{b.BEGIN}\n{out}\n{b.END}\nafter\n"
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
             if line.startswith("| ") and not line.startswith(("| method", "| graph"))]
    straggler = [c for c in cells if c[0] in b.METHODS]
    assert len(straggler) == len(b.METHODS) * len(b.NETWORKS)
    assert all(c[3] == "1/1" and c[-1] == "0/1" for c in straggler)  # every run got to 0.5
    dpsgd = [c for c in straggler if c[0] == "dpsgd"]
    assert [c[7] for c in dpsgd] == ["1.00", "1.00"]  # the speedups' reference
    assert float(dpsgd[1][4]) > float(dpsgd[0][4])  # a synchronous round waits for the straggler
    pairwise = [c for c in cells if c[0] == "ring (n = 200)"]
    assert [c[2] for c in pairwise] == list(b.IMPLEMENTATIONS)
    for c in pairwise:
        assert 0 < float(c[8]) < 1 and math.isclose(float(c[9]), 2, rel_tol=0.5)  # 2 sweeps ≈ 2 s


def test_mpi_table_compares_wall_with_virtual_time():
    """The --mpi table (no launch here): wall time to target over virtual time × SCALE, and
    the page has its markers."""
    b = bench()
    virtual = {"trace": [(1.0, 0.0, 0, 0.0), (0.4, 10.0, 9, 8.0)], "steps": [0, 72],
               "final": 0.3, "diverged": 0.0}
    wall = {"trace": [(1.0, 0.0, 0, 0.0), (0.6, 0.25, 5, 8.0), (0.45, 0.3, 6, 8.0)],
            "steps": [0, 40, 50], "final": 0.35, "diverged": 0.0}
    rounds = {"trace": [(1.0, 0.0, 0, 0.0), (0.5, 20.0, 4, 8.0)], "steps": [0, 32],
              "final": 0.2, "diverged": 0.0}
    paced = {"trace": [(1.0, 0.0, 0, 0.0), (0.5, 0.6, 4, 8.0)], "steps": [0, 32],
             "final": 0.2, "diverged": 0.0}
    table = b.mpi_table({("dpsgd", b.NETWORKS[1]): ([rounds], [paced]),
                         ("ad-psgd", b.NETWORKS[1]): ([virtual], [wall])}, 0.5, 0.02)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]
    assert rows[0] == ["dpsgd", b.NETWORKS[1], "1/1 of 1", "20", "0.4", "0.6", "1.50",
                       "1.00 / 1.00", "32 / 32", "0.2 / 0.2"]
    assert rows[1] == ["ad-psgd", b.NETWORKS[1], "1/1 of 1", "10", "0.2", "0.3", "1.50",
                       "2.00 / 2.00", "72 / 50", "0.3 / 0.35"]
    alone = b.mpi_table({("ad-psgd", b.NETWORKS[1]): ([virtual], [wall])}, 0.5, 0.02)
    assert "| — / — |" in alone  # no D-PSGD run: no speedup
    begin, end = b.markers(b.MPI_SECTION)
    text = DOC.read_text()
    assert text.index(begin) < text.index(end)


def test_digits_runs_take_train_py_flags_and_fill_the_mpi_table():
    """--mpi --digits (no launch here): its train.py flags parse (SGD for the optimizer
    methods, the plain gradient for async-SGP), its table is part 3's with the test error,
    and the page has its markers with one row per method in each table."""
    b = bench()
    train = script("train")
    for name in b.METHODS:
        args = train.parse_args([*b.digits_flags(name, b.NETWORKS[1], 0, 2.0, 8, 0.2, "ring"),
                                 "--nodes", "8"])
        assert (args.algorithm, args.network, args.log_every, args.lr) == (
            name, b.NETWORKS[1], 1, 0.2)
        assert args.optimizer == (None if name == "async-sgp" else "sgd")
    run = {"trace": [(0.9, 0.0, 0, 0.0), (0.15, 4.0, 6, 8.0)], "steps": [0, 48],
           "final": 0.1, "diverged": 0.0}
    table = b.mpi_table({("ad-psgd", b.NETWORKS[1]): ([run], [run])}, 0.2, 0.1, "test error")
    assert "| test error at the end (virtual / mpiexec) |" in table.splitlines()[0]
    assert table.splitlines()[2].endswith("| 4 | 0.4 | 4 | 10.00 | — / — | 48 / 48 | 0.1 / 0.1 |")
    begin, end = b.markers(b.DIGITS_SECTION)
    text = DOC.read_text()
    assert text.index(begin) < text.index(end)
    section = text.split(begin, 1)[1].split(end, 1)[0]
    tables = section.count("| method | network |")
    for name in b.METHODS:
        assert section.count(f"| {name} | {b.NETWORKS[1]} | ") == tables, name
