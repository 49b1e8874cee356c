# test_worker.sh - mgpu-worker under mgpu-launch, as a user runs it: the main job, bad cfgs,
# DataParallel, and a worker killed mid-run resuming from its checkpoint.

final() { # final FILE KEY: a value of the metrics file's final object
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if o.get("final"): print(o[sys.argv[2]])' "$1" "$2"
}

t_main_job_trains_to_95_percent() {
    local t0=$SECONDS
    "$LAUNCH" --nproc_per_node=4 "$MGPU_ROOT/configs/train.cfg" metrics_file=m.jsonl >out 2>err ||
        { rc=$?; cat err >&2; fail "train.cfg exited $rc"; }
    [ $((SECONDS - t0)) -lt 30 ] || fail "took $((SECONDS - t0)) s (target < 30 s)"
    python3 -c "import sys; a = float('$(final m.jsonl eval_accuracy)'); sys.exit(a < 0.95)" ||
        fail "held-out accuracy $(final m.jsonl eval_accuracy) < 0.95"
    expect_eq "$(final m.jsonl world_size)" 4 "world size in the metrics"
    expect_grep out '^\[rank0\]:epoch [0-9]+/4 step [0-9]+/[0-9]+ loss [0-9.]+ samples/s [0-9]+ eta'
    expect_no_grep out '^\[rank[123]\]:epoch'
}

# The final evaluation names the epoch of the last step: where max_steps ends mid-epoch, and
# where it falls on an epoch's end (250 steps an epoch here) without an evaluation there.
t_final_eval_names_the_last_steps_epoch() {
    local mode steps want
    for mode in ddp dp; do
        for steps in 500:2 510:3 260:2; do
            want=${steps#*:}
            steps=${steps%:*}
            MGPU_SIM_GPUS=0 CUDA_VISIBLE_DEVICES= "$WORKER" "$MGPU_ROOT/configs/train.cfg" \
                mode=$mode max_steps=$steps eval_interval=3 >out 2>err ||
                { cat err >&2; fail "$mode, max_steps=$steps: exit $?"; }
            expect_grep out "^eval epoch $want step $steps:"
        done
    done
}

# A run that max_steps ends mid-epoch continues with a larger max_steps, exactly: its final
# checkpoint is the uninterrupted run's, byte for byte.
t_max_steps_run_continues_exactly() {
    local job="$MGPU_ROOT/configs/train.cfg"
    MGPU_SIM_GPUS=0 "$LAUNCH" --nproc_per_node=2 "$job" checkpoint=a.ckpt max_steps=100 >out 2>err ||
        { cat err >&2; fail "100 steps: exit $?"; }
    MGPU_SIM_GPUS=0 "$LAUNCH" --nproc_per_node=2 "$job" checkpoint=a.ckpt max_steps=150 >out 2>err ||
        { cat err >&2; fail "to 150 steps: exit $?"; }
    expect_grep out 'resumed from a.ckpt at epoch 1, step 100'
    MGPU_SIM_GPUS=0 "$LAUNCH" --nproc_per_node=2 "$job" checkpoint=b.ckpt max_steps=150 >out 2>err ||
        { cat err >&2; fail "150 steps: exit $?"; }
    cmp -s a.ckpt b.ckpt || fail "100 + 50 resumed steps differ from 150 steps"
}

# Resumed on another world size, a run goes on from as many samples as the checkpoint's saw.
t_resume_on_another_world_size() {
    MGPU_SIM_GPUS=0 "$LAUNCH" --nproc_per_node=2 "$MGPU_ROOT/configs/train.cfg" checkpoint=w.ckpt \
        checkpoint_interval=10 max_steps=100 >out 2>err || { cat err >&2; fail "2 ranks: exit $?"; }
    MGPU_SIM_GPUS=0 "$LAUNCH" --nproc_per_node=4 "$MGPU_ROOT/configs/train.cfg" checkpoint=w.ckpt \
        max_steps=110 >out 2>err || { cat err >&2; fail "4 ranks: exit $?"; }
    expect_grep out 'resumed from w.ckpt at epoch 1, step 100'
    expect_grep out 'written by 2 ranks, this run has 4: epoch 1 goes on from batch 50 of 63'
    expect_grep out 'eval epoch 1 step 110:'
}

t_bad_cfg_exits_2_with_file_line() {
    printf 'model = mlp\nhidden = 8\nlearning_rate = 0.1\n' >bad.cfg
    # checked by the launcher before anything starts: one message, exit 2, no worker output
    "$LAUNCH" --nproc_per_node=2 bad.cfg >out 2>err
    expect_eq $? 2 "exit status"
    expect_grep err "^mgpu-launch: error: bad.cfg:3: unknown key 'learning_rate'"
    expect_eq "$(wc -l <err)" 1 "lines of error"
    expect_eq "$(wc -c <out)" 0 "worker output"
    printf 'optimizer = rmsprop\n' >bad2.cfg
    "$LAUNCH" bad2.cfg >out 2>err
    expect_eq $? 2 "exit status"
    expect_grep err 'bad2.cfg:1.*rmsprop.*sgd, adamw'
    "$LAUNCH" "$MGPU_ROOT/configs/train.cfg" epochs=x >out 2>err
    expect_eq $? 2 "exit status of a bad override"
    expect_grep err "override 'epochs=x'"
    # the worker alone says the same (exit 2)
    "$WORKER" bad.cfg >out 2>err
    expect_eq $? 2 "mgpu-worker's exit status"
    expect_grep err 'bad.cfg:3'
}

t_dp_mode_reports_each_device_share() {
    sed 's/^mode.*//' "$MGPU_ROOT/configs/demo.cfg" >dp.cfg
    printf 'mode = dp\ndp_devices = 4\n' >>dp.cfg
    "$LAUNCH" dp.cfg >out 2>err || { cat err out >&2; fail "dp exited $?"; }
    # the article's DataParallel: batch 30 scattered as 8/8/8/6 over 4 devices
    expect_grep out 'In Model: input size \[8, 5\]'
    expect_grep out 'In Model: input size \[6, 5\]'
    expect_grep out '[Dd]evice 0'
}

# A worker killed with SIGKILL mid-run: the group restarts (--max_restarts), resumes from the
# last checkpoint by itself, and ends with the same parameters (checkpoint bytes) and loss as
# an uninterrupted run.
t_killed_worker_resumes_from_checkpoint() {
    cat >ck.cfg <<'EOF2'
dataset = synthetic
samples = 16000
features = 16
classes = 4
data_seed = 3
eval_fraction = 0.25
model = mlp
hidden = 256,256
loss = cross_entropy
optimizer = adamw
lr = 0.003
batch_size = 32
epochs = 6
shuffle = true
seed = 5
log_interval = 0
checkpoint_interval = 50
EOF2
    sed 's/^checkpoint_interval.*/&\ncheckpoint = a.ck/' ck.cfg >a.cfg
    sed 's/^checkpoint_interval.*/&\ncheckpoint = b.ck/' ck.cfg >b.cfg
    "$LAUNCH" --nproc_per_node=2 a.cfg metrics_file=a.jsonl >out.a 2>err.a ||
        { cat err.a >&2; fail "uninterrupted run exited $?"; }
    local mark="ck-$$-$RANDOM"
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=2 --max_restarts=1 --summary s.json b.cfg \
        metrics_file=b.jsonl >out.b 2>err.b &
    local lp=$! victim=""
    wait_until 60 test -e b.ck || fail "no checkpoint written"
    for p in $(procs_with_mark $mark 2>/dev/null); do
        tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'RANK=1' &&
            grep -q mgpu-worker /proc/$p/cmdline 2>/dev/null && victim=$p
    done
    [ -n "$victim" ] || fail "rank 1 not found (the run ended before the kill?)"
    kill -9 "$victim"
    wait $lp || { cat err.b >&2; fail "the restarted run exited $?"; }
    python3 -c 'import json; s = json.load(open("s.json")); assert s["attempts"] == 2, s["attempts"]' ||
        fail "expected 2 attempts"
    expect_eq "$(final b.jsonl loss)" "$(final a.jsonl loss)" "final loss"
    cmp a.ck b.ck || fail "the resumed run's parameters differ from the uninterrupted run's"
}

t_metrics_file_and_plot() {
    command -v gnuplot >/dev/null && command -v jq >/dev/null || skip "gnuplot or jq missing"
    "$LAUNCH" --nproc_per_node=2 "$MGPU_ROOT/configs/train.cfg" epochs=2 metrics_file=m.jsonl \
        >out 2>err || fail "train exited $?"
    python3 - <<'PY' || fail "metrics file"
import json
rows = [json.loads(l) for l in open("m.jsonl")]
assert rows[-1]["final"] is True and rows[-1]["world_size"] == 2, rows[-1]
assert any("loss" in r and "step" in r and not r.get("final") for r in rows)
assert any("eval_accuracy" in r for r in rows[:-1])
PY
    bash "$MGPU_ROOT/scripts/plot_metrics.sh" m.jsonl m.png >/dev/null || fail "plot exited $?"
    expect_eq "$(head -c 8 m.png | od -An -tx1 | tr -d ' \n')" 89504e470d0a1a0a "PNG signature"
}

t_metrics_file_on_a_full_disk_is_said_and_kept_whole() {
    # metrics_file on a 64 KB tmpfs (a mount namespace of the test's own): the disk fills
    # mid-run; the worker says so once, naming the file, trains on to exit 0, and the file
    # keeps whole JSON lines only (a record cut in the middle would break its readers)
    [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null || skip "needs root and a mount namespace"
    mkdir -p small
    unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs small && "$@" && cp small/m.jsonl m.jsonl' sh \
        "$WORKER" "$MGPU_ROOT/configs/train.cfg" epochs=4 log_interval=1 \
        metrics_file=small/m.jsonl >out 2>err
    rc=$?
    if [ "$rc" != 0 ] && grep -q '^mount:' err; then skip "no tmpfs here: $(head -c 200 err)"; fi
    expect_eq "$rc" 0 "exit status ($(tail -3 err))"
    expect_eq "$(grep -c 'metrics_file' err)" 1 "warnings"
    expect_grep err '^mgpu-worker: warning: metrics_file small/m.jsonl: No space left on device; the records from here on are not in it$'
    python3 -c '
import json
rows = [json.loads(l) for l in open("m.jsonl")]
assert len(rows) > 100 and not any(r.get("final") for r in rows), len(rows)' ||
        fail "m.jsonl: $(tail -c 200 m.jsonl)"
    expect_grep out '^eval epoch 4 step 1000: '
}

t_cpu_worker_does_not_load_cublas() {
    # cuBLAS is opened with the first CUDA backend (kernels_cuda.cu): a worker training on
    # the CPU never maps it (linked, libcublasLt alone cost ~60 ms of every start).
    LD_DEBUG=libs MGPU_SIM_GPUS=0 CUDA_VISIBLE_DEVICES= "$WORKER" "$MGPU_ROOT/configs/train.cfg" \
        epochs=1 >out 2>err || { tail err >&2; fail "worker exited $?"; }
    expect_no_grep err 'calling init: .*libcublas'
    expect_grep err 'calling init: .*libc\.so'
}
