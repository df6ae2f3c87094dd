"""The memory estimate's per-algorithm counts (``state_copies``, ``neighbor_copies``) bound what
each built-in algorithm really allocates, and a run's peak RSS stays below the estimate
consensus.py refuses runs by."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
import torch

import topologies
from gossip.algorithms import REGISTRY, make_algorithm
from gossip.engine import Engine
from gossip.problems import make_problem
from tests.helpers.launch import ROOT

BUILT_IN = sorted(n for n, c in REGISTRY.items() if c.__module__.startswith("gossip."))
M, D = 8, 4096


def tensor_bytes(root, skip: set[int]) -> int:
    """Bytes of the distinct tensor storages reachable from ``root`` (skipping ``skip`` ids)."""
    seen, storages, stack = set(skip), {}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif not isinstance(obj, (str, bytes, int, float, bool, type(None), type)):
            stack.extend(getattr(obj, "__dict__", {}).values())
            stack.extend(getattr(obj, s) for s in getattr(type(obj), "__slots__", ())
                         if hasattr(obj, s))
            cells = getattr(obj, "__closure__", None) or ()
            stack.extend(c.cell_contents for c in cells)
    return sum(storages.values())


@pytest.mark.parametrize("name", BUILT_IN)
def test_declared_copies_bound_the_allocated_state(name):
    cls = REGISTRY[name]
    req = cls.requires
    graph = "complete" if req.graph.complete else "directed-exponential" if name == "push-sum" \
        else "star" if req.graph.star else "ring"
    topo = topologies.build(graph, M, **({"weights": "push"} if name == "push-sum" else {}))
    comp = {"identity": "none", "bounded-variance": "lead:2"}.get(req.compressor, "topk:0.1")
    kw, hp, problem = {}, {}, None
    if cls.trains:
        kind = "lasso" if name.startswith("prox-lead") else "least-squares"
        problem = make_problem(kind, n_nodes=M, dim=D, samples_per_node=4, seed=0,
                               dtype=torch.float64)
        kw = {"oracles": lambda i, g: problem.oracle(i, g, "full", 1)}
        hp = cls.suggest_hparams(problem, "full", topo)
    if name == "lodadac":
        hp["start"] = "zero"  # its paper start needs equal models; these start apart
    engine = Engine(make_algorithm(name, **hp), topo, lambda i: torch.randn(D, dtype=torch.float64),
                    compressor=comp, dtype=torch.float64, **kw)
    engine.run(3, log_every=1)
    skip = set() if problem is None else {id(problem), *map(id, vars(problem).values())}
    copies = tensor_bytes(engine, skip) / (M * D * 8)
    degree = max(len(topo.view(i).in_neighbors) for i in range(M))
    declared = cls.state_copies + cls.neighbor_copies * degree
    assert copies <= declared, f"{name} keeps {copies:.2f} vectors per node, declares {declared}"


@pytest.mark.parametrize("nodes,dim", [(32, 200_000), (20_000, 16)])
def test_peak_rss_is_bounded_by_the_estimate_within_a_factor(nodes, dim):
    """Peak RSS of a consensus run (CHOCO, float32: its copies and sums in float64) minus a
    tiny run's lies between half the estimate consensus.py refuses runs by and the estimate
    itself: the model's vectors at large d, the engine's own bytes per node at many nodes."""
    from gossip.cli.checks import run_footprint

    grown = _peak_rss(nodes, dim) - _peak_rss(4, 10)
    est = run_footprint(nodes=nodes, numel=dim, itemsize=4, algorithms=[REGISTRY["choco"]],
                        compressors=["topk:0.1"], degree=2).total
    assert est / 2 <= grown <= est, json.dumps({"estimate": est, "measured": grown})


@functools.cache
def _peak_rss(nodes: int, dim: int) -> int:
    """Peak RSS (bytes) of a fresh interpreter running consensus.py on these flags (CHOCO,
    top-10 %, float32, 3 rounds); the tiny baseline run is launched once for every case."""
    argv = ["consensus.py", "--nodes", str(nodes), "--dim", str(dim), "--rounds", "3",
            "--compressor", "topk:0.1", "--gamma", "0.1", "--dtype", "float32"]
    # VmHWM is this memory map's peak; ru_maxrss is not: exec keeps the peak of the map it
    # replaces (the forking pytest worker's), so it reads the worker's size, not the run's
    code = (f"import runpy, sys; sys.argv = {argv!r}; sys.path.insert(0, {str(ROOT)!r})\n"
            "try:\n    runpy.run_path('experiments/consensus.py', run_name='__main__')\n"
            "except SystemExit as exc:\n"
            "    if exc.code not in (0, None):\n        raise\n"
            "print(next(int(line.split()[1]) * 1024 for line in open('/proc/self/status')\n"
            "           if line.startswith('VmHWM:')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split()[-1])
