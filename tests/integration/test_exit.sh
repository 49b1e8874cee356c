# test_exit.sh - mgpu-launch's exit status: every worker exit code, deaths by signal, exec
# failures (126/127), and the report that names them.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1

t_exit_codes_all_256_single_worker() {
    local c bad=""
    for c in $(seq 0 255); do
        "$LAUNCH" --nproc_per_node=1 "$TW" exit $c >out 2>err
        rc=$?
        [ "$rc" -eq "$c" ] || bad="$bad $c->$rc"
    done
    [ -z "$bad" ] || fail "worker exit code -> launcher exit status:$bad"
}

t_exit_codes_all_256_one_of_two_fails() {
    # rank 1 exits with the code while rank 0 is still running (and gets stopped): the
    # launcher exits with rank 1's code, never with the stopped rank's 143
    local c bad=""
    "$LAUNCH" --nproc_per_node=2 "$TW" exit 0 >out 2>err
    rc=$?
    [ "$rc" -eq 0 ] || bad=" 0->$rc"
    for c in $(seq 1 255); do
        "$LAUNCH" --nproc_per_node=2 --grace_period=20 "$TW" only 1 exit $c pause >out 2>err
        rc=$?
        [ "$rc" -eq "$c" ] || bad="$bad $c->$rc"
    done
    [ -z "$bad" ] || fail "rank 1's exit code -> launcher exit status:$bad"
}

t_exit_code_reported() {
    run_launch --nproc_per_node=2 --summary s.json "$TW" only 1 eprint "last words of rank %r" only 1 exit 3 pause
    expect_eq "$rc" 3
    expect_grep err 'FAILED'
    expect_grep err 'Root Cause'
    expect_grep err 'rank +: 1 \(local_rank: 1\)'
    expect_grep err 'exitcode +: 3 '
    expect_grep err 'last words of rank 1'
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["exit_code"] == 3 and d["result"] == "failed", d
rc = d["root_cause"]
assert rc["rank"] == 1 and rc["exit_code"] == 3 and rc["signal"] is None, rc
assert any("last words of rank 1" in l for l in rc.get("stderr_tail", [])), rc
EOF
}

# die_by SIGNAME: one worker sends itself the signal; exit 128+N and the report names it
die_by() {
    local name=$1 num; num=$(kill -l "$name")
    run_launch --nproc_per_node=1 --summary s.json "$TW" raise "$name"
    expect_eq "$rc" $((128 + num)) "exit status after SIG$name"
    expect_grep err "SIG$name"
    expect_grep err "Signal $num \(SIG$name\)|killed by SIG$name"
    python3 - s.json "$name" <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["root_cause"]["signal"] in (sys.argv[2], "SIG" + sys.argv[2]), d["root_cause"]
EOF
    # and with two workers where the other is still running
    run_launch --nproc_per_node=2 --grace_period=20 "$TW" only 0 raise "$name" pause
    expect_eq "$rc" $((128 + num)) "exit status after SIG$name (2 workers)"
    expect_grep err "SIG$name"
    expect_grep err 'rank +: 0 \(local_rank: 0\)'
}

t_exit_signal_segv() { die_by SEGV; }
t_exit_signal_kill() { die_by KILL; }
t_exit_signal_abrt() { die_by ABRT; }
t_exit_signal_term_sent_to_itself() { die_by TERM; }
t_exit_signal_int_sent_to_itself() { die_by INT; }
t_exit_signal_bus() { die_by BUS; }

t_exit_real_segfault() {
    run_launch --nproc_per_node=2 "$TW" only 1 segv pause
    expect_eq "$rc" 139
    expect_grep err 'SIGSEGV'
}

t_exec_not_executable_126() {
    printf '#!/bin/sh\necho hi\n' >noexec.sh
    chmod 644 noexec.sh
    run_launch --nproc_per_node=2 ./noexec.sh
    expect_eq "$rc" 126 "exit status for a file without execute permission"
    expect_grep err 'Permission denied'
    expect_grep err 'noexec.sh'
}

t_exec_directory_126() {
    mkdir adir
    run_launch --nproc_per_node=1 ./adir
    expect_eq "$rc" 126 "exit status for a directory"
    expect_grep err 'Permission denied|directory'
}

t_exec_missing_interpreter_127() {
    printf '#!/nonexistent/interpreter\necho hi\n' >badshebang.sh
    chmod 755 badshebang.sh
    run_launch --nproc_per_node=2 ./badshebang.sh
    expect_eq "$rc" 127 "exit status for a script whose interpreter is missing"
    expect_grep err 'badshebang.sh'
    # the reason: the file exists, its interpreter does not - say which
    expect_grep err '/nonexistent/interpreter'
}

t_exec_bad_binary_format_126() {
    printf '\177ELF garbage that is not a program\n' >garbage
    chmod 755 garbage
    run_launch --nproc_per_node=1 ./garbage
    expect_eq "$rc" 126 "exit status for a file that is not a program"
    expect_grep err 'Exec format error'
}

t_exec_program_does_not_exist() {
    run_launch --nproc_per_node=2 ./no-such-program --flag
    expect_eq "$rc" 2
    expect_grep err 'no-such-program'
    expect_eq "$(wc -l <err)" 1 "message lines"
    run_launch --nproc_per_node=2 no-such-program-in-path-xyz
    expect_eq "$rc" 2
    expect_grep err 'no-such-program-in-path-xyz'
    run_launch --nproc_per_node=2 /nonexistent/dir/prog
    expect_eq "$rc" 2
    expect_grep err '/nonexistent/dir/prog'
    # a missing .py script and a missing .cfg
    PYTHON_EXEC=/bin/sh run_launch --nproc_per_node=1 missing_script.py
    expect_eq "$rc" 2
    expect_grep err 'missing_script.py'
}

t_exit_success_no_report() {
    run_launch --nproc_per_node=4 "$TW" exit 0
    expect_eq "$rc" 0
    expect_eq "$(cat err)" "" "stderr of a successful run"
    expect_eq "$(cat out)" "" "stdout of a successful run"
}

t_exit_early_success_waits_for_others() {
    # torchrun: a worker that exits 0 early is done; the launcher waits for the others
    run_launch --nproc_per_node=2 "$TW" only 1 sleep 1 only 1 touch late.%r exit 0
    expect_eq "$rc" 0
    [ -e late.1 ] || fail "the launcher did not wait for rank 1"
}

t_exit_late_failure_after_success() {
    # rank 0 succeeds at once, rank 1 fails later: exit with rank 1's code
    run_launch --nproc_per_node=2 "$TW" only 1 sleep 0.3 only 1 exit 9 exit 0
    expect_eq "$rc" 9
}

t_exit_many_workers() {
    run_launch --nproc_per_node=256 "$TW" exit 0
    expect_eq "$rc" 0 "256 workers ($(tail -n 3 err))"
    run_launch --nproc_per_node=128 "$TW" only 77 exit 5 pause
    expect_eq "$rc" 5 "128 workers, one fails"
}

t_exit_program_from_path() {
    mkdir bin
    cp "$TW" bin/my-worker-prog
    PATH=$PWD/bin:$PATH run_launch --nproc_per_node=2 my-worker-prog env e.%l touch r.%l waitall r. 2 exit 4
    expect_eq "$rc" 4
    [ -e e.1 ] || fail "my-worker-prog from PATH did not run"
}

t_exit_launcher_with_closed_stdout() {
    # started with stdout and stderr closed (cron, careless wrappers): runs, exits right
    "$LAUNCH" --nproc_per_node=2 "$TW" print hello env e.%l exit 0 >&- 2>&-
    rc=$?
    expect_eq "$rc" 0
    [ -e e.1 ] || fail "workers did not run"
    "$LAUNCH" --nproc_per_node=2 "$TW" print hello only 1 exit 6 pause >&- 2>&-
    rc=$?
    expect_eq "$rc" 6
}

t_worker_fds_no_launcher_leak() {
    # workers get 0, 1, 2 and nothing of the launcher's own (its pipes, sockets, store,
    # helper processes' pipes): compared with what a program started by this shell gets
    "$TW" fds base </dev/null
    run_launch --nproc_per_node=3 --max_restarts=1 "$TW" fds w.%l.%a touch r.%a.%l waitall r.%a. 3 fail_until 1 3 exit 0 </dev/null
    expect_eq "$rc" 0
    local f fd
    for f in w.0.0 w.2.0 w.0.1 w.2.1; do
        [ -f $f ] || fail "no $f"
        grep -q '^1 -> pipe:' $f || fail "$f: stdout is not a pipe: $(cat $f)"
        grep -q '^2 -> pipe:' $f || fail "$f: stderr is not a pipe: $(cat $f)"
        for fd in $(awk '$1 > 2 { print $1 }' $f); do
            grep -qxF "$(grep "^$fd -> " $f)" base ||
                fail "$f: descriptor $fd ($(grep "^$fd -> " $f)) comes from the launcher, not from its caller; all: $(cat $f)"
        done
    done
}

t_worker_fds_inherited_closed_like_torchrun() {
    # torchrun starts workers with Popen(close_fds=True): descriptors of the launcher's caller
    # (a wrapper's pipe on fd 7 here) do not reach the workers
    run_launch --nproc_per_node=2 "$TW" fds w.%l 7>held </dev/null
    expect_eq "$rc" 0
    local extra; extra=$(awk '$1 > 2' w.0)
    [ -z "$extra" ] || fail "descriptors beyond 0-2 reached the worker: $extra"
}

t_worker_own_session_and_group() {
    run_launch --nproc_per_node=2 "$TW" ids i.%l
    expect_eq "$rc" 0
    local pid pgid sid ppid
    for k in 0 1; do
        read -r pid pgid sid ppid <i.$k
        expect_eq "$pgid" "$pid" "rank $k process group"
        expect_eq "$sid" "$pid" "rank $k session"
    done
}

t_exit_success_silent_with_common_fd_limit() {
    # ulimit -n 1024 is the usual default soft limit: a plain successful run prints nothing
    ( ulimit -Sn 1024 && "$LAUNCH" --nproc_per_node=4 "$TW" exit 0 >out 2>err ); rc=$?
    expect_eq "$rc" 0
    expect_eq "$(cat err)" "" "stderr of a successful run under ulimit -n 1024"
}

t_fd_table_grown_before_threads() {
    # Linux waits for an RCU grace period (20-30 ms on a 16-core host) each time a threaded
    # process's file table grows; the launcher grows it once before its store thread starts,
    # past what 16 workers' pipes need, so starting them never waits for it.
    run_launch --nproc_per_node=16 sh -c 'grep FDSize "/proc/$PPID/status" | tr -dc 0-9 >fds.$LOCAL_RANK'
    expect_eq "$rc" 0
    local n
    n=$(cat fds.0)
    [ "$n" -ge 256 ] || fail "launcher's file table holds $n entries, expected >= 256"
    # and where the soft limit is lower than that, it is respected (no error, no message)
    ( ulimit -Sn 100 && "$LAUNCH" --nproc_per_node=2 "$TW" exit 0 >out 2>err ); rc=$?
    expect_eq "$rc" 0
    expect_eq "$(cat err)" "" "stderr under ulimit -n 100"
}
