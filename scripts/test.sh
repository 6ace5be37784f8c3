#!/usr/bin/env bash
# Install everything, then run the test suite (the same command CI runs).
#   scripts/test.sh [--fast] [pytest arguments...]
# --fast runs the fast tier (tests/_tiers.py: under 3 minutes on 2 cores, for use before each
# commit): it sets STOKER_FAST=1, which the root conftest turns into the tier's selection and
# the fuzzer's smaller budget. Every other argument goes to pytest as it is.
#
# The tests run in STOKER_TEST_PROCS pytest processes (pytest-xdist; default 3), a file's tests
# together in one of them (--dist loadfile: a module's servers and process groups are set up
# once). Most of a test's time is spent waiting on the processes it starts: one pytest process
# left a 2-core machine half idle (load ~0.9 over a quiet run), and two still left ~15 % of it
# (CPU 24 min in a 14:12 run); three ran the suite in 12:00 against two's 13:55 (2026-12-02,
# quiet, the same checkout). STOKER_TEST_PROCS=0, or an -n/-p no:xdist argument of your own,
# runs them in one process. STOKER_TEST_SKIP_SETUP=1 runs them with the .venv as it is
# (scripts/stress.sh, with a venv of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
own_procs=0
for arg in "$@"; do
    if [ "$arg" = "--fast" ]; then
        export STOKER_FAST=1
    else
        case "$arg" in
            -n*|--numprocesses*|no:xdist) own_procs=1 ;;
        esac
        args+=("$arg")
    fi
done
procs=${STOKER_TEST_PROCS:-3}
if [ "$own_procs" = 0 ] && [ "$procs" != 0 ]; then
    args=(-n "$procs" --dist loadfile ${args[@]+"${args[@]}"})
fi
# Bytecode is cached while the tests run, whatever the shell says: with PYTHONDONTWRITEBYTECODE
# set (this project's machines set it) every pytest process rewrote and compiled every test
# module again (collection 10.4 s -> 5.2 s each with the cache), and every worker, rank and CLI
# process the tests start compiled the stoker modules it imports. compileall writes them once,
# on both cores, before the processes start. (__pycache__ is in .gitignore.)
compile_first() {
    unset PYTHONDONTWRITEBYTECODE
    .venv/bin/python -m compileall -q -j 0 src tests >/dev/null 2>&1 || true
}
if [ -n "${STOKER_TEST_SKIP_SETUP:-}" ]; then
    compile_first
    exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
fi
# The doctor's HTML report is checked in a real browser (tests/integration/
# test_doctor_report_browser.py): Debian's chromium, installed where this runs as root with
# apt-get (CI does); elsewhere that test is skipped and says why. It installs while setup.sh
# makes the .venv (the one waits on the network and dpkg, the other mostly on the CPU).
browser=""
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends chromium) >/dev/null &
    browser=$!
fi
scripts/setup.sh
if [ -n "$browser" ] && ! wait "$browser"; then
    echo "scripts/test.sh: could not install chromium; the browser test will be skipped" >&2
fi
compile_first
exec .venv/bin/python -m pytest ${args[@]+"${args[@]}"}
