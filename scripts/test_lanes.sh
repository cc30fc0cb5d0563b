#!/usr/bin/env bash
# `make test`: the suite in two pytest processes side by side ("lanes"), so that one lane's
# waits (stacks starting, heartbeats expiring, faults taking effect) overlap the other's
# compute. Serially the suite took 20-24 minutes of pytest on 2 cores; most of the end-to-end
# time is waiting, so two lanes finish in about the time of the longer one.
#
#   scripts/test_lanes.sh PYTHON "PYTEST FLAGS" "LANE 1 PATHS" "LANE 2 PATHS"
#
# Lane 1 prints as it runs; lane 2 writes to a log printed once lane 1 is done (two streams of
# dots in one terminal would be unreadable). Each lane is a whole pytest session with its own
# fixtures and summary; the exit status is the first failing lane's ("no tests collected" is
# not a failure). PDSERVE_TEST_LANES=1 runs both lanes' paths in one process instead, as does an
# empty lane (`make test-unit` and `make test-e2e` pass one).
set -uo pipefail

python=$1 flags=$2 lane_1=$3 lane_2=$4

run_lane() {  # paths...; pytest's status, 5 ("no tests collected") counted as passed
    local rc=0
    # shellcheck disable=SC2086  # flags and paths are word lists
    "$python" -m pytest $flags "$@" || rc=$?
    if [[ $rc -eq 5 ]]; then echo "pytest: no tests collected in $*"; rc=0; fi
    return "$rc"
}

if [[ "${PDSERVE_TEST_LANES:-2}" == "1" || -z "$lane_1" || -z "$lane_2" ]]; then
    # shellcheck disable=SC2086
    run_lane $lane_1 $lane_2
    exit $?
fi

lane_2_log=$(mktemp -t pdserve-test-lane-2.XXXXXX)
trap 'rm -f "$lane_2_log"' EXIT
started=$SECONDS
# shellcheck disable=SC2086
run_lane $lane_2 >"$lane_2_log" 2>&1 &
lane_2_pid=$!

echo "== lane 1: $lane_1"
# shellcheck disable=SC2086
run_lane $lane_1
rc_1=$?
echo "== lane 1 done after $((SECONDS - started)) s (exit $rc_1); waiting for lane 2"
wait "$lane_2_pid"
rc_2=$?
echo "== lane 2: $lane_2 (done after $((SECONDS - started)) s, exit $rc_2)"
cat "$lane_2_log"
echo "== make test: lane 1 exit $rc_1, lane 2 exit $rc_2, $((SECONDS - started)) s in all"
if [[ $rc_1 -ne 0 ]]; then exit "$rc_1"; fi
exit "$rc_2"
