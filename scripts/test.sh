#!/usr/bin/env bash
# Install everything, then run the test suite (the same command CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
