#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): CUDA == CPU bytes for every compressor, block-engine
# round times. Flags go to the script (--help lists them), e.g. --device cpu --quick.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
OMP_NUM_THREADS=1 PYTHONPATH="$root" exec "$python" "$root/benchmarks/gpu_check.py" "$@"
