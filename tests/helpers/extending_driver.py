"""Runs consensus.py, optimize.py and train.py with the user parts of examples/my_parts.py.

``python tests/helpers/extending_driver.py OUT_DIR`` in process, or under ``mpiexec -n K``; each script
writes OUT_DIR/<script>.jsonl, so the test compares an MPI launch with the in-process run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALG = "examples.my_parts:LocalGossip"
COMP = "examples.my_parts:StochasticInt8"
COMMON = ["--nodes", "4", "--seed", "5"]
RUNS = {
    "consensus": ["--algorithm", ALG, "--compressor", COMP, "--gamma", "0.5", "--dim", "40",
                  "--rounds", "60", "--log-every", "20", "--dtype", "float64"],
    "optimize": ["--algorithm", ALG, "--compressor", COMP, "--dim", "20", "--samples-per-node",
                 "30", "--iterations", "60", "--log-every", "20"],
    "train": ["--algorithm", ALG, "--compressor", COMP, "--data", "synthetic",
              "--synthetic-samples", "400", "--rounds", "30", "--log-every", "10",
              "--optimizer", "sgd", "--lr", "0.05"],
}


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in RUNS.items():
        script(name).main([*args, *COMMON, "--out", str(out / f"{name}.jsonl")])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
