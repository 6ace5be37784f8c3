#!/usr/bin/env bash
# Build the docs site into docs/_build/html; any warning fails the build (as in CI: tests/docs).
# Needs the docs extra (scripts/setup.sh installs it). Extra arguments go to sphinx-build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/sphinx-build ]; then
  scripts/setup.sh
fi
exec .venv/bin/sphinx-build -W --keep-going -b html "$@" docs docs/_build/html
