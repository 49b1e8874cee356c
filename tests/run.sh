#!/usr/bin/env bash
# tests/run.sh [unit|integration|gpu] [filter] - runs mgpu's tests and ends with one line
# "N passed, N failed" (N skipped when some skip).
#   unit:        every build/tests/test_* binary (each prints "ok - name" / "not ok - name")
#   integration: every function t_* of tests/integration/test_*.sh, each in its own subshell
#                with a deadline, against the real binaries in $MGPU_BUILD/bin
# A test that prints "skip - reason" and exits 77 counts as skipped.
set -u
here=$(cd "$(dirname "$0")" && pwd)
export MGPU_BUILD=${MGPU_BUILD:-$here/../build}
export MGPU_ROOT=$(cd "$here/.." && pwd)
what=${1:-all}
filter=${2:-}
passed=0 failed=0 skipped=0
failed_names=()

run_unit() {
    local bin out rc
    for bin in "$MGPU_BUILD"/tests/test_*; do
        [ -x "$bin" ] || continue
        [ -n "$filter" ] && [[ "$bin" != *"$filter"* ]] && continue
        out=$(timeout 120 "$bin" 2>&1); rc=$?
        echo "$out" | grep -v '^[0-9]* passed, [0-9]* failed'
        passed=$((passed + $(echo "$out" | grep -c '^ok - ')))
        skipped=$((skipped + $(echo "$out" | grep -c '^skip - ')))
        local f; f=$(echo "$out" | grep -c '^not ok - ')
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "not ok - $(basename "$bin") (exit $rc)"; fi
        failed=$((failed + f))
        [ "$f" -gt 0 ] && failed_names+=("$(basename "$bin")")
    done
}

run_integration() {
    local file fn rc start log
    for file in "$here"/integration/test_*.sh; do
        [ -f "$file" ] || continue
        for fn in $(bash -c "source '$here/integration/lib.sh'; source '$file'; declare -F" | awk '{print $3}' | grep '^t_'); do
            local name; name="$(basename "$file" .sh):$fn"
            [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
            log=$(mktemp)
            start=$(date +%s%N)
            ( cd "$(mktemp -d)" && TEST_TMP=$PWD timeout -k 5 ${MGPU_TEST_TIMEOUT:-120} bash -c \
                "set -u; source '$here/integration/lib.sh'; source '$file'; $fn" ) >"$log" 2>&1
            rc=$?
            local ms=$(( ($(date +%s%N) - start) / 1000000 )); local secs; secs=$(printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)))
            if [ $rc -eq 0 ]; then
                echo "ok - $name (${secs}s)"; passed=$((passed + 1))
            elif [ $rc -eq 77 ]; then
                echo "skip - $name: $(tail -n 1 "$log")"; skipped=$((skipped + 1))
            else
                echo "not ok - $name (exit $rc, ${secs}s)"; sed 's/^/    /' "$log" | tail -n 40
                failed=$((failed + 1)); failed_names+=("$name")
            fi
            rm -f "$log"
        done
    done
}

case "$what" in
    unit) run_unit ;;
    integration) run_integration ;;
    all) run_unit; run_integration ;;
    *) echo "usage: tests/run.sh [unit|integration|all] [filter]" >&2; exit 2 ;;
esac
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
