#!/usr/bin/env bash
# Install everything, then run `stoker demo`: torch's DataLoader vs stoker's on a JPEG workload.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/stoker demo "$@"
