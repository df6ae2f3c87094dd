#!/usr/bin/env bash
# GPU check of issue 11: CUDA == CPU bytes for every compressor, then block-engine round times
# (n=1024, d=1e5 on the GPU beside n=64 on the CPU). < 5 minutes on one GPU.
# Exits non-zero when a compressor's bytes that must be equal differ (see benchmarks/gpu_check.py).
#
#   benchmarks/gpu.sh                      # on a machine with CUDA
#   benchmarks/gpu.sh --device cpu --quick # the same checks on the CPU, in seconds
#   PYTHON=/path/to/python benchmarks/gpu.sh --nodes 512
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
