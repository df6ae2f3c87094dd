"""The documentation users get: a page per registered algorithm, runnable extension guide, no
pointers to files a user's clone does not have."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gossip.algorithms import REGISTRY
from tests.helpers.launch import ROOT

DOCS = ROOT / "docs"
BUILT_IN = sorted(name for name, cls in REGISTRY.items() if cls.__module__.startswith("gossip."))
"""The package's own algorithms (a user's, registered by another test module, have no page here)."""
SECTIONS = ("## What it computes", "## Messages", "## State per node", "## Hyper-parameters",
            "## Graphs", "## Reference")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_registered_algorithm_has_its_page(name):
    page = DOCS / "algorithms" / f"{name}.md"
    assert page.exists(), f"docs/algorithms/{name}.md is missing: describe {name}'s update there"
    text = page.read_text()
    missing = [s for s in SECTIONS if s not in text]
    assert not missing, f"{page.name} lacks {missing}"
    assert f"`{name}`" in (DOCS / "algorithms" / "README.md").read_text(), "add it to the index"


def test_extension_guide_runs_as_written():
    """Every python block of docs/extending.md, in order, in a fresh interpreter."""
    text = (DOCS / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    code = "\n\n".join(blocks)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                                           "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-3000:]


def test_relative_links_resolve():
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_code_points_into_docs_not_into_design_notes():
    """Comments and messages cite docs/ (shipped), never the maintainers' design notes (by name
    or by a bare ``§`` section number)."""
    hits = []
    paths = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "experiments").rglob("*.toml")]
    for folder in ("gossip", "topologies", "experiments", "tests", "benchmarks", "examples"):
        paths += (ROOT / folder).rglob("*.py")
    for path in paths:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"ALGORITHMS(-2)?\.md|DESIGN\.md|§\s*\d", line) and path.name != "test_docs.py":
                hits.append(f"{path.relative_to(ROOT)}:{no}")
    assert not hits, "cite docs/ instead: " + ", ".join(hits[:20])


@pytest.mark.parametrize("name", BUILT_IN)
def test_algorithm_classes_document_their_update_and_args(name):
    import inspect

    cls = REGISTRY[name]
    assert vars(cls).get("__doc__"), f"{cls.__name__} needs its own docstring (update rule and Args)"
    doc = inspect.getdoc(cls)
    params = set(inspect.signature(cls.__init__).parameters) - {"self"}
    if params:
        assert "Args:" in doc, f"{cls.__name__}'s docstring should list its Args ({sorted(params)})"
        missing = [p for p in params if p not in doc]
        assert not missing, f"{cls.__name__}'s docstring does not mention {missing}"


def test_readme_reads_a_log_with_pandas(tmp_path, monkeypatch, capsys):
    """The README's pandas lines run on a real log (pandas is a dependency) and print the
    relative error the table shows."""
    from tests.helpers.launch import run_py

    log = tmp_path / "results" / "c.jsonl"
    res = run_py(["experiments/consensus.py", "--nodes", "6", "--dim", "30", "--rounds", "20",
                  "--compressor", "none", "topk:0.1", "--gamma", "1", "0.2", "--out", str(log)])
    assert res.returncode == 0, res.stderr
    text = (ROOT / "README.md").read_text()
    snippet = text.split("pandas comes with the\nproject and reads the log:\n\n```python\n")[1]
    snippet = snippet.split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(snippet, {})
    printed = capsys.readouterr().out
    table = {r.split("|")[1].strip(): float(r.split("|")[2]) for r in res.stdout.splitlines()
             if r.startswith("| choco")}
    for label, rel in table.items():
        line = next(ln for ln in printed.splitlines() if ln.startswith(label))
        assert abs(float(line.split()[-1]) - rel) <= 5e-3 * rel + 1e-300, (line, rel)  # the table has 3 digits
