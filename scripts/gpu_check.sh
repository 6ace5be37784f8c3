#!/usr/bin/env bash
# The GPU checks, in one device call of at most 8 minutes (issue 46), on a machine with CUDA
# (its own Python with a CUDA torch and torchvision, no network): install stoker without
# touching that torch, run benchmarks/gpu_feed.py (its parts in their own budgets, 340 s in
# all), then tests/gpu. Everything goes to $OUT (or ./gpu-results): machine.txt, gpu_feed.json
# (the record, rewritten after each part: a part that fails or a run cut short keeps the rest),
# gpu_feed.log, gpu_tests.log. `scripts/gpu_check.sh --dry-run` runs the benchmark's code
# paths on the CPU (the fake device) and skips the tests.
#   device call: bash scripts/gpu_check.sh   (timeout 480 s; BENCH_S and TESTS_S cap the two;
#   carry build/gpu-wheels when it holds the fastimage wheels for the GPU machine's Python)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
  "$py" -c 'import sys,torch;print(sys.version.split()[0],torch.__version__,torch.version.cuda)'
  nproc; date -u +%FT%TZ; git log -1 --format='%h %s' 2>/dev/null; } 2>&1 | tee "$out/machine.txt"
if [[ " $* " != *" --dry-run "* ]]; then
  "$py" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
  # The image path's fastimage extra, offline: wheels carried in build/gpu-wheels (see
  # benchmarks/README.md); one that does not import is removed again.
  if ls build/gpu-wheels/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-deps --no-index build/gpu-wheels/*.whl 2>&1 | tail -3
    "$py" -c 'import cv2' 2>/dev/null || "$py" -m pip uninstall -y -q opencv-python-headless
    "$py" -c 'import simplejpeg' 2>/dev/null || "$py" -m pip uninstall -y -q simplejpeg
  fi
fi
timeout -k 5 "${BENCH_S:-360}" "$py" benchmarks/gpu_feed.py --out "$out" "$@" 2>&1 \
  | tee "$out/gpu_feed.log"
if [[ " $* " != *" --dry-run "* ]]; then
  # tests/gpu, and stoker.vision against torchvision's own objects (skipped where torchvision
  # does not import, as on the CPU machine); --timeout only where pytest-timeout is installed.
  per_test=(); "$py" -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout 60)
  timeout -k 5 "${TESTS_S:-90}" "$py" -m pytest tests/gpu tests/unit/test_vision_torchvision.py \
    -v -p no:cacheprovider -o addopts="" ${per_test[@]+"${per_test[@]}"} 2>&1 \
    | tee "$out/gpu_tests.log"
fi
ls -l "$out"
