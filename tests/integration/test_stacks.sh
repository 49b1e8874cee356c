# test_stacks.sh - launcher/stacks.c as a normal user: the unit tests of tests/unit/test_stacks.c
# (a C program in sleep(), a Python program in time.sleep, a stopped process, a hung tool)
# run again without root's right to trace anything. On a host with Yama's ptrace_scope=1 this
# is the case the workers' PR_SET_PTRACER is for: the tools are not the targets' ancestors.

t_stacks_as_a_normal_user() {
    local bin="$MGPU_BUILD/tests/test_stacks" user=nobody out
    [ "$(id -u)" -eq 0 ] || skip "needs root to become another user"
    command -v setpriv >/dev/null || skip "setpriv not installed"
    command -v gdb >/dev/null || command -v eu-stack >/dev/null ||
        skip "neither gdb nor eu-stack is installed"
    # the binary's folder may be unreadable to others: a copy in a folder they can read
    mkdir -m 755 bin lib && cp "$bin" bin/ && cp "$MGPU_BUILD"/lib/libcjson.so.1 lib/ &&
        chmod 755 bin/test_stacks "$TEST_TMP" && chmod 644 lib/*
    out=$(cd / && setpriv --reuid="$(id -u $user)" --regid="$(id -g $user)" --clear-groups \
        env HOME=/ TMPDIR=/tmp "$TEST_TMP/bin/test_stacks" 2>&1)
    echo "$out"
    grep -q '^not ok' <<<"$out" && fail "a stacks test failed as $user"
    expect_grep "$out" "^ok - test_native_sleep$"
    [ -r /proc/sys/kernel/yama/ptrace_scope ] &&
        echo "ptrace_scope=$(cat /proc/sys/kernel/yama/ptrace_scope)"
    return 0
}
