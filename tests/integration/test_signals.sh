# test_signals.sh - signals to the launcher reach every worker's process group; a second SIGINT
# kills at once; SIGUSR1/2 are forwarded and the run goes on; --signals_to_handle chooses the
# signals that stop the job; no orphan survives kill -9 of the launcher; what workers leave
# behind is stopped when the launcher exits.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1

now_ms() { echo $(($(date +%s%N) / 1000000)); }
all_exist() { local f; for f; do [ -e "$f" ] || return 1; done; }
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
none_alive() { local p; for p; do alive "$p" && return 1; done; return 0; }
no_marked() { [ -z "$(procs_with_mark "$1" 2>/dev/null)" ]; }

# forward SIG: 3 workers, each with a grandchild in its process group, all record the signal
# and die by it; the launcher gets SIG and must exit 128+SIG with everything gone.
forward() {
    local sig=$1 num; num=$(kill -l "$sig")
    local mark="fwd-$sig-$$-$RANDOM"
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=3 --grace_period=20 "$TW" \
        trap sig.%l INT,TERM,HUP,QUIT,USR1,USR2 spawn pg gc.%l gcsig.%l waitfile gc.%l \
        touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 ready.2 || fail "workers not ready: $(cat err)"
    local t0; t0=$(now_ms)
    kill -"$sig" $lp
    wait $lp; rc=$?
    local t1; t1=$(now_ms)
    expect_eq "$rc" $((128 + num)) "launcher exit status after SIG$sig"
    [ $((t1 - t0)) -lt 10000 ] || fail "SIG$sig: the launcher took $((t1 - t0)) ms to exit"
    for k in 0 1 2; do
        expect_grep sig.$k "^$sig "
        expect_grep gcsig.$k "^$sig "
        [ "$(grep -c . sig.$k)" -eq 1 ] || fail "rank $k got several signals: $(cat sig.$k)"
    done
    wait_until 5 no_marked "$mark" || fail "processes left after SIG$sig: $(procs_with_mark "$mark")"
    expect_grep err "SIG$sig"
}

t_forward_sigint() { forward INT; }
t_forward_sigterm() { forward TERM; }
t_forward_sighup() { forward HUP; }
t_forward_sigquit() { forward QUIT; }

t_forward_second_sigint_kills_at_once() {
    local mark="int2-$$-$RANDOM"
    # workers ignore SIGINT and SIGTERM; grace period 60 s: a second SIGINT must not wait
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=2 --grace_period=60 "$TW" \
        ignore sig.%l INT,TERM spawn pg-stubborn gc.%l gcsig.%l waitfile gc.%l \
        touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready"
    kill -INT $lp
    wait_until 10 all_exist sig.0 sig.1 || fail "the first SIGINT did not reach the workers"
    local t0; t0=$(now_ms)
    kill -INT $lp
    wait $lp; rc=$?
    local t1; t1=$(now_ms)
    expect_eq "$rc" 130 "exit status after two SIGINTs"
    [ $((t1 - t0)) -lt 10000 ] || fail "the second SIGINT took $((t1 - t0)) ms (grace is 60 s)"
    wait_until 5 no_marked "$mark" || fail "processes left after the second SIGINT: $(procs_with_mark "$mark")"
}

t_forward_sigterm_then_grace_kill() {
    # workers ignore the forwarded SIGTERM: SIGKILL after --grace_period, exit 143
    local mark="termg-$$-$RANDOM"
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=2 --grace_period=1 "$TW" \
        ignore sig.%l TERM touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready"
    local t0; t0=$(now_ms)
    kill -TERM $lp
    wait $lp; rc=$?
    local t1; t1=$(now_ms)
    expect_eq "$rc" 143
    [ $((t1 - t0)) -ge 900 ] || fail "exited after $((t1 - t0)) ms, before the grace period"
    [ $((t1 - t0)) -lt 8000 ] || fail "took $((t1 - t0)) ms with --grace_period=1"
    expect_grep sig.0 '^TERM'
    wait_until 5 no_marked "$mark" || fail "processes left: $(procs_with_mark "$mark")"
}

t_forward_usr1_usr2_run_continues() {
    "$LAUNCH" --nproc_per_node=2 "$TW" ignore sig.%l USR1,USR2 spawn pg gc.%l gcsig.%l \
        waitfile gc.%l touch ready.%l waitfile go env e.%l exit 0 >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready"
    kill -USR1 $lp
    wait_until 10 all_exist sig.0 sig.1 || fail "SIGUSR1 did not reach the workers"
    kill -USR2 $lp
    wait_until 10 eval 'grep -q USR2 sig.0 && grep -q USR2 sig.1' || fail "SIGUSR2 did not reach the workers"
    alive $lp || fail "the launcher died of SIGUSR1/SIGUSR2"
    touch go
    wait $lp; rc=$?
    expect_eq "$rc" 0 "exit status after SIGUSR1/2 ($(cat err))"
    for k in 0 1; do
        expect_grep sig.$k '^USR1'
        expect_grep sig.$k '^USR2'
        expect_grep gcsig.$k '^USR1'
        expect_grep gcsig.$k '^USR2'
        [ -e e.$k ] || fail "rank $k did not go on after the signals"
    done
}

t_forward_signal_during_restart_backoff_stops() {
    # a SIGTERM while the group restarts: no new attempt, exit 143
    "$LAUNCH" --nproc_per_node=2 --max_restarts=100 "$TW" trap sig.%l.%a TERM touch ready.%l.%a \
        only 1 waitfile ready.0.%a only 1 exit 3 pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0.2 || fail "no third attempt"
    kill -TERM $lp
    wait $lp; rc=$?
    expect_eq "$rc" 143
}

t_orphans_none_after_kill9() {
    local mark="k9-$$-$RANDOM"
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=4 "$TW" ignore sig.%l TERM,INT,HUP \
        touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 ready.2 ready.3 || fail "workers not ready"
    [ "$(procs_with_mark "$mark" | wc -l)" -ge 5 ] || fail "expected the launcher and 4 workers: $(procs_with_mark "$mark")"
    kill -9 $lp
    wait $lp 2>/dev/null
    wait_until 5 no_marked "$mark" || fail "orphans after kill -9 of the launcher: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,stat,args -p)"
}

t_orphans_grandchildren_after_kill9() {
    # what the workers started in their own process groups (a shell's children, data
    # loaders) goes too, even when it ignores SIGTERM
    local mark="k9g-$$-$RANDOM"
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=2 "$TW" spawn pg-stubborn gc.%l gcsig.%l \
        spawn pg gd.%l gdsig.%l waitfile gc.%l waitfile gd.%l touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready"
    kill -9 $lp
    wait $lp 2>/dev/null
    wait_until 5 no_marked "$mark" || fail "orphans after kill -9 of the launcher: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,stat,args -p)"
}

t_orphans_none_after_kill9_during_startup() {
    # kill -9 at random moments while 8 workers are being started: the race between fork and
    # PR_SET_PDEATHSIG must leave nothing behind
    local i mark pids=() marks=()
    for i in $(seq 1 15); do
        mark="k9s-$$-$i-$RANDOM"
        MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=8 "$TW" pause >/dev/null 2>&1 &
        local lp=$!
        sleep "0.00$((RANDOM % 10))"
        kill -9 $lp
        wait $lp 2>/dev/null
        marks+=("$mark")
    done
    for mark in "${marks[@]}"; do
        wait_until 5 no_marked "$mark" || fail "orphans after kill -9 during startup: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,stat,args -p)"
    done
}

t_leftovers_stopped_when_workers_succeed() {
    # each worker exits 0 leaving a grandchild in its process group and one in a session of
    # its own (setsid); the launcher exits 0 and leaves nothing behind
    local t0 t1
    t0=$(now_ms)
    run_launch --nproc_per_node=2 "$TW" spawn pg gc.%l gcsig.%l spawn setsid gs.%l gssig.%l \
        waitfile gc.%l waitfile gs.%l exit 0
    t1=$(now_ms)
    expect_eq "$rc" 0 "exit status ($(cat err))"
    [ $((t1 - t0)) -lt 10000 ] || fail "took $((t1 - t0)) ms"
    local p
    for p in $(cat gc.0 gc.1 gs.0 gs.1); do
        wait_until 5 eval "! alive $p" || fail "leftover $p still alive after the launcher exited: $(ps -o pid,ppid,pgid,sid,stat,args -p $p)"
    done
}

t_leftovers_stubborn_killed_after_grace() {
    local t0 t1 mark="stub-$$-$RANDOM"
    t0=$(now_ms)
    MGPU_TEST_MARK=$mark run_launch --nproc_per_node=2 --grace_period=1 "$TW" \
        spawn pg-stubborn gc.%l gcsig.%l spawn setsid-stubborn gs.%l gssig.%l \
        waitfile gc.%l waitfile gs.%l exit 0
    t1=$(now_ms)
    expect_eq "$rc" 0 "exit status ($(cat err))"
    [ $((t1 - t0)) -lt 10000 ] || fail "took $((t1 - t0)) ms with --grace_period=1"
    wait_until 5 no_marked "$mark" || fail "leftovers alive: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,sid,stat,args -p)"
}

t_leftovers_after_failure_stopped() {
    local mark="lf-$$-$RANDOM"
    MGPU_TEST_MARK=$mark run_launch --nproc_per_node=2 "$TW" spawn setsid gs.%l gssig.%l \
        waitfile gs.%l touch ready.%l only 1 waitall ready. 2 only 1 exit 3 pause
    expect_eq "$rc" 3
    wait_until 5 no_marked "$mark" || fail "leftovers alive: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,sid,stat,args -p)"
}

t_leftover_holding_pipe_does_not_hang() {
    # a daemonised grandchild that closed nothing keeps the worker's stdout pipe open; the
    # launcher must not wait forever for EOF
    local t0 t1
    t0=$(now_ms)
    run_launch --nproc_per_node=1 --grace_period=1 "$TW" spawn setsid-stubborn gs.%l gssig.%l waitfile gs.%l \
        print "done" exit 0
    t1=$(now_ms)
    expect_eq "$rc" 0
    expect_grep out '^\[rank0\]:done$'
    [ $((t1 - t0)) -lt 10000 ] || fail "took $((t1 - t0)) ms"
    local p; p=$(cat gs.0)
    wait_until 5 eval "! alive $p" || fail "leftover $p alive"
}

t_forward_sigint_workers_exit_0_still_130() {
    # workers that handle SIGINT by exiting 0: the launcher still exits 128+SIGINT, so a
    # wrapping script knows the job was interrupted
    cat >w.sh <<'EOS'
#!/bin/sh
trap 'echo "got INT $RANK" >"$PWD/int.$RANK"; exit 0' INT
touch "$PWD/ready.$RANK"
while :; do sleep 0.05; done
EOS
    chmod +x w.sh
    "$LAUNCH" --nproc_per_node=2 ./w.sh >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready"
    kill -INT $lp
    wait $lp; rc=$?
    expect_eq "$rc" 130 "exit status after SIGINT when the workers exit 0"
    all_exist int.0 int.1 || fail "the workers did not get SIGINT"
}

t_forward_signal_after_some_workers_finished() {
    # rank 0 has already succeeded when SIGTERM arrives: the others are stopped, exit 143
    "$LAUNCH" --nproc_per_node=3 "$TW" only 0 exit 0 trap sig.%l TERM touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.1 ready.2 || fail "workers not ready"
    kill -TERM $lp
    wait $lp; rc=$?
    expect_eq "$rc" 143
    expect_grep sig.1 '^TERM'
    expect_grep sig.2 '^TERM'
}

t_nothing_left_after_normal_exit() {
    # after a normal run nothing of the launcher's is left (helper processes included)
    local mark="norm-$$-$RANDOM"
    MGPU_TEST_MARK=$mark run_launch --nproc_per_node=4 "$TW" exit 0
    expect_eq "$rc" 0
    wait_until 5 no_marked "$mark" || fail "left after a normal exit: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,stat,args -p)"
    MGPU_TEST_MARK=$mark run_launch --nproc_per_node=4 "$TW" only 2 exit 3 pause
    expect_eq "$rc" 3
    wait_until 5 no_marked "$mark" || fail "left after a failed run: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,stat,args -p)"
}

t_forward_terminal_ctrl_c_reaches_workers_once() {
    # a terminal's Ctrl-C goes to the launcher's whole foreground process group; workers are
    # in sessions of their own, so they get SIGINT once, from the launcher
    command -v setsid >/dev/null || skip "setsid not found"
    setsid "$LAUNCH" --nproc_per_node=2 --grace_period=20 "$TW" trap sig.%l INT,TERM touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready"
    local pg; pg=$(awk '{print $5}' /proc/$lp/stat)
    expect_eq "$pg" "$lp" "the launcher leads its process group"
    kill -INT -- -"$pg"
    wait $lp; rc=$?
    expect_eq "$rc" 130
    for k in 0 1; do expect_eq "$(grep -c '^INT' sig.$k)" 1 "SIGINTs received by rank $k"; done
}

t_forward_sigint_to_plain_workers_started_in_background() {
    # a non-interactive shell starts background jobs with SIGINT and SIGQUIT ignored; the
    # workers must not inherit that: a forwarded SIGINT stops plain workers at once
    local t0 t1 mark="bg-$$-$RANDOM"
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=2 --grace_period=30 sleep 60 >out 2>err &
    local lp=$!
    wait_until 20 eval "[ \$(procs_with_mark $mark 2>/dev/null | wc -l) -ge 3 ]" || fail "workers not started"
    sleep 0.2
    t0=$(now_ms)
    kill -INT $lp
    wait $lp; rc=$?
    t1=$(now_ms)
    expect_eq "$rc" 130
    [ $((t1 - t0)) -lt 10000 ] || fail "plain workers ignored the forwarded SIGINT: $((t1 - t0)) ms"
    expect_grep err 'rank 0 .*killed by SIGINT'
    expect_grep err 'rank 1 .*killed by SIGINT'
}

t_signal_during_startup_leaves_nothing() {
    # SIGTERM at random moments while 4 workers start: exit 143, nothing left
    local i mark lp
    for i in $(seq 1 10); do
        mark="st-$$-$i-$RANDOM"
        MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=4 "$TW" pause >out 2>err &
        lp=$!
        sleep "0.0$((RANDOM % 3))$((RANDOM % 10))"
        kill -TERM $lp
        wait $lp; rc=$?
        expect_eq "$rc" 143 "round $i: exit status ($(cat err))"
        wait_until 5 no_marked "$mark" || fail "round $i: left: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,stat,args -p)"
    done
}

# --signals_to_handle: the listed signals stop the job (forwarded first), SIGUSR1/SIGUSR2
# outside the list are passed on, any other signal keeps the launcher's own disposition.

t_signals_to_handle_usr1_stops_the_job() {
    # SIGUSR1 listed: forwarded to every worker, which dies of it (default action), and the
    # job ends as for SIGTERM; SIGUSR2, not listed, is still only passed on
    local mark="stl-$$-$RANDOM"
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=2 --signals-to-handle SIGTERM,SIGUSR1 \
        --summary s.json "$TW" ignore sig.%l USR2 env e.%l touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready: $(cat err)"
    expect_grep e.0 '^TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGUSR1$'
    kill -USR2 $lp
    wait_until 10 all_exist sig.0 sig.1 || fail "SIGUSR2 did not reach the workers"
    alive $lp || fail "the launcher died of SIGUSR2 (not in the list)"
    kill -USR1 $lp
    wait $lp; rc=$?
    expect_eq "$rc" 138 "exit status after SIGUSR1 ($(cat err))"
    expect_grep err 'received SIGUSR1: stopping the workers'
    expect_grep err 'rank 0 .*sent SIGUSR1, exitcode 138 \(killed by SIGUSR1\)'
    expect_grep err 'rank 1 .*sent SIGUSR1, exitcode 138 \(killed by SIGUSR1\)'
    wait_until 5 no_marked "$mark" || fail "processes left: $(procs_with_mark "$mark")"
}

# unlisted CGROUP: SIGHUP, not in the list, is not caught: the launcher dies of it at once,
# its workers with it (never told SIGHUP), and nothing is left; with a cgroup or without.
unlisted() {
    local mark="stu-$1-$$-$RANDOM"
    MGPU_CGROUP=$1 MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=2 --signals_to_handle=SIGTERM \
        --grace_period=30 "$TW" ignore sig.%l HUP,TERM touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready: $(cat err)"
    kill -HUP $lp
    wait $lp; rc=$?
    expect_eq "$rc" 129 "exit status after an unhandled SIGHUP"
    wait_until 5 no_marked "$mark" || fail "processes left: $(procs_with_mark "$mark" | xargs -r ps -o pid,ppid,pgid,stat,args -p)"
    [ ! -e sig.0 ] && [ ! -e sig.1 ] || fail "a worker was sent a signal: $(cat sig.* 2>/dev/null)"
}
t_signals_to_handle_unlisted_ends_the_launcher() { unlisted 1; }
t_signals_to_handle_unlisted_ends_the_launcher_without_cgroup() { unlisted 0; }

t_signals_to_handle_ignored_stays_ignored() {
    # under nohup (SIGHUP ignored) and SIGHUP not listed, the job goes on through a SIGHUP,
    # as the program alone would; the workers inherit the ignored SIGHUP
    ( trap '' HUP; exec "$LAUNCH" --nproc_per_node=2 --signals_to_handle=SIGTERM,SIGINT "$TW" \
        touch ready.%l waitfile go env e.%l exit 0 >out 2>err ) &
    local lp=$!
    wait_until 20 all_exist ready.0 ready.1 || fail "workers not ready: $(cat err)"
    kill -HUP $lp
    sleep 0.2
    alive $lp || fail "the launcher died of an ignored SIGHUP"
    touch go
    wait $lp; rc=$?
    expect_eq "$rc" 0 "exit status ($(cat err))"
    all_exist e.0 e.1 || fail "the workers did not go on"
}

t_signals_to_handle_bad_lists_refused() {
    local bad
    for bad in SIGFOO '' 'SIGTERM,,SIGINT' SIGKILL SIGCHLD sigterm 15; do
        run_launch --signals_to_handle="$bad" "$TW" touch started
        expect_eq "$rc" 2 "exit status for '$bad'"
        expect_grep err "^mgpu-launch: error: --signals_to_handle='$bad': "
        [ "$(wc -l <err)" -eq 1 ] || fail "more than one line for '$bad': $(cat err)"
        [ ! -e started ] || fail "a worker started with --signals_to_handle='$bad'"
    done
    PET_SIGNALS_TO_HANDLE=SIGSTOP run_launch "$TW" touch started
    expect_eq "$rc" 2
    expect_grep err "PET_SIGNALS_TO_HANDLE='SIGSTOP': SIGSTOP cannot be handled \(it cannot be caught\)"
}
