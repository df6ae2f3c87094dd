"""Benchmark output into a docs page: the text between two HTML comment markers is replaced,
so a page's measured tables are always a benchmark's latest output (``--write PAGE``)."""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of section ``name`` (e.g. ``bench_engine``)."""
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def write_between_markers(path: Path, text: str, name: str) -> None:
    """Replace what lies between the markers of ``name`` in ``path`` with ``text``."""
    begin, end = markers(name)
    page = path.read_text()
    if begin not in page or end not in page:
        raise SystemExit(f"{path}: no {begin} ... {end} markers to write between")
    head, rest = page.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}")
