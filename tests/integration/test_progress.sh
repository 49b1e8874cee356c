# test_progress.sh - mgpu-worker publishes where it is on the progress page a launcher hands it
# (MGPU_PROGRESS_FILE, MGPU_PROGRESS_SLOT): tests/helper/progress_peek makes the pages as
# mgpu-launch does (a memfd), starts the ranks and prints the pages every few milliseconds.

PEEK="$MGPU_BUILD/tests/progress_peek"
CFG="$MGPU_ROOT/configs/train.cfg"

# field SLOT NAME FILE: NAME's values on SLOT's lines of FILE, one a line
field() { grep "slot=$1 " "$3" | grep -oE " $2=[^ ]*" | cut -d= -f2; }

# The main job on two CPU ranks: steps and phases advance while it runs; at the end both
# ranks are done after the same collectives, all of them finished.
t_progress_main_job_two_ranks() {
    "$PEEK" -n 2 -i 10 -- "$WORKER" "$CFG" metrics_file= >out 2>err || { cat err >&2; fail "exit $?"; }
    expect_grep out '^epoch 4/4 step 500/500'
    for s in 0 1; do
        expect_grep out "^peek final slot=$s rank=$s pid=[0-9]+ step=500 phase=done "
        grep "^peek t=" out | grep "slot=$s " >running.$s
        # seen at several steps, and in more than one phase of a step
        [ "$(field $s step running.$s | grep -v -- -1 | sort -u | wc -l)" -ge 3 ] ||
            { cat running.$s >&2; fail "slot $s: fewer than 3 steps seen"; }
        [ "$(field $s phase running.$s | grep -vE 'init|done' | sort -u | wc -l)" -ge 2 ] ||
            { cat running.$s >&2; fail "slot $s: fewer than 2 phases of a step seen"; }
        # steps never go back
        field $s step running.$s | sort -n -c || fail "slot $s: a step went back"
    done
    grep "^peek final" out >final
    e0=$(field 0 entered final) e1=$(field 1 entered final)
    expect_eq "$e0" "$e1" "collectives entered by ranks 0 and 1"
    expect_eq "$(field 0 done final)" "$e0" "rank 0's collectives done"
    expect_eq "$(field 1 done final)" "$e1" "rank 1's collectives done"
    # a gradient all-reduce a step at least, and the bucket of one was seen
    [ "$e0" -ge 500 ] || fail "only $e0 collectives for 500 steps"
    grep -qE "^peek t=.* last=all-reduce#[0-9]+ bucket=0 bytes=[1-9]" out ||
        fail "no bucketed all-reduce seen"
}

# One process (no collective but the loss's) and DataParallel (threads, no libmgpu
# collective): both count their steps to the end.
t_progress_single_and_dp() {
    "$PEEK" -i 20 -- "$WORKER" "$CFG" epochs=1 metrics_file= >out 2>err || { cat err >&2; fail "exit $?"; }
    expect_grep out '^peek final slot=0 rank=0 pid=[0-9]+ step=250 phase=done '
    "$PEEK" -i 20 -- "$WORKER" "$CFG" epochs=1 mode=dp metrics_file= >out 2>err || { cat err >&2; fail "dp: exit $?"; }
    expect_grep out '^peek final slot=0 rank=0 pid=[0-9]+ step=250 phase=done moves=[0-9]+ entered=0 done=0 '
}

# MGPU_PROGRESS=0: nothing is published, and the job runs as before.
t_progress_off() {
    MGPU_PROGRESS=0 "$PEEK" -i 20 -- "$WORKER" "$CFG" epochs=1 metrics_file= >out 2>err ||
        { cat err >&2; fail "exit $?"; }
    expect_grep out '^epoch 1/1 step 100/250'
    expect_grep out '^peek final slot=0 not attached$'
    expect_no_grep err 'MGPU_PROGRESS'
}

# Bad variables: a warning naming the variable, and training that goes on.
t_progress_bad_variables_warn() {
    MGPU_PROGRESS_FILE=/nonexistent/progress MGPU_PROGRESS_SLOT=0 \
        "$WORKER" "$CFG" epochs=1 metrics_file= >out 2>err || { cat err >&2; fail "exit $?"; }
    expect_grep err 'MGPU_PROGRESS_FILE: open\(/nonexistent/progress\): No such file'
    expect_grep out '^eval epoch 1 step 250'
    "$PEEK" -n 1 -i 20 -- env MGPU_PROGRESS_SLOT=3 "$WORKER" "$CFG" epochs=1 metrics_file= \
        >out 2>err || { cat err >&2; fail "exit $?"; }
    expect_grep err 'MGPU_PROGRESS_SLOT=3: .* no slot 3'
    expect_grep out '^peek final slot=0 not attached$'
}

# make install writes the man pages into the build folder: not beside test_install's tests.
# alone: t_progress_api_through_installed_headers

# A program of the user's own, built against the installed headers (<mgpu/mgpu.h> brings
# <mgpu/progress.h>): its steps, phase and label reach the page.
t_progress_api_through_installed_headers() {
    command -v pkg-config >/dev/null || skip "no pkg-config"
    for t in help2man go-md2man; do
        command -v $t >/dev/null || skip "$t not installed (scripts/setup.sh installs it)"
    done
    nm "$MGPU_BUILD/lib/libmgpu.a" 2>/dev/null | grep -q __asan_ && skip "a sanitizer build (make asan)"
    make -s -C "$MGPU_ROOT" install BUILD="$MGPU_BUILD" PREFIX="$PWD/inst" >make.out 2>&1 ||
        { cat make.out >&2; fail "make install"; }
    cat >mine.c <<'EOF2'
#include <stdio.h>
#include <mgpu/mgpu.h>
int main(void)
{
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err;
    float x = 1;
    if (mgpu_init(NULL, &ctx, &err) < 0 || mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 30, &comm, &err) < 0)
        return fprintf(stderr, "%s\n", err.msg), 1;
    mgpu_progress_label(ctx, "hello");
    for (long long s = 1; s <= 3; s++) {
        mgpu_progress_step(ctx, s);
        mgpu_progress_phase(ctx, MGPU_PHASE_FORWARD);
        mgpu_progress_bucket(ctx, 7);
        if (mgpu_allreduce_f32(comm, &x, 1, MGPU_SUM, NULL, &err) < 0)
            return fprintf(stderr, "%s\n", err.msg), 1;
        mgpu_progress_phase(ctx, MGPU_PHASE_OPTIMIZER);
    }
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    return 0;
}
EOF2
    cc -Wall -Werror mine.c $(PKG_CONFIG_PATH=$PWD/inst/lib/pkgconfig pkg-config --cflags --libs mgpu) \
        -o mine 2>cc.err || { cat cc.err >&2; fail "cc"; }
    "$PEEK" -i 20 -- ./mine >out 2>err || { cat err >&2; fail "exit $?"; }
    expect_grep out '^peek final slot=0 rank=0 pid=[0-9]+ step=3 phase=optimizer moves=[0-9]+ entered=3 done=3 last=all-reduce#3 bucket=7 bytes=4 label="hello"$'
}
