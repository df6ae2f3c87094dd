"""Start-up cost: every script's ``--help`` answers without importing torch (or networkx, scipy,
matplotlib, scikit-learn), ``import gossip`` loads none of those but torch, and the help texts,
which read gossip.catalog before the registries are imported, say what the registries say."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from gossip import catalog
from gossip.errors import ContractError
from tests.helpers.launch import ROOT

SCRIPTS = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
HEAVY = ("torch", "networkx", "scipy", "matplotlib", "sklearn")
HELP_SECONDS = 5.0
"""Generous on purpose (CI machines vary): --help takes about 0.1 s, torch's import alone 1-3 s."""


def python(args: list[str], timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """Run this interpreter from the repository root; the result and its wall time."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), COLUMNS="100")
    start = time.perf_counter()
    res = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout)
    return res, time.perf_counter() - start


def imported(importtime_stderr: str) -> set[str]:
    """Top-level packages named in ``python -X importtime`` output."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name.split(".")[0])
    return names


def test_there_are_scripts():
    assert {"compare.py", "consensus.py", "optimize.py", "train.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_is_quick_and_imports_no_heavy_package(name):
    res, seconds = python([f"experiments/{name}", "--help"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: {name}") and "--help" in res.stdout
    assert seconds < HELP_SECONDS, f"{name} --help took {seconds:.2f} s"
    res, _ = python(["-X", "importtime", f"experiments/{name}", "--help"])
    assert res.returncode == 0, res.stderr
    loaded = imported(res.stderr) & set(HEAVY)
    assert not loaded, f"{name} --help imported {sorted(loaded)}"


HELP_AFTER_IMPORTS = """
import runpy, sys
import gossip.algorithms, gossip.compress, gossip.problems  # the live registries
sys.argv = [sys.argv[1], "--help"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s != "compare.py"])
def test_help_reads_the_same_before_and_after_the_registries_load(name):
    """The static lists of gossip.catalog give the same text as the live registries."""
    static, _ = python([f"experiments/{name}", "--help"])
    live, _ = python(["-c", HELP_AFTER_IMPORTS, f"experiments/{name}"])
    assert static.returncode == 0 and live.returncode == 0, static.stderr + live.stderr
    assert static.stdout == live.stdout


def test_catalog_reads_the_builtin_algorithms_traits_from_their_source():
    """What the catalog reads from gossip/algorithms' source without importing it (the
    per-process reading and the file cache between processes) is what the classes declare."""
    from gossip.algorithms import REGISTRY

    builtin = [n for n, cls in REGISTRY.items() if cls.__module__.startswith("gossip.algorithms.")]
    read = catalog.read_algorithms()
    assert list(read) == builtin and list(catalog.builtin_algorithms()) == builtin
    for name in builtin:
        assert read[name] == catalog.traits_of(REGISTRY[name]) == catalog.builtin_algorithms()[name], (
            f"gossip/catalog.py reads {read[name]} from the source of {REGISTRY[name].__qualname__}")


def test_catalog_caches_the_reading_while_the_sources_are_unchanged(tmp_path, monkeypatch):
    import json
    import shutil

    root = tmp_path / "algorithms"
    shutil.copytree(catalog._ALGORITHMS_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(catalog, "_ALGORITHMS_DIR", root)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    read = catalog.builtin_algorithms.__wrapped__  # the function without its per-process cache
    first = read()
    cache = root / "__pycache__" / "catalog.json"
    saved = json.loads(cache.read_text())
    saved["traits"][0][1]["state_copies"] = 1000
    cache.write_text(json.dumps(saved))
    assert read()[saved["traits"][0][0]].state_copies == 1000  # the file is what is read
    with open(root / "choco.py", "a") as file:
        file.write("\n# an edit\n")
    assert read() == first  # an edited source: read again


def test_catalog_source_reading_follows_the_class_bodies(tmp_path):
    """Inheritance (two bases: Python's MRO), ``replace(Parent.requires, ...)``, ``Other.attr``,
    annotated defaults, docstrings that look like assignments, and a function of the module
    that does not belong to any class."""
    (tmp_path / "builtin.py").write_text(textwrap.dedent('''
        from gossip.algorithms.a import A, B, AB

        BUILTIN: tuple[type, ...] = (A, B, AB)
        for _cls in BUILTIN:
            ALGORITHMS.register(_cls.name, _cls)
    '''))
    (tmp_path / "a.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass, field, replace

        @dataclass(frozen=True)
        class Graph:
            complete: bool = False

        @dataclass(frozen=True)
        class Requirements:
            graph: Graph = field(default_factory=Graph)
            gradients: bool = False
            compressor: str = "any"

        class Algorithm:
            """Doc.

            state_copies = 99
            """
            requires: ClassVar[Requirements] = Requirements()
            trains: ClassVar[bool] = False
            takes_optimizer = False
            tunable: tuple[str, ...] = ()
            state_copies = 4
            neighbor_copies = 0
            asynchronous = False

            def method(self):
                state_copies = 1
                return state_copies

        def helper():
            trains = True
            return trains

        class A(Algorithm):
            name = "a"
            trains = True
            state_copies = 7
            requires = Requirements(
                gradients=True,
                compressor="stateless",
            )

        class B(Algorithm):
            __doc__ = """B: a doc string assigned,
        spanning lines."""
            name = "b"
            tunable = ("gamma",)
            requires = Requirements(graph=Graph(complete=True))

        class AB(A, B):
            name = "ab"
            requires = replace(A.requires, compressor="identity")
            neighbor_copies = B.state_copies

        class Odd(Algorithm):
            state_copies = 2 * Algorithm.state_copies
    '''))
    def traits(**given):
        return catalog.Traits(**{**dict(gradients=False, trains=False, takes_optimizer=False, compressor="any",
                                        complete=False, tunable=(), state_copies=4, neighbor_copies=0,
                                        asynchronous=False), **given})

    reader = catalog._SourceReader(tmp_path)
    assert reader.mro("AB") == ["AB", "A", "B", "Algorithm"]
    assert reader.traits("A") == traits(gradients=True, trains=True, compressor="stateless", state_copies=7)
    assert reader.traits("B") == traits(complete=True, tunable=("gamma",))
    assert reader.traits("AB") == traits(gradients=True, trains=True, compressor="identity",
                                         tunable=("gamma",), state_copies=7, neighbor_copies=4)
    with pytest.raises(ContractError, match=r"Odd: gossip.catalog cannot read '2 \* Algorithm.state_copies'"):
        reader.traits("Odd")
    assert catalog._registered(tmp_path / "builtin.py") == ["A", "B", "AB"]


def test_catalog_names_are_the_registered_ones():
    import gossip.compress as compress
    from gossip.problems import ESTIMATORS, PROBLEMS
    from gossip.training import MODELS, OPTIMIZERS, SCHEDULES

    assert list(compress.COMPRESSORS)[:len(catalog.COMPRESSOR_SPECS)] == list(catalog.COMPRESSOR_SPECS)
    assert PROBLEMS[:len(catalog.PROBLEMS)] == list(catalog.PROBLEMS)
    assert (ESTIMATORS, MODELS, OPTIMIZERS, SCHEDULES) == (
        catalog.ESTIMATORS, catalog.MODELS, catalog.OPTIMIZERS, catalog.SCHEDULES)


IMPORT_GOSSIP = """
import sys, time
import torch
start = time.perf_counter()
import gossip
for name in gossip.__all__:  # the whole public API: engine, algorithms, compressors, training
    getattr(gossip, name)
print(time.perf_counter() - start)
print(" ".join(sorted(m for m in sys.modules if "." not in m)))
"""


def test_import_gossip_loads_no_graph_plot_or_ml_package():
    res, _ = python(["-c", IMPORT_GOSSIP])
    assert res.returncode == 0, res.stderr
    seconds, modules = res.stdout.splitlines()
    loaded = set(modules.split()) & {"networkx", "scipy", "matplotlib", "sklearn"}
    assert not loaded, f"import gossip (and its public names) imported {sorted(loaded)}"
    assert float(seconds) < HELP_SECONDS  # about 0.05 s beyond torch's own import


def test_catalog_and_parsers_import_no_torch():
    res, _ = python(["-c", "import sys, gossip.catalog, gossip.cli, gossip.config, topologies.spec; "
                           "print(' '.join(m for m in sys.modules if '.' not in m))"])
    assert res.returncode == 0, res.stderr
    assert not set(res.stdout.split()) & {*HEAVY, "numpy"}
