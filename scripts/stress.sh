#!/usr/bin/env bash
# The suite under load, outside CI: N runs of a fresh clone's suite, each beside busy processes.
#
#   scripts/stress.sh N [pytest arguments...]
#
# Clones this repository's HEAD (committed work only) into a temporary directory, then runs
# the suite there N times, each beside STOKER_STRESS_BUSY processes spinning on a core
# (`python3 -c "while True: pass"`; default: one per core), killed when the run ends (and on
# any exit of this script). pytest arguments are passed through (default: the whole suite, as
# scripts/test.sh runs it). Prints, for each run, its exit status, the load average, pytest's
# final counts line and every failed or erroring test; exits non-zero if any run failed.
#
# Each run is scripts/test.sh in the clone (which installs its .venv first, as CI does). With
# STOKER_STRESS_VENV=/path/to/.venv the clone uses that environment instead (no install; the
# clone's src/ is put first on PYTHONPATH so that its code, not the venv's editable one, runs).
# The clone and the runs' logs are kept in the directory printed at the start.
set -euo pipefail

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/stress.sh N [pytest arguments...]  (N runs, N >= 1)" >&2
    exit 2
fi
runs=$1
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
busy=${STOKER_STRESS_BUSY:-$(nproc)}
work=$(mktemp -d "${TMPDIR:-/tmp}/stoker-stress.XXXXXX")
clone="$work/clone"
pids=()

stop_busy() {
    for pid in "${pids[@]+"${pids[@]}"}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    pids=()
}
trap stop_busy EXIT
trap 'stop_busy; exit 130' INT TERM

git clone -q "$repo" "$clone"
echo "stress: $runs run(s) of $(git -C "$clone" rev-parse --short HEAD) beside $busy busy" \
     "process(es); clone and logs in $work"
if [ -n "${STOKER_STRESS_VENV:-}" ]; then
    ln -s "$(cd "$STOKER_STRESS_VENV" && pwd)" "$clone/.venv"
fi

failed_runs=0
summary=()
for i in $(seq 1 "$runs"); do
    log="$work/run-$i.log"
    for _ in $(seq 1 "$busy"); do
        python3 -c "while True: pass" &
        pids+=($!)
    done
    start=$(date +%s)
    set +e
    if [ -n "${STOKER_STRESS_VENV:-}" ]; then  # that venv, the clone's src first
        (cd "$clone" && PYTHONPATH="$clone/src${PYTHONPATH:+:$PYTHONPATH}" \
            STOKER_TEST_SKIP_SETUP=1 scripts/test.sh "$@") >"$log" 2>&1
    else
        (cd "$clone" && scripts/test.sh "$@") >"$log" 2>&1
    fi
    rc=$?
    set -e
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    stop_busy
    took=$(( $(date +%s) - start ))
    counts=$(grep -E '^=+ .* in [0-9.]+s' "$log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')
    [ -n "$counts" ] || counts="(no counts: the run ended early; see $log)"
    [ "$rc" -eq 0 ] || failed_runs=$((failed_runs + 1))
    line="run $i: exit $rc, ${took} s, load $load: $counts"
    summary+=("$line")
    echo "$line"
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /' || true
    if grep -q '^INTERNALERROR>' "$log"; then
        echo "    INTERNALERROR: pytest itself failed; see $log"
    fi
done

echo "stress: $((runs - failed_runs)) of $runs run(s) passed"
for line in "${summary[@]}"; do
    echo "  $line"
done
[ "$failed_runs" -eq 0 ]
