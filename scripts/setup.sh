#!/usr/bin/env bash
# Create .venv and install stoker with its test, demo, dev, docs and frameworks extras, torch pinned
# to the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test,demo,dev,docs,frameworks]"
