#!/usr/bin/env bash
# Create .venv and install stoker with its test, demo, dev, docs and frameworks extras, torch pinned
# to the CPU build.
#
# The packages are installed with uv (installed into the venv by pip first): on this project's
# 2-core machine pip took 124 s for the same set (1:42 of CPU: resolving, unpacking, compiling),
# uv 65 s from a cold cache (37 s warm), bytecode compiled as pip compiles it (--compile-bytecode: without .pyc files every
# process the tests start would compile torch again where PYTHONDONTWRITEBYTECODE is set). uv
# reads no pip configuration, so pip's find-links (where this machine keeps torch's CPU wheel)
# are handed to it. Where uv cannot be installed or fails, pip installs the same set.
# STOKER_SETUP_PIP=1 skips uv.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
extras=".[test,demo,dev,docs,frameworks]"

pip_setup() {
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -c constraints.txt torch==2.13.0
    .venv/bin/python -m pip install -q -c constraints.txt -e "$extras"
}

uv_setup() {
    .venv/bin/python -m pip install -q uv || return 1
    # pip's find-links (its environment and its config files), those that exist
    local links=() link
    for link in $(.venv/bin/python -m pip config list 2>/dev/null \
                  | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p") ${PIP_FIND_LINKS:-}; do
        case "$link" in
            http://*|https://*) links+=(--find-links "$link") ;;
            *) [ -e "${link#file://}" ] && links+=(--find-links "$link") ;;
        esac
    done
    .venv/bin/uv pip install --python .venv/bin/python --native-tls -q --compile-bytecode \
        -c constraints.txt ${links[@]+"${links[@]}"} --upgrade-package pip \
        pip torch==2.13.0 -e "$extras"
}

if [ -n "${STOKER_SETUP_PIP:-}" ]; then
    pip_setup
elif ! uv_setup; then
    echo "scripts/setup.sh: uv failed; installing with pip" >&2
    pip_setup
fi
