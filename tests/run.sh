#!/usr/bin/env bash
# tests/run.sh [unit|integration|all] [filter] - runs mgpu's tests and ends with one line
# "N passed, N failed" (N skipped when some skip).
#   unit:        every build/tests/test_* binary (each prints "ok - name" / "not ok - name")
#   integration: every function t_* of tests/integration/test_*.sh, each in its own subshell,
#                session and process group, with a deadline, against the real binaries in
#                $MGPU_BUILD/bin
# A test that prints "skip - reason" and exits 77 counts as skipped.
#
# No test can go missing without a failure: before running, the run counts the tests it expects
# (unit binaries list theirs with CHECK_LIST=1; integration files are read for their t_*
# definitions) and says how many; a binary that dies before reporting all of its tests, or a
# file that does not load, fails for each test that did not report, and the run fails when
# passed + failed + skipped differs from what it expected.
#
# A test's deadline (MGPU_TEST_TIMEOUT seconds, default 120) ends everything the test started:
# its process group is killed, then every process that still carries the test's MGPU_TEST_RUN
# marker in its environment (a launcher's workers run in sessions of their own).
#
# MGPU_INTEGRATION_DIR (default tests/integration) is where the test_*.sh files are read from;
# tests/integration/test_harness.sh points it, and MGPU_BUILD, at planted tests.
set -u
here=$(cd "$(dirname "$0")" && pwd)
export MGPU_BUILD=${MGPU_BUILD:-$here/../build}
export MGPU_ROOT=$(cd "$here/.." && pwd)
integration_dir=${MGPU_INTEGRATION_DIR:-$here/integration}
what=${1:-all}
filter=${2:-}
passed=0 failed=0 skipped=0 expected=0
failed_names=()

unit_bins() {
    local bin
    for bin in "$MGPU_BUILD"/tests/test_*; do
        [ -x "$bin" ] || continue
        [ -n "$filter" ] && [[ "$bin" != *"$filter"* ]] && continue
        echo "$bin"
    done
}

# unit_expected BIN: how many tests BIN lists (at least 1: a binary that lists none, or dies
# while listing, is one test that fails).
unit_expected() {
    local n
    n=$(CHECK_LIST=1 timeout 60 "$1" 2>/dev/null | grep -c '^list - ')
    [ "$n" -gt 0 ] && echo "$n" || echo 1
}

run_unit() {
    local bin out rc want got f ok sk
    for bin in $(unit_bins); do
        want=$(unit_expected "$bin")
        out=$(timeout 120 "$bin" 2>&1); rc=$?
        echo "$out" | grep -v '^[0-9]* passed, [0-9]* failed'
        ok=$(echo "$out" | grep -c '^ok - ')
        sk=$(echo "$out" | grep -c '^skip - ')
        f=$(echo "$out" | grep -c '^not ok - ')
        got=$((ok + sk + f))
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            f=1; echo "not ok - $(basename "$bin") (exit $rc)"
        fi
        if [ $((ok + sk + f)) -lt "$want" ]; then
            echo "not ok - $(basename "$bin"): $got of its $want tests reported (exit $rc)"
            f=$((want - ok - sk))
        fi
        passed=$((passed + ok)); skipped=$((skipped + sk)); failed=$((failed + f))
        [ "$f" -gt 0 ] && failed_names+=("$(basename "$bin")")
    done
}

integration_files() {
    local file
    for file in "$integration_dir"/test_*.sh; do
        [ -f "$file" ] && echo "$file"
    done
}

# defined_tests FILE: the t_* functions FILE defines, read from its text (not by running it)
defined_tests() {
    sed -nE 's/^[[:space:]]*(function[[:space:]]+)?(t_[A-Za-z0-9_]+)[[:space:]]*\(\).*/\2/p' "$1"
}

# loaded_tests FILE: the t_* functions bash knows after sourcing lib.sh and FILE
loaded_tests() {
    bash -c "source '$here/integration/lib.sh'; source '$1' >/dev/null 2>&1; declare -F" 2>/dev/null |
        awk '{print $3}' | grep '^t_'
}

# kill_marked MARK: SIGKILL every process whose environment has MGPU_TEST_RUN=MARK, until none
# is left (a dying launcher may fork once more); prints how many were killed.
kill_marked() {
    local n=0 round pids
    for round in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(grep -lsxzF "MGPU_TEST_RUN=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
        [ -z "$pids" ] && break
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null
        n=$((n + $(echo "$pids" | wc -w)))
        sleep 0.1
    done
    echo "$n"
}

run_integration() {
    local file fn rc start log name want have missing mark killed dir
    for file in $(integration_files); do
        want=$(defined_tests "$file" | sort -u)
        have=$(loaded_tests "$file" | sort -u)
        if [ -n "$filter" ]; then
            want=$(for fn in $want; do [[ "$(basename "$file" .sh):$fn" == *"$filter"* ]] && echo "$fn"; done)
            have=$(for fn in $have; do [[ "$(basename "$file" .sh):$fn" == *"$filter"* ]] && echo "$fn"; done)
        fi
        # a test defined in the text that bash does not know: the file does not load
        missing=$(comm -23 <(echo "$want" | sed '/^$/d') <(echo "$have" | sed '/^$/d'))
        if [ -n "$missing" ]; then
            local err; err=$(bash -c "source '$here/integration/lib.sh'; source '$file'" 2>&1 </dev/null | head -n 3)
            for fn in $missing; do
                name="$(basename "$file" .sh):$fn"
                echo "not ok - $name (never ran: $(basename "$file") does not load)"
                failed=$((failed + 1)); failed_names+=("$name")
            done
            [ -n "$err" ] && echo "$err" | sed 's/^/    /'
        fi
        for fn in $have; do
            name="$(basename "$file" .sh):$fn"
            log=$(mktemp)
            dir=$(mktemp -d)
            mark="run.$$.$RANDOM.$fn"
            start=$(date +%s%N)
            # setsid: the test is a session and process group of its own, so timeout's signal
            # reaches all of it and nothing of the caller's; -w waits for it.
            ( cd "$dir" && TEST_TMP=$PWD MGPU_TEST_RUN=$mark exec setsid -w timeout -k 5 \
                ${MGPU_TEST_TIMEOUT:-120} bash -c \
                "set -u; source '$here/integration/lib.sh'; source '$file'; $fn" ) >"$log" 2>&1
            rc=$?
            killed=$(kill_marked "$mark")
            local ms=$(( ($(date +%s%N) - start) / 1000000 )); local secs; secs=$(printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)))
            if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
                echo "not ok - $name (deadline of ${MGPU_TEST_TIMEOUT:-120}s, exit $rc, ${killed} processes it left killed)"
                sed 's/^/    /' "$log" | tail -n 40
                failed=$((failed + 1)); failed_names+=("$name")
            elif [ $rc -eq 0 ]; then
                echo "ok - $name (${secs}s)"; passed=$((passed + 1))
            elif [ $rc -eq 77 ]; then
                echo "skip - $name: $(tail -n 1 "$log")"; skipped=$((skipped + 1))
            else
                echo "not ok - $name (exit $rc, ${secs}s)"; sed 's/^/    /' "$log" | tail -n 40
                failed=$((failed + 1)); failed_names+=("$name")
            fi
            rm -f "$log"
            rm -rf "$dir" 2>/dev/null
        done
    done
}

count_unit() {
    local bin n=0
    for bin in $(unit_bins); do n=$((n + $(unit_expected "$bin"))); done
    echo "$n"
}

count_integration() {
    local file fn n=0
    for file in $(integration_files); do
        for fn in $(defined_tests "$file" | sort -u); do
            [ -n "$filter" ] && [[ "$(basename "$file" .sh):$fn" != *"$filter"* ]] && continue
            n=$((n + 1))
        done
    done
    echo "$n"
}

case "$what" in
    unit) expected=$(count_unit) ;;
    integration) expected=$(count_integration) ;;
    all) expected=$(( $(count_unit) + $(count_integration) )) ;;
    *) echo "usage: tests/run.sh [unit|integration|all] [filter]" >&2; exit 2 ;;
esac
echo "expecting $expected tests"
case "$what" in
    unit) run_unit ;;
    integration) run_integration ;;
    all) run_unit; run_integration ;;
esac
ran=$((passed + failed + skipped))
if [ "$ran" -ne "$expected" ]; then
    echo "not ok - $ran tests reported, $expected expected"
    [ "$ran" -lt "$expected" ] && failed=$((failed + expected - ran)) || failed=$((failed + 1))
    failed_names+=("(count)")
fi
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
