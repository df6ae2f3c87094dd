"""Start-up cost: every script's ``--help`` answers without importing torch (or networkx, scipy,
matplotlib, scikit-learn), ``import gossip`` loads none of those but torch, and the help texts,
which read gossip.catalog before the registries are imported, say what the registries say."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gossip import catalog
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


def test_catalog_copies_the_builtin_algorithms_traits():
    from gossip.algorithms import REGISTRY

    builtin = [n for n, cls in REGISTRY.items() if cls.__module__.startswith("gossip.algorithms.")]
    assert builtin == list(catalog.ALGORITHMS), "add or remove the algorithm in gossip/catalog.py"
    for name in builtin:
        assert catalog.traits_of(REGISTRY[name]) == catalog.ALGORITHMS[name], (
            f"gossip/catalog.py ALGORITHMS[{name!r}] should be {catalog.traits_of(REGISTRY[name])}")


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
