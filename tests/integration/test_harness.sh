# test_harness.sh - tests/run.sh itself, on planted tests in a scratch folder: a test that never
# reports, a file that does not load, a skip after a failed check, a test past its deadline that
# leaves processes behind: each must count as a failure, the exit status must say so, and the
# last line must keep its form ("N passed, N failed[, N skipped]").

RUN_SH="$MGPU_ROOT/tests/run.sh"

# harness KIND: tests/run.sh KIND on the planted build/ and integration/ of $TEST_TMP; output in
# h.out, status in $rc, last line in $last
harness() {
    mkdir -p build/tests integration
    MGPU_BUILD=$TEST_TMP/build MGPU_INTEGRATION_DIR=$TEST_TMP/integration \
        bash "$RUN_SH" "$@" >h.out 2>&1
    rc=$?
    last=$(tail -n 1 h.out)
}
# Planted t_* functions are written with printf, never as lines of this file's text: run.sh
# reads the text for the tests it expects.
# plant_unit NAME BODY: an executable build/tests/NAME running the shell BODY
plant_unit() {
    mkdir -p build/tests
    printf '#!/usr/bin/env bash\n%s\n' "$2" >"build/tests/$1"
    chmod +x "build/tests/$1"
}
expect_result() { # expect_result LAST_LINE STATUS(0|nonzero)
    expect_eq "$last" "$1" "last line of tests/run.sh (output: $(cat h.out))"
    if [ "$2" = 0 ]; then expect_eq "$rc" 0 "exit status"
    else [ "$rc" -ne 0 ] || fail "exit status 0 for: $(cat h.out)"; fi
    expect_grep "$last" '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$'
}

t_harness_counts_good_runs() {
    plant_unit test_good 'if [ -n "${CHECK_LIST:-}" ]; then echo "list - a"; echo "list - b"; exit 0; fi
echo "ok - a"; echo "skip - b"; echo "1 passed, 0 failed, 1 skipped"'
    harness unit
    expect_result "1 passed, 0 failed, 1 skipped" 0
    expect_grep h.out '^expecting 2 tests$'
}

t_harness_unit_crash_before_first_test() {
    plant_unit test_crash 'kill -SEGV $$'
    harness unit
    expect_result "0 passed, 1 failed" nonzero
}

t_harness_unit_silent_exit_0() {
    # a binary that prints nothing and exits 0 (main returned before its tests)
    plant_unit test_silent 'exit 0'
    harness unit
    expect_result "0 passed, 1 failed" nonzero
}

t_harness_unit_stops_half_way() {
    # three tests listed, one reported, then exit 0: the two missing ones fail
    plant_unit test_half 'if [ -n "${CHECK_LIST:-}" ]; then printf "list - %s\n" a b c; exit 0; fi
echo "ok - a"; exit 0'
    harness unit
    expect_result "1 passed, 2 failed" nonzero
}

t_harness_skip_after_failed_check() {
    command -v cc >/dev/null || skip "no C compiler here"
    cat >skip.c <<'EOF'
#include "check.h"
static void test_fails_then_skips(void)
{
    CHECK(1 == 2);
    SKIP("nothing to see");
}
static void test_skips(void) { SKIP("no device"); }
int main(void)
{
    RUN(test_fails_then_skips);
    RUN(test_skips);
    return check_done();
}
EOF
    mkdir -p build/tests
    cc -I"$MGPU_ROOT/tests/unit" -o build/tests/test_skip skip.c || fail "cc of skip.c"
    harness unit
    expect_result "0 passed, 1 failed, 1 skipped" nonzero
    expect_grep h.out '^not ok - test_fails_then_skips$'
    expect_grep h.out '^skip - test_skips$'
}

t_harness_integration_file_with_syntax_error() {
    mkdir -p integration
    printf '%s\n' 't_first() { true; }' 'if then fi' 't_second() { true; }' 't_third() { true; }' \
        >integration/test_broken.sh
    harness integration
    # t_first is known before the error; the two after it never run and fail
    expect_result "1 passed, 2 failed" nonzero
    expect_grep h.out 'not ok - test_broken:t_second \(never ran'
}

t_harness_integration_file_that_exits() {
    mkdir -p integration
    printf 'exit 3\nt_a() { true; }\nt_b() { true; }\n' >integration/test_exits.sh
    harness integration
    expect_result "0 passed, 2 failed" nonzero
}

t_harness_integration_results() {
    mkdir -p integration
    printf 't_p() { true; }\nt_f() { fail "planted"; }\nt_s() { skip "planted"; }\n' >integration/test_mix.sh
    harness integration
    expect_result "1 passed, 1 failed, 1 skipped" nonzero
    harness integration t_p
    expect_result "1 passed, 0 failed" 0
}

t_harness_deadline_ends_everything() {
    # the planted test starts a process in a session of its own (as a launcher's workers are),
    # then outlives its deadline: the test fails and nothing it started survives
    local probe="probe.$$.$RANDOM"
    mkdir -p integration
    printf '%s\n' 't_slow() {' \
        "    HARNESS_PROBE=$probe setsid sleep 300 </dev/null >/dev/null 2>&1 &" \
        "    HARNESS_PROBE=$probe sleep 300 &" '    sleep 300' '}' >integration/test_slow.sh
    MGPU_TEST_TIMEOUT=2 harness integration
    expect_result "0 passed, 1 failed" nonzero
    expect_grep h.out 'not ok - test_slow:t_slow \(deadline'
    local left; left=$(grep -lsxzF "HARNESS_PROBE=$probe" /proc/[0-9]*/environ | cut -d/ -f3)
    [ -z "$left" ] || { kill -KILL $left; fail "processes the timed-out test started are alive: $left"; }
}

t_harness_all_counts_both() {
    plant_unit test_good 'if [ -n "${CHECK_LIST:-}" ]; then echo "list - a"; exit 0; fi
echo "ok - a"'
    mkdir -p integration
    printf 't_a() { true; }\n' >integration/test_one.sh
    harness all
    expect_result "2 passed, 0 failed" 0
    expect_grep h.out '^expecting 2 tests$'
}

t_harness_tests_run_together_printed_in_order() {
    # t_a can pass only while t_b runs beside it; t_b ends first, yet t_a's lines come first,
    # and the failure is t_c's own
    mkdir -p integration
    printf '%s\n' "t_a() { wait_until 20 test -e $TEST_TMP/b.started || fail 't_b never ran beside t_a'; }" \
        "t_b() { touch $TEST_TMP/b.started; }" 't_c() { fail planted; }' >integration/test_pool.sh
    MGPU_TEST_JOBS=3 harness integration
    expect_result "2 passed, 1 failed" nonzero
    expect_eq "$(grep -E '^(ok|not ok) - ' h.out | sed 's/ (.*//' | tr '\n' '|')" \
        "ok - test_pool:t_a|ok - test_pool:t_b|not ok - test_pool:t_c|" "order of the results"
    expect_grep h.out '^failed: test_pool:t_c$'
    expect_grep "$(sed -n '/^not ok - test_pool:t_c/,$p' h.out)" 'FAIL: planted'
    MGPU_TEST_JOBS=x harness integration
    expect_eq "$rc" 2 "exit status with MGPU_TEST_JOBS=x"
    expect_grep h.out "MGPU_TEST_JOBS='x': expected a number"
}

t_harness_alone_runs_with_no_other_test() {
    # each test says it runs while it does; t_b (alone) fails if another runs during its time
    mkdir -p integration
    local t body
    for t in a b c d; do
        body="touch $TEST_TMP/running.$t; sleep 0.5; rm $TEST_TMP/running.$t"
        [ $t = b ] && body="ls $TEST_TMP/running.[acd] 2>/dev/null && fail 'others ran'; $body; ls $TEST_TMP/running.[acd] 2>/dev/null && fail 'others ran'; true"
        printf 't_%s() { %s; }\n' "$t" "$body"
    done >integration/test_alone.sh
    echo "# alone: t_b" >>integration/test_alone.sh
    MGPU_TEST_JOBS=4 harness integration
    expect_result "4 passed, 0 failed" 0
}
