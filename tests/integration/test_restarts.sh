# test_restarts.sh - --max_restarts: the whole group restarts with TORCHELASTIC_RESTART_COUNT
# incremented; success after restarts exits 0; always failing exits with the failing code after
# max_restarts+1 attempts.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE PET_MAX_RESTARTS
export OMP_NUM_THREADS=1

envval() { local l; l=$(grep -m1 "^$2=" "$1") || { echo "<unset>"; return; }; echo "${l#*=}"; }

t_restarts_then_success() {
    # rank 1 fails while TORCHELASTIC_RESTART_COUNT < 2, then every rank succeeds
    run_launch --nproc_per_node=2 --max_restarts=2 --summary s.json "$TW" env e.%l.%a \
        touch ready.%a.%l waitall ready.%a. 2 only 1 fail_until 2 3 exit 0
    expect_eq "$rc" 0 "exit status ($(cat err))"
    local a k
    for a in 0 1 2; do
        for k in 0 1; do
            [ -f e.$k.$a ] || fail "rank $k did not run in attempt $a"
            expect_eq "$(envval e.$k.$a TORCHELASTIC_RESTART_COUNT)" $a "restart count of rank $k, attempt $a"
            expect_eq "$(envval e.$k.$a TORCHELASTIC_MAX_RESTARTS)" 2 "max restarts"
            expect_eq "$(envval e.$k.$a RANK)" $k
            case "$(envval e.$k.$a TORCHELASTIC_ERROR_FILE)" in
                */attempt_$a/$k/error.json) ;;
                *) fail "attempt $a rank $k error file $(envval e.$k.$a TORCHELASTIC_ERROR_FILE)" ;;
            esac
        done
    done
    [ ! -e e.0.3 ] || fail "a fourth attempt ran"
    # static rendezvous: MASTER_PORT stays the same across attempts (as torchrun)
    expect_eq "$(envval e.0.2 MASTER_PORT)" "$(envval e.0.0 MASTER_PORT)" "MASTER_PORT across attempts"
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "succeeded" and d["exit_code"] == 0, d
assert d["attempts"] == 3, d["attempts"]
assert len(d["failed_attempts"]) == 2, d["failed_attempts"]
assert all(f["exit_code"] == 3 and f["rank"] == 1 for f in d["failed_attempts"]), d["failed_attempts"]
EOF
}

t_restarts_always_failing() {
    run_launch --nproc_per_node=2 --max_restarts=2 --summary s.json "$TW" env e.%l.%a \
        touch ready.%a.%l only 0 waitall ready.%a. 2 only 0 exit 7 pause
    expect_eq "$rc" 7 "exit status"
    for a in 0 1 2; do [ -f e.1.$a ] || fail "attempt $a did not run"; done
    [ ! -e e.1.3 ] || fail "a fourth attempt ran"
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "failed" and d["exit_code"] == 7, d
assert d["attempts"] == 3, d["attempts"]
assert d["max_restarts"] == 2
assert d["root_cause"]["exit_code"] == 7 and d["root_cause"]["rank"] == 0, d["root_cause"]
assert len(d["failed_attempts"]) == 3, d["failed_attempts"]
EOF
    expect_grep err 'Root Cause'
    expect_grep err '[Aa]ttempts: 3|3 attempts'
}

t_restarts_zero_by_default() {
    run_launch --nproc_per_node=1 "$TW" env e.%a exit 4
    expect_eq "$rc" 4
    [ -f e.0 ] && [ ! -e e.1 ] || fail "restarted without --max_restarts: $(ls)"
}

t_restarts_stopped_workers_restarted_too() {
    # rank 1 fails in attempt 0 only; rank 0 waits for a file the test creates once attempt
    # 1 runs: rank 0 gets SIGTERM in attempt 0 and is restarted with the group (all-or-nothing)
    "$LAUNCH" --nproc_per_node=2 --max_restarts=1 "$TW" trap sig.%l.%a TERM env e.%l.%a touch ready.%a.%l \
        only 1 waitall ready.%a. 2 only 1 fail_until 1 5 only 0 waitfile go.%a exit 0 >out 2>err &
    local lp=$!
    wait_until 20 test -e e.0.1 || { kill $lp; fail "no second attempt"; }
    touch go.1
    wait $lp; rc=$?
    expect_eq "$rc" 0 "exit status"
    expect_grep sig.0.0 '^TERM'
    [ ! -e sig.0.1 ] || fail "rank 0 got a signal in attempt 1"
}

t_restarts_log_dir_attempts() {
    run_launch --nproc_per_node=2 --max_restarts=1 --log_dir logs --rdzv_id=rr --tee 3 "$TW" \
        print "attempt %a rank %r" touch ready.%a.%l waitall ready.%a. 2 only 1 fail_until 1 9 exit 0
    expect_eq "$rc" 0
    local d; d=$(ls -d logs/rr_*)
    [ -n "$d" ] || fail "no run folder in logs: $(ls -R logs)"
    expect_grep "$d/attempt_0/0/stdout.log" '^attempt 0 rank 0$'
    expect_grep "$d/attempt_1/0/stdout.log" '^attempt 1 rank 0$'
    expect_grep "$d/attempt_1/1/stdout.log" '^attempt 1 rank 1$'
}
