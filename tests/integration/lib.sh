# lib.sh - helpers for the integration tests (sourced; each t_* function runs in its own
# subshell inside a fresh temporary folder, $TEST_TMP, with a TMPDIR of its own, both removed
# after it; a non-zero exit fails the test).
LAUNCH="$MGPU_BUILD/bin/mgpu-launch"
WORKER="$MGPU_BUILD/bin/mgpu-worker"
TW="$MGPU_BUILD/tests/testworker"

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "$*"; exit 77; }
# The Python with PyTorch the tests use (Debian's python3-torch by default).
PY=${MGPU_TEST_TORCH_PYTHON:-/usr/bin/python3}
# need_torch [CODE]: skips unless $PY runs CODE (default: torch.distributed is available).
need_torch() {
    local code=${1:-'import torch, torch.distributed as d; assert d.is_available()'}
    [ -x "$PY" ] || skip "$PY not found"
    "$PY" -c "$code" >/dev/null 2>&1 ||
        skip "$PY cannot run '$code' (apt-get install python3-torch)"
}
# skip_under_sanitizers WHY: skips in the sanitizer build (make asan), for a test whose time goes
# to waiting or to arithmetic that other tests already run there; `make test` always runs it.
skip_under_sanitizers() {
    nm "$MGPU_BUILD/lib/libmgpu.a" 2>/dev/null | grep -q __asan_ && skip "a sanitizer build: $*"
    return 0
}

# expect_eq ACTUAL EXPECTED [what]
expect_eq() { [ "$1" == "$2" ] || fail "${3:-value}: got '$1', expected '$2'"; }
# expect_contains FILE_OR_TEXT PATTERN (grep -E on a file if it exists, else on the text)
expect_grep() {
    local src=$1 pat=$2
    if [ -f "$src" ]; then grep -qE -- "$pat" "$src" || { cat "$src" >&2; fail "'$pat' not in $src"; }
    else grep -qE -- "$pat" <<<"$src" || fail "'$pat' not in: $src"; fi
}
expect_no_grep() {
    local src=$1 pat=$2
    if [ -f "$src" ]; then ! grep -qE -- "$pat" "$src" || { cat "$src" >&2; fail "'$pat' unexpectedly in $src"; }
    else ! grep -qE -- "$pat" <<<"$src" || fail "'$pat' unexpectedly in: $src"; fi
}
# free_port: a TCP port P nobody listens on now, with P + 1 free too (several nodes use both: the
# store and MASTER_PORT), below the ephemeral range, so that no outgoing connection of a test
# running beside takes P or P + 1 before the job listens there (an even port, each test its own).
free_port() {
    "$(command -v /usr/bin/python3 || command -v python3)" -c 'import random, socket
for _ in range(500):
    p = random.randrange(20000, 32000, 2)
    try:
        for q in (p, p + 1):
            s = socket.socket(); s.bind(("", q)); s.close()
    except OSError:
        continue
    print(p); break'
}
# run_launch ARGS... : runs the launcher, stdout to out, stderr to err, status in $rc
run_launch() { "$LAUNCH" "$@" >out 2>err; rc=$?; }
# pids of live processes whose environment carries MGPU_TEST_MARK=<value> (one grep over every
# environ: a loop of two processes per pid takes seconds on a busy machine, and tests poll this)
procs_with_mark() {
    grep -lsxzF "MGPU_TEST_MARK=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}
wait_until() { # wait_until SECONDS CMD... : polls CMD every 20 ms
    local end=$((SECONDS + $1)); shift
    until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.02; done
}
