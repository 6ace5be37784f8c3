#!/usr/bin/env bash
# The GPU checks, in one run on a machine with CUDA (its own Python with a CUDA torch and
# torchvision): install stoker without touching that torch, run tests/gpu, then
# benchmarks/gpu_feed.py. Logs go to $OUT (or ./gpu-results) as gpu_tests.log and gpu_feed.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c \
  'import torch,sys;print(sys.version.split()[0],torch.__version__,torch.cuda.get_device_name())'
  nproc; } 2>&1 | tee "$out/machine.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
timeout "${TESTS_S:-240}" python3 -m pytest tests/gpu -v -p no:cacheprovider -o addopts="" \
  --timeout 120 2>&1 | tee "$out/gpu_tests.log"
timeout "${BENCH_S:-240}" python3 benchmarks/gpu_feed.py "$@" 2>&1 | tee "$out/gpu_feed.jsonl"
