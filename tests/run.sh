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
# MGPU_TEST_JOBS (default 3) tests run at a time: most of an integration test's time goes to
# waiting (for a timeout, a grace period, a worker's sleep), not to the CPU. Each test's lines
# are printed whole and in the order of a serial run, as soon as it and those before it are done.
# MGPU_TEST_JOBS=1 runs them one after the other. A test that must not run beside others (its
# deadline leaves no room for a busy CPU, or it writes what they read) is named in its file on a
# line "# alone: t_name ..." and runs with no other test.
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
jobs=${MGPU_TEST_JOBS:-3}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] ||
    { echo "tests/run.sh: MGPU_TEST_JOBS='$jobs': expected a number of tests at a time, 1 or more" >&2; exit 2; }
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
# Interrupted (Ctrl-C, a CI's cancel): the running tests are sessions of their own, out of reach
# of the signal; every process of theirs carries a marker that starts with run.$$.
interrupted() {
    kill -TERM "${pids[@]}" 2>/dev/null
    kill_marked "run.$$." prefix >/dev/null
    exit 130
}
trap interrupted INT TERM

# The pool. Job N writes its lines to $results/N.out and its counts to $results/N.res (see
# counts); N.done, written last, holds the job's exit status. The caller prints and adds up the
# jobs in the order they were started, so the output reads as a serial run's would.
started=0 printed=0 pids=()

# counts PASSED FAILED SKIPPED [FAILED NAMES]: a job's results, for the caller to add up
counts() {
    printf '%s %s %s\n%s\n' "$1" "$2" "$3" "${4:-}" >"$result"
}

# start_job FN ARGS...: runs "FN ARGS" in the background once fewer than $jobs are running
start_job() {
    wait_below "$jobs"
    (
        result=$results/$started.res
        "$@" >"$results/$started.out" 2>&1
        echo $? >"$results/$started.done"
    ) &
    pids[started]=$!
    started=$((started + 1))
    print_done
}

# done_jobs: how many jobs have ended (a job whose shell is gone has, whether it said so or not)
done_jobs() {
    local n=0 i
    for ((i = printed; i < started; i++)); do
        { [ -e "$results/$i.done" ] || ! kill -0 "${pids[i]}" 2>/dev/null; } && n=$((n + 1))
    done
    echo $((printed + n))
}

# print_done: prints and counts the jobs that are done, in order, up to the first still running.
# A job that ended without saying so (its shell was killed) fails.
print_done() {
    local p f s names name
    while [ "$printed" -lt "$started" ]; do
        if [ ! -e "$results/$printed.done" ]; then
            kill -0 "${pids[printed]}" 2>/dev/null && break
            # gone: .done may have been written just before it ended
            [ -e "$results/$printed.done" ] || echo 1 >"$results/$printed.done"
        fi
        cat "$results/$printed.out"
        if [ -s "$results/$printed.res" ]; then
            { read -r p f s; names=$(cat); } <"$results/$printed.res"
        else
            echo "not ok - job $printed ended without results: $(tail -n 3 "$results/$printed.out")"
            p=0 f=1 s=0 names="(job $printed)"
        fi
        passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
        while read -r name; do [ -n "$name" ] && failed_names+=("$name"); done <<<"$names"
        rm -f "$results/$printed".*
        printed=$((printed + 1))
    done
}

# wait_below N: waits until fewer than N jobs are running, printing those that are done
wait_below() {
    while [ $((started - $(done_jobs))) -ge "$1" ]; do
        wait -n 2>/dev/null || sleep 0.05
        print_done
    done
}

# start_alone FN ARGS...: runs "FN ARGS" once every other job has ended, and waits for it
start_alone() {
    wait_below 1
    start_job "$@"
    wait_below 1
}

# wait_jobs: waits for every job and prints what is left
wait_jobs() {
    wait_below 1
    print_done
}

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

# unit_job BIN: runs one unit binary; its lines on stdout, its counts in $result (below)
unit_job() {
    local bin=$1 out rc want got f ok sk
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
    counts "$ok" "$f" "$sk" "$([ "$f" -gt 0 ] && basename "$bin")"
}

run_unit() {
    local bin
    for bin in $(unit_bins); do start_job unit_job "$bin"; done
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

# alone_tests FILE: the tests that FILE names on its "# alone:" lines
alone_tests() {
    sed -nE 's/^# alone:(.*)/\1/p' "$1" | grep -oE '\bt_[A-Za-z0-9_]+'
}

# loaded_tests FILE: the t_* functions bash knows after sourcing lib.sh and FILE
loaded_tests() {
    bash -c "source '$here/integration/lib.sh'; source '$1' >/dev/null 2>&1; declare -F" 2>/dev/null |
        awk '{print $3}' | grep '^t_'
}

# kill_marked MARK [prefix]: SIGKILL every process whose environment has MGPU_TEST_RUN=MARK (or a
# marker that starts with MARK), until none is left (a dying launcher may fork once more); prints
# how many were killed.
kill_marked() {
    local n=0 round found how=-x
    [ "${2:-}" = prefix ] && how=
    for round in 1 2 3 4 5 6 7 8 9 10; do
        found=$(grep -lsz $how -F "MGPU_TEST_RUN=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
        [ -z "$found" ] && break
        # shellcheck disable=SC2086
        kill -KILL $found 2>/dev/null
        n=$((n + $(echo "$found" | wc -w)))
        sleep 0.1
    done
    echo "$n"
}

# never_ran FILE FN...: the tests of FILE that bash does not know, each a failure
never_ran() {
    local file=$1 fn name err n=0
    shift
    err=$(bash -c "source '$here/integration/lib.sh'; source '$file'" 2>&1 </dev/null | head -n 3)
    for fn; do
        name="$(basename "$file" .sh):$fn"
        echo "not ok - $name (never ran: $(basename "$file") does not load)"
        n=$((n + 1))
    done
    [ -n "$err" ] && echo "$err" | sed 's/^/    /'
    counts 0 "$n" 0 "$(for fn; do echo "$(basename "$file" .sh):$fn"; done)"
}

# integration_job FILE FN: runs the test FN of FILE; its lines on stdout, its counts in $result
integration_job() {
    local file=$1 fn=$2 rc start log name mark killed dir tmp ms secs
    name="$(basename "$file" .sh):$fn"
    log=$(mktemp)
    dir=$(mktemp -d)
    tmp=$(mktemp -d) # its TMPDIR: the launchers' run folders (what workers wrote) go with it
    mark="run.$$.$BASHPID.$fn"
    start=$(date +%s%N)
    # setsid: the test is a session and process group of its own, so timeout's signal
    # reaches all of it and nothing of the caller's; -w waits for it.
    ( cd "$dir" && TEST_TMP=$PWD TMPDIR=$tmp MGPU_TEST_RUN=$mark exec setsid -w timeout -k 5 \
        ${MGPU_TEST_TIMEOUT:-120} bash -c \
        "set -u; source '$here/integration/lib.sh'; source '$file'; $fn" ) >"$log" 2>&1
    rc=$?
    killed=$(kill_marked "$mark")
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    secs=$(printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "not ok - $name (deadline of ${MGPU_TEST_TIMEOUT:-120}s, exit $rc, ${killed} processes it left killed)"
        sed 's/^/    /' "$log" | tail -n 40
        counts 0 1 0 "$name"
    elif [ $rc -eq 0 ]; then
        echo "ok - $name (${secs}s)"; counts 1 0 0
    elif [ $rc -eq 77 ]; then
        echo "skip - $name: $(tail -n 1 "$log")"; counts 0 0 1
    else
        echo "not ok - $name (exit $rc, ${secs}s)"; sed 's/^/    /' "$log" | tail -n 40
        counts 0 1 0 "$name"
    fi
    rm -f "$log"
    rm -rf "$dir" "$tmp" 2>/dev/null
}

run_integration() {
    local file fn want have missing alone
    for file in $(integration_files); do
        alone=" $(alone_tests "$file" | tr '\n' ' ') "
        want=$(defined_tests "$file" | sort -u)
        have=$(loaded_tests "$file" | sort -u)
        if [ -n "$filter" ]; then
            want=$(for fn in $want; do [[ "$(basename "$file" .sh):$fn" == *"$filter"* ]] && echo "$fn"; done)
            have=$(for fn in $have; do [[ "$(basename "$file" .sh):$fn" == *"$filter"* ]] && echo "$fn"; done)
        fi
        # a test defined in the text that bash does not know: the file does not load
        missing=$(comm -23 <(echo "$want" | sed '/^$/d') <(echo "$have" | sed '/^$/d'))
        # shellcheck disable=SC2086
        [ -n "$missing" ] && start_job never_ran "$file" $missing
        for fn in $have; do
            if [[ "$alone" == *" $fn "* ]]; then start_alone integration_job "$file" "$fn"
            else start_job integration_job "$file" "$fn"; fi
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
wait_jobs
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
