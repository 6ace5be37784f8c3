#!/usr/bin/env bash
# Install everything, then run the test suite (the same command CI runs).
#   scripts/test.sh [--fast] [pytest arguments...]
# --fast runs the fast tier (tests/_tiers.py: under 3 minutes on 2 cores, for use before each
# commit): it sets STOKER_FAST=1, which the root conftest turns into the tier's selection and
# the fuzzer's smaller budget. Every other argument goes to pytest as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
    if [ "$arg" = "--fast" ]; then
        export STOKER_FAST=1
    else
        args+=("$arg")
    fi
done
scripts/setup.sh
# The doctor's HTML report is checked in a real browser (tests/integration/
# test_doctor_report_browser.py): Debian's chromium, installed where this runs as root with
# apt-get (CI does); elsewhere that test is skipped and says why.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends chromium) >/dev/null \
        || echo "scripts/test.sh: could not install chromium; the browser test will be skipped" >&2
fi
exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
