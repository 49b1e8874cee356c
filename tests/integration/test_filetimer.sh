# test_filetimer.sh - torchrun's expiration timers: with TORCHELASTIC_ENABLE_FILE_TIMER=1 the
# launcher serves PyTorch's file-based timer protocol (a FIFO of JSON requests named by
# TORCHELASTIC_TIMER_FILE); an expired scope's process gets the requested signal and is named.
# The PyTorch cases use Debian's torch 1.13 (/usr/bin/python3), as test_torch.sh does; the
# protocol's edge cases use shell workers that write the requests themselves.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1

# expires.py SLEEP_OF_RANK1 [SIGNAL]: every rank holds a 1 s scope around its sleep (rank 1
# sleeps SLEEP_OF_RANK1 seconds, the others 0.1 s).
write_job() {
    cat >expires.py <<'EOF'
import os, signal, sys, time
import torch.distributed.elastic.timer as timer

sig = getattr(signal, sys.argv[2]) if len(sys.argv) > 2 else signal.SIGKILL
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=sig))
rank = int(os.environ["RANK"])
with timer.expires(after=1, scope="data_loading"):
    time.sleep(float(sys.argv[1]) if rank == 1 else 0.1)
print(f"rank {rank} done", flush=True)
EOF
}

t_filetimer_expired_scope_is_killed_and_named() {
    need_torch 'import torch.distributed.elastic.timer as t; t.FileTimerClient'
    write_job
    local t0=$SECONDS
    TMPDIR=$TEST_TMP TORCHELASTIC_ENABLE_FILE_TIMER=1 PYTHON_EXEC=$PY \
        run_launch --nproc_per_node=3 expires.py 30
    expect_eq "$rc" 137 "exit status (SIGKILL of rank 1) ($(tail -n 30 err))"
    # killed at its 1 s expiry, long before its 30 s sleep ends (startup included)
    [ $((SECONDS - t0)) -lt 20 ] || fail "took $((SECONDS - t0)) s"
    expect_grep err "timer: rank 1 \(local 1, pid [0-9]+\) scope 'data_loading' expired after [12]\.[0-9] s; sent SIGKILL"
    # and the failure report says why the rank died
    expect_grep err "^  note      : timer: rank 1 \(local 1, pid [0-9]+\) scope 'data_loading'"
    expect_grep out "^\[rank0\]:rank 0 done$"
    expect_no_grep out "rank 1 done"
    # the FIFO and its private folder are gone with the launcher
    [ -z "$(ls -d "$TEST_TMP"/mgpu-timer-* 2>/dev/null)" ] || fail "timer folder left behind"
}

t_filetimer_requested_signal() {
    need_torch 'import torch.distributed.elastic.timer as t; t.FileTimerClient'
    write_job
    TORCHELASTIC_ENABLE_FILE_TIMER=1 PYTHON_EXEC=$PY \
        run_launch --nproc_per_node=2 expires.py 30 SIGTERM
    expect_eq "$rc" 143 "exit status (SIGTERM of rank 1) ($(tail -n 30 err))"
    expect_grep err "timer: rank 1 \(local 1, pid [0-9]+\) scope 'data_loading' expired after [12]\.[0-9] s; sent SIGTERM"
}

t_filetimer_released_in_time_kills_nothing() {
    need_torch 'import torch.distributed.elastic.timer as t; t.FileTimerClient'
    write_job
    TORCHELASTIC_ENABLE_FILE_TIMER=1 PYTHON_EXEC=$PY \
        run_launch --nproc_per_node=2 expires.py 0.1
    expect_eq "$rc" 0 "exit status ($(tail -n 30 err))"
    expect_no_grep err "timer:"
    expect_grep out "^\[rank1\]:rank 1 done$"
}

# A shell worker that writes the requests itself.
t_filetimer_malformed_requests_are_ignored() {
    cat >w.sh <<'EOF'
f=$TORCHELASTIC_TIMER_FILE
[ -p "$f" ] || { echo "no FIFO at '$f'" >&2; exit 9; }
{
    echo 'not json'
    echo '[1, 2]'
    echo '{"pid": "x", "scope_id": "a", "expiration_time": 1, "signal": 9}'
    echo "{\"pid\": $$, \"scope_id\": 7, \"expiration_time\": 1, \"signal\": 9}"
    echo "{\"pid\": $$, \"scope_id\": \"a\", \"expiration_time\": \"soon\", \"signal\": 9}"
    echo "{\"pid\": $$, \"scope_id\": \"a\", \"expiration_time\": 1, \"signal\": 99}"
    printf '{"pad": "%05000d"}\n' 0
} >"$f"
# a scope acquired and released in time, after all that
now=$(date +%s)
echo "{\"version\": 1, \"pid\": $$, \"scope_id\": \"s\", \"expiration_time\": $((now + 2)), \"signal\": 9}" >"$f"
sleep 0.5
echo "{\"version\": 1, \"pid\": $$, \"scope_id\": \"s\", \"expiration_time\": -1, \"signal\": 0}" >"$f"
sleep 3
echo survived
EOF
    TORCHELASTIC_ENABLE_FILE_TIMER=1 run_launch --nproc_per_node=1 /bin/bash w.sh
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep out "^\[rank0\]:survived$"
    expect_eq "$(grep -c 'timer: ignoring a malformed request' err)" 6 "malformed requests warned"
    expect_grep err "timer: ignoring a request longer than 4096 bytes"
    expect_no_grep err "expired"
}

t_filetimer_only_processes_of_the_job() {
    # An expired scope of a process outside the job is reported, never signalled; one of a
    # worker's descendants is signalled and named by its worker's rank.
    sleep 60 &
    local outsider=$!
    cat >w.sh <<EOF
f=\$TORCHELASTIC_TIMER_FILE
now=\$(date +%s)
echo "{\"pid\": $outsider, \"scope_id\": \"other\", \"expiration_time\": \$now, \"signal\": 9}" >"\$f"
sleep 60 &
child=\$!
echo "{\"pid\": \$child, \"scope_id\": \"child\", \"expiration_time\": \$now, \"signal\": 15}" >"\$f"
wait \$child
echo "child ended: \$?"
EOF
    TORCHELASTIC_ENABLE_FILE_TIMER=1 run_launch --nproc_per_node=1 /bin/bash w.sh
    kill -0 $outsider || fail "the outside process was signalled"
    kill $outsider
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep err "timer: scope 'other' of pid $outsider expired, but pid $outsider is not a process of this job: not signalled"
    expect_grep err "timer: rank 0 \(local 0, pid [0-9]+\) scope 'child' expired after [0-9.]+ s; sent SIGTERM"
    expect_grep out "child ended: 143"
}

t_filetimer_off_without_the_variable() {
    cat >w.sh <<'EOF'
echo "file=${TORCHELASTIC_TIMER_FILE-<unset>}"
EOF
    run_launch --nproc_per_node=1 /bin/bash w.sh
    expect_eq "$rc" 0
    expect_grep out "^\[rank0\]:file=<unset>$"
    TORCHELASTIC_ENABLE_FILE_TIMER=0 run_launch --nproc_per_node=1 /bin/bash w.sh
    expect_grep out "^\[rank0\]:file=<unset>$"
}

t_filetimer_user_path() {
    # torchrun's TORCHELASTIC_TIMER_FILE, when set, names the FIFO; it is removed at the end.
    cat >w.sh <<'EOF'
[ -p "$TORCHELASTIC_TIMER_FILE" ] && echo "fifo=$TORCHELASTIC_TIMER_FILE"
EOF
    TORCHELASTIC_ENABLE_FILE_TIMER=1 TORCHELASTIC_TIMER_FILE=$TEST_TMP/my.fifo \
        run_launch --nproc_per_node=1 /bin/bash w.sh
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep out "^\[rank0\]:fifo=$TEST_TMP/my.fifo$"
    [ ! -e my.fifo ] || fail "the FIFO was left behind"
    # a path that holds something else is refused, and left alone
    echo keep >my.fifo
    TORCHELASTIC_ENABLE_FILE_TIMER=1 TORCHELASTIC_TIMER_FILE=$TEST_TMP/my.fifo \
        run_launch --nproc_per_node=1 /bin/bash w.sh
    [ "$rc" -ne 0 ] || fail "a regular file taken for the FIFO"
    expect_grep err "TORCHELASTIC_TIMER_FILE=$TEST_TMP/my.fifo: exists and is not a FIFO"
    expect_eq "$(cat my.fifo)" keep
}
