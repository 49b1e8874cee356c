# test_teardown.sh - one worker fails: the others get SIGTERM, then SIGKILL after the grace
# period; the launcher exits with the failing code promptly; the report tells root cause, other
# failures and the workers the launcher stopped apart; torchrun's error file is read.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1

now_ms() { echo $(($(date +%s%N) / 1000000)); }
all_exist() { local f; for f; do [ -e "$f" ] || return 1; done; }
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

t_teardown_sigterm_to_the_others() {
    local t0 t1
    t0=$(now_ms)
    # ranks 0,2,3 record SIGTERM (then die by it); rank 1 fails once all are ready
    run_launch --nproc_per_node=4 --summary s.json "$TW" trap sig.%l TERM env e.%l touch ready.%l \
        only 1 waitall ready. 4 only 1 exit 5 pause
    t1=$(now_ms)
    expect_eq "$rc" 5 "exit status"
    [ $((t1 - t0)) -lt 10000 ] || fail "took $((t1 - t0)) ms (grace period is 30 s: SIGTERM was not enough?)"
    for k in 0 2 3; do
        expect_grep sig.$k '^TERM [0-9]+$'
    done
    [ ! -e sig.1 ] || fail "the failing rank got a signal: $(cat sig.1)"
    # the report: root cause rank 1, no other failures, ranks 0,2,3 stopped by the launcher
    expect_grep err 'Root Cause'
    expect_grep err 'rank +: 1 \(local_rank: 1\)'
    expect_grep err '<NO_OTHER_FAILURES>'
    expect_grep err 'Stopped by the launcher'
    for k in 0 2 3; do
        expect_grep err "rank $k \(local_rank: $k.*SIGTERM"
    done
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["exit_code"] == 5 and d["root_cause"]["local_rank"] == 1, d
st = {w["local_rank"]: w["state"] for w in d["workers"]}
assert st == {0: "stopped", 1: "failed", 2: "stopped", 3: "stopped"}, st
for w in d["workers"]:
    if w["local_rank"] != 1:
        assert w.get("stopped_with") in ("TERM", "SIGTERM"), w
EOF
}

t_teardown_sigterm_reaches_worker_group() {
    # the SIGTERM goes to each worker's process group: a grandchild gets it too
    run_launch --nproc_per_node=2 "$TW" spawn pg gc.%l gcsig.%l trap sig.%l TERM \
        waitfile gc.%l touch ready.%l only 1 waitall ready. 2 only 1 exit 4 pause
    expect_eq "$rc" 4
    expect_grep sig.0 '^TERM'
    expect_grep gcsig.0 '^TERM'
    local gc; gc=$(cat gc.0)
    wait_until 5 eval "! alive $gc" || fail "the grandchild $gc of the stopped worker survived"
    gc=$(cat gc.1)
    wait_until 5 eval "! alive $gc" || fail "the grandchild $gc of the failed worker survived"
}

t_teardown_sigkill_after_grace_period() {
    local t0 t1
    t0=$(now_ms)
    # rank 0 ignores SIGTERM; rank 1 fails: rank 0 must get SIGKILL after --grace_period=1
    run_launch --nproc_per_node=2 --grace_period=1 --summary s.json "$TW" ignore sig.%l TERM \
        env e.%l touch ready.%l only 1 waitall ready. 2 only 1 exit 6 pause
    t1=$(now_ms)
    expect_eq "$rc" 6 "exit status"
    expect_grep sig.0 '^TERM'
    [ $((t1 - t0)) -ge 900 ] || fail "SIGKILL came after $((t1 - t0)) ms, before the 1 s grace period"
    [ $((t1 - t0)) -lt 8000 ] || fail "took $((t1 - t0)) ms with --grace_period=1"
    expect_grep err 'rank 0 \(local_rank: 0.*SIGKILL'
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
w0 = [w for w in d["workers"] if w["local_rank"] == 0][0]
assert w0["state"] == "stopped" and w0["signal"] in ("KILL", "SIGKILL"), w0
EOF
    # nothing of rank 0 is left
    local pid; pid=$(python3 -c 'import json; print([w["pid"] for w in json.load(open("s.json"))["workers"] if w["local_rank"]==0][0])')
    ! alive "$pid" || fail "rank 0 (pid $pid) is still alive"
}

t_teardown_grace_zero_kills_at_once() {
    local t0 t1
    t0=$(now_ms)
    run_launch --nproc_per_node=2 --grace_period=0 "$TW" ignore sig.%l TERM touch ready.%l \
        only 1 waitall ready. 2 only 1 exit 6 pause
    t1=$(now_ms)
    expect_eq "$rc" 6
    [ $((t1 - t0)) -lt 5000 ] || fail "took $((t1 - t0)) ms with --grace_period=0"
}

t_teardown_other_failures_listed_apart() {
    # rank 1 fails first (root cause); ranks 0 and 2 die by the SIGTERM; rank 3 ignores it
    # and exits 8 once it got it.
    run_launch --nproc_per_node=4 --grace_period=20 "$TW" trap sig.%l TERM touch ready.%l \
        only 3 ignore sig.%l TERM \
        only 1 waitall ready. 4 only 1 exit 5 \
        only 3 waitfile sig.3 only 3 exit 8 pause
    expect_eq "$rc" 5 "exit status (the first failure's)"
    # rank 3 exited 8 after it was asked to stop: the launcher asked it, so it is "stopped";
    # ranks 0 and 2 are stopped too; and rank 1 is the root cause.
    expect_grep err 'rank +: 1 \(local_rank: 1\)'
    expect_grep err 'rank 0 \(local_rank: 0'
    expect_grep err 'rank 2 \(local_rank: 2'
    expect_grep err 'rank 3 \(local_rank: 3.*exitcode 8'
}

t_teardown_two_independent_failures() {
    # ranks 1 and 2 both fail by themselves at (nearly) the same time: one is the root
    # cause, the other is listed under Failures, not as stopped.
    run_launch --nproc_per_node=3 --grace_period=20 "$TW" trap sig.%l TERM \
        only 1 ignore sig.%l TERM only 2 ignore sig.%l TERM touch ready.%l \
        only 1 waitall ready. 3 only 2 waitall ready. 3 \
        only 1 exit 11 only 2 exit 12 pause
    case "$rc" in 11|12) ;; *) fail "exit status $rc, expected 11 or 12" ;; esac
    expect_grep err 'Root Cause'
    # the other one: under Failures (it failed by itself, before or whatever the SIGTERM)
    local other=$((rc == 11 ? 2 : 1))
    awk '/^Failures:/,/^-----/' err >failures
    if ! grep -qE "rank +: $other \(local_rank: $other\)" failures; then
        # a SIGTERM it ignored reached it before its exit: then "stopped" with its own code
        expect_grep err "rank $other \(local_rank: $other.*exitcode $((other + 10))"
    fi
}

t_teardown_error_file_in_report_and_summary() {
    run_launch --nproc_per_node=2 --summary s.json "$TW" \
        only 1 errfile "RuntimeError: boom from rank %r" only 1 exit 1 pause
    expect_eq "$rc" 1
    expect_grep err 'RuntimeError: boom from rank 1'
    expect_grep err 'Traceback'
    expect_grep err 'error_file: /.*attempt_0/1/error.json'
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
ef = d["root_cause"]["error_file"]
assert ef["message"] == "RuntimeError: boom from rank 1", ef
assert "Traceback" in ef["traceback"], ef
EOF
}

t_teardown_promptly_many_workers() {
    # 8 workers, one fails: the launcher exits with its status in well under a second or so
    local t0 t1
    t0=$(now_ms)
    run_launch --nproc_per_node=8 "$TW" trap sig.%l TERM touch ready.%l only 5 waitall ready. 8 only 5 exit 42 pause
    t1=$(now_ms)
    expect_eq "$rc" 42
    for k in 0 1 2 3 4 6 7; do expect_grep sig.$k '^TERM'; done
    [ $((t1 - t0)) -lt 5000 ] || fail "took $((t1 - t0)) ms"
}

t_teardown_error_file_newer_layout() {
    # the newer layout: "message" a plain string, "timestamp" at the top
    cat >w.sh <<'EOS'
#!/bin/sh
if [ "$RANK" = 1 ]; then
    printf '{"message": "ValueError: newer layout", "timestamp": %s}\n' "$(date +%s)" >"$TORCHELASTIC_ERROR_FILE"
    exit 2
fi
sleep 30
EOS
    chmod +x w.sh
    run_launch --nproc_per_node=2 --summary s.json ./w.sh
    expect_eq "$rc" 2
    expect_grep err 'ValueError: newer layout'
    python3 -c 'import json; d=json.load(open("s.json")); assert d["root_cause"]["error_file"]["message"] == "ValueError: newer layout", d["root_cause"]' ||
        fail "summary: $(cat s.json)"
}

t_teardown_error_file_garbage() {
    # an error file that is not JSON: the report still comes, with the exit code
    cat >w.sh <<'EOS'
#!/bin/sh
printf 'this is { not json' >"$TORCHELASTIC_ERROR_FILE"
exit 9
EOS
    chmod +x w.sh
    run_launch --nproc_per_node=1 --summary s.json ./w.sh
    expect_eq "$rc" 9
    expect_grep err 'exitcode +: 9'
    python3 -c 'import json; json.load(open("s.json"))' || fail "summary not JSON: $(cat s.json)"
}

# w_grace.sh: rank 1 fails once rank 0 is ready, noting the moment; rank 0 ignores SIGTERM and
# leaves a child in a session of its own that ignores it too and holds the output pipe.
write_grace_worker() {
    cat >w.sh <<'EOS'
#!/bin/sh
if [ "$RANK" = 1 ]; then
    while [ ! -e ready.0 ]; do sleep 0.01; done
    date +%s%N >failed_at
    exit 3
fi
trap '' TERM
setsid sh -c 'trap "" TERM INT HUP; echo $$ >child.0; exec sleep 1000' &
while [ ! -s child.0 ]; do sleep 0.01; done
touch ready.0
exec sleep 1000
EOS
    chmod +x w.sh
}

t_teardown_kill_on_time_after_grace() {
    # the SIGKILL goes out when the grace period ends, and nothing (a stubborn child that
    # left the session and holds the pipe) keeps the launcher waiting beyond it
    local i t1 took
    write_grace_worker
    for mode in 1 0; do
        for i in 1 2 3; do
            rm -f ready.0 child.0 failed_at
            MGPU_CGROUP=$mode run_launch --nproc_per_node=2 --grace_period=0.5 ./w.sh
            t1=$(date +%s%N)
            expect_eq "$rc" 3 "exit status (MGPU_CGROUP=$mode, run $i)"
            took=$(( (t1 - $(cat failed_at)) / 1000000 ))
            [ "$took" -lt 800 ] ||
                fail "MGPU_CGROUP=$mode run $i: teardown took $took ms with --grace_period=0.5"
            local c; c=$(cat child.0)
            wait_until 5 eval "! alive $c" || fail "MGPU_CGROUP=$mode run $i: the stubborn child $c is alive"
        done
    done
}

t_teardown_stopped_worker_gets_sigcont() {
    # a worker stopped by SIGSTOP (a debugger, Ctrl-Z) gets SIGCONT with its SIGTERM: its
    # handler runs (writes a file) before the SIGKILL, long before the grace period ends
    cat >w.sh <<'EOS'
#!/bin/sh
if [ "$RANK" = 0 ]; then
    trap 'echo handled >term.0; exit 0' TERM
    echo $$ >pid.0
    kill -STOP $$
    while :; do sleep 0.05; done
fi
while [ ! -s pid.0 ] || [ "$(awk '{print $3}' /proc/$(cat pid.0)/stat)" != T ]; do sleep 0.01; done
exit 3
EOS
    chmod +x w.sh
    local t0 t1
    t0=$(now_ms)
    run_launch --nproc_per_node=2 --grace_period=20 ./w.sh
    t1=$(now_ms)
    expect_eq "$rc" 3
    expect_grep term.0 '^handled$'
    [ $((t1 - t0)) -lt 10000 ] || fail "took $((t1 - t0)) ms: the stopped worker waited for the SIGKILL"
}
