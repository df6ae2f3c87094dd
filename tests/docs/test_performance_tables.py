"""docs/performance.md's measured tables are what benchmarks/bench_engine.py and
benchmarks/bench_startup.py write there (``make bench``), and both benchmarks run end to end
(tiny settings: the real ones take minutes)."""

from __future__ import annotations

import contextlib
import io
import shutil

import pytest

from tests.helpers.launch import ROOT, script

# the benchmarks run under mpiexec/torchrun launch; the others read tables or run single processes
LAUNCHES_MARKED_PER_TEST = True  # (tests/conftest.py)

DOC = ROOT / "docs" / "performance.md"


def section(name: str) -> str:
    """What lies between the markers of ``name`` in the page."""
    begin, end = script("docpage", "benchmarks").markers(name)
    text = DOC.read_text()
    assert begin in text and end in text, f"docs/performance.md lost its {name} markers"
    return text.split(begin, 1)[1].split(end, 1)[0]


def test_the_engine_tables_are_the_benchmarks():
    text = section("bench_engine")
    for header in script("bench_engine", "benchmarks").HEADERS.values():
        assert header in text
    for spec in script("bench_engine", "benchmarks").SPECS:
        for ranks in (2, 4):
            assert f"| gossip {spec}, d=1000000, {ranks} ranks |" in text
    assert "| CHOCO top-1%, ring 25, d=2000 |" in text
    assert "| CHOCO top-1%, ring 1000, d=10000 |" in text


def test_the_startup_table_is_the_benchmarks():
    text = section("bench_startup")
    assert script("bench_startup", "benchmarks").HEADER in text
    for path in sorted((ROOT / "experiments").glob("*.py")):
        assert f"| experiments/{path.name} --help |" in text


@pytest.mark.launches
@pytest.mark.slow
def test_the_engine_benchmark_writes_its_page(tmp_path):
    """A tiny run of every part, the MPI one under mpiexec with every compressor of the
    table, written between the markers of a copy of the page."""
    page = tmp_path / "performance.md"
    shutil.copy(DOC, page)
    bench = script("bench_engine", "benchmarks")
    argv = ["--ranks", "2", "--dims", "40000", "--rounds", "4", "--no-large", "--write", str(page)]
    with contextlib.redirect_stdout(io.StringIO()):
        bench.main(argv)
    text = page.read_text()
    for spec in bench.SPECS:
        assert f"| gossip {spec}, d=40000, 2 ranks |" in text
    assert "| CHOCO top-1%, ring 25, d=2000 |" in text
    assert text.count("<!-- bench_engine: begin -->") == 1


def test_the_wrap_loop_table_is_the_benchmarks():
    text = section("bench_wrap_loop")
    bench = script("bench_wrap_loop", "benchmarks")
    for launcher, ranks, graph, burners, params in bench.CONFIGS:
        size = f"{params:,}" if params else "4,810"
        assert (f"| {launcher} | {graph} | {ranks} | {burners} CPU-bound | " in text
                and f"| {size[:2]}" in text), (launcher, ranks, graph, burners, params)


@pytest.mark.launches
@pytest.mark.slow
def test_the_wrap_loop_benchmark_writes_its_page(tmp_path):
    """One tiny quiet row per launcher (4 ranks on a ring, wrap checked equal to the bare
    loop before timing), written between the markers of a copy of the page."""
    page = tmp_path / "performance.md"
    shutil.copy(DOC, page)
    bench = script("bench_wrap_loop", "benchmarks")
    with contextlib.redirect_stdout(io.StringIO()):
        bench.main(["--quick", "--graphs", "ring", "--steps", "5", "--repeats", "1", "--check", "3",
                    "--write", str(page)])
    text = page.read_text()
    for launcher in ("torchrun", "mpiexec"):
        assert f"| {launcher} | ring | 4 | 0 CPU-bound | 4,810 |" in text
    assert text.count("<!-- bench_wrap_loop: begin -->") == 1


def test_the_scale_table_is_the_benchmarks():
    text = section("bench_scale")
    bench = script("bench_scale", "benchmarks")
    assert bench.HEADER in text
    for method in bench.METHODS.values():
        for n, d in bench.ROWS:
            assert f"| {method[3]} | {n:,} | {d} |" in text, (method[3], n, d)


@pytest.mark.slow
def test_the_scale_benchmark_writes_its_page(tmp_path):
    """One tiny row per method (each in its own interpreter), written between the markers of
    a copy of the page, with its times apart."""
    page = tmp_path / "performance.md"
    shutil.copy(DOC, page)
    bench = script("bench_scale", "benchmarks")
    with contextlib.redirect_stdout(io.StringIO()):
        bench.main(["--rows", "10000x10", "--rounds", "3", "--write", str(page)])
    text = page.read_text()
    assert text.count("<!-- bench_scale: begin -->") == 1
    for method in bench.METHODS.values():
        row = next(line for line in text.splitlines() if line.startswith(f"| {method[3]} | 10,000 | 10 |"))
        cells = row.strip("|").split("|")
        assert float(cells[4]) > 0 and float(cells[5]) > 0 and float(cells[6]) > 0, row
        assert cells[7].strip() == "1.00"
