# test_containment.sh - nothing a job started outlives it: workers start grandchildren that
# leave their session (setsid), daemonize (double fork), move to a process group of their own,
# ignore SIGTERM or clear their environment; then the launcher is killed with SIGKILL, its whole
# process group is, or a worker fails. Leftovers are found by a marker in argv
# (`sleep 1000.<run>`), which an environment-clearing child keeps. Both modes: a cgroup of the
# job's own (where one can be made: as root, or delegated) and the forced fallback
# (MGPU_CGROUP=0: the launcher's keeper, in a session of its own, is the subreaper of
# everything the job starts). No file is left either: the runs have a TMPDIR and a status
# socket folder of their own, and only what a worker wrote there may stay.
#
# CONTAIN_RUNS (default 20) runs of each kind and mode; tests/containment_stats.sh runs more
# and counts what is left.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC MGPU_CGROUP
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1

CONTAIN_RUNS=${CONTAIN_RUNS:-20}

# pids of live processes whose argv carries the run's marker (a zombie has no argv)
marked() { pgrep -f -- "1000\.$1( |\$)"; }
none_marked() { [ -z "$(marked "$1")" ]; }
all_exist() { local f; for f; do [ -e "$f" ] || return 1; done; }

# A TMPDIR and a status socket folder (XDG_RUNTIME_DIR/mgpu) of the test's own, under the
# current folder, emptied: what a launcher leaves there is found by files_left.
private_dirs() {
    export TMPDIR=$PWD/tmp XDG_RUNTIME_DIR=$PWD/xdg
    mkdir -p "$TMPDIR" "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
    rm -rf "${TMPDIR:?}"/* "${XDG_RUNTIME_DIR:?}"/mgpu/*
}
# What is left there but workers' error files (error.json) and the folders that hold them.
files_left() {
    find "$TMPDIR" "$XDG_RUNTIME_DIR" -mindepth 1 \
        \( -type d -empty ! -path "$XDG_RUNTIME_DIR/mgpu" -o ! -type d ! -name error.json \)
}
no_files_left() { [ -z "$(files_left)" ]; }

# The worker: starts the grandchildren named in $KINDS, writes its error file (rank
# ERRFILE_RANK), says it is ready, then fails (rank 1 when FAIL_RANK=1) or waits, ignoring
# SIGTERM when STUBBORN_WORKER=1.
write_worker() {
    cat >w.sh <<'EOS'
#!/bin/sh
m=$1
for k in $KINDS; do
    case $k in
    pg) sh -c 'trap "" TERM INT HUP; exec sleep "$0"' "1000.$m" & ;;
    setsid) setsid sleep "1000.$m" & ;;
    daemon) (setsid sh -c "sleep 1000.$m &" &) ;;
    ownpg) perl -e 'setpgrp(0, 0); exec @ARGV' sleep "1000.$m" & ;;
    stubborn) setsid sh -c 'trap "" TERM INT HUP; exec sleep "$0"' "1000.$m" & ;;
    envclear) setsid env -i /bin/sh -c 'trap "" TERM; exec /bin/sleep "$0"' "1000.$m" & ;;
    esac
done
[ "$STUBBORN_WORKER" = 1 ] && trap '' TERM
[ "$RANK" = "$ERRFILE_RANK" ] && echo '{"message": "written before the end"}' >"$TORCHELASTIC_ERROR_FILE"
touch "ready.$RANK"
if [ "$RANK" = "$FAIL_RANK" ]; then
    while [ "$(ls ready.* | wc -l)" -lt "$NPROC" ]; do sleep 0.01; done
    exit 3
fi
exec sleep "1000.$m"
EOS
    chmod +x w.sh
}

ALL_KINDS="pg setsid daemon ownpg stubborn envclear"

# a random non-empty subset of the kinds
random_kinds() {
    local k out=""
    for k in $ALL_KINDS; do [ $((RANDOM % 2)) -eq 0 ] && out="$out $k"; done
    [ -n "$out" ] || out=" ${ALL_KINDS##* }"
    echo "$out"
}

# one_run MODE EVENT I: starts a job (with expiration timers: their FIFO is one more file),
# waits until its grandchildren are up, ends it by EVENT (kill9: the launcher; kill9pg: the
# launcher's process group; fail: a worker fails), then waits up to CONTAIN_WAIT (10) s for
# every marked process to go, and for the files. LEFT gets what is still there (pids), FILES
# the files left (files_left), and more when the error file a worker wrote (one rank at
# random, or none, when the launcher is killed) is gone; DESC the run in words.
one_run() {
    local mode=$1 event=$2 i=$3 m="$$$i$RANDOM" lp nproc=$((2 + RANDOM % 2)) errfile_rank=-1
    local kinds; kinds=$(random_kinds)
    [ "$event" = fail ] || errfile_rank=$((RANDOM % (nproc + 1) - 1))
    DESC="run $i ($mode $event, kinds:$kinds, error file of rank $errfile_rank)"
    rm -f ready.*
    private_dirs
    (
        [ "$mode" = fallback ] && export MGPU_CGROUP=0
        export KINDS="$kinds" NPROC=$nproc STUBBORN_WORKER=$((RANDOM % 2))
        export TORCHELASTIC_ENABLE_FILE_TIMER=1 ERRFILE_RANK=$errfile_rank
        [ "$event" = fail ] && export FAIL_RANK=1
        # its own process group, as a shell's job or `timeout` would give it
        exec setsid "$LAUNCH" --nproc_per_node=$nproc --grace_period=0.5 ./w.sh "$m" >out 2>err
    ) &
    lp=$!
    wait_until 20 all_exist $(seq -f 'ready.%g' 0 $((nproc - 1))) ||
        { kill -9 $lp; fail "$DESC: workers not ready: $(cat err)"; }
    # the grandchildren are started in the background: end the job at a random moment
    sleep "0.0$((RANDOM % 5))$((RANDOM % 10))"
    case $event in
    kill9) kill -9 $lp ;;
    kill9pg) kill -9 -- -"$lp" ;;
    fail) ;;
    esac
    wait $lp 2>/dev/null
    wait_until "${CONTAIN_WAIT:-10}" none_marked "$m"
    LEFT=$(marked "$m" | tr '\n' ' ')
    [ "$event" != fail ] || grep -q 'exitcode *: 3' err || fail "$DESC: no failure reported: $(cat err)"
    wait_until "${CONTAIN_WAIT:-10}" no_files_left
    FILES=$(files_left)
    [ "$errfile_rank" -lt 0 ] || [ -f "$(echo "$TMPDIR"/mgpu_*/attempt_0/"$errfile_rank"/error.json)" ] ||
        FILES="$FILES (and rank $errfile_rank's error file is gone: $(find "$TMPDIR"))"
}

require_cgroup() {
    MGPU_CGROUP= "$LAUNCH" -v --nproc_per_node=1 /bin/true >out 2>err
    grep -q 'containment: cgroup /' err ||
        skip "no cgroup for the job here: $(grep containment: err)"
}

runs() {
    local mode=$1 event=$2 i
    write_worker
    for i in $(seq 1 "$CONTAIN_RUNS"); do
        one_run "$mode" "$event" "$i"
        [ -z "$LEFT" ] || fail "$DESC: left: $(ps -o pid,ppid,pgid,sid,stat,args -p "$(echo $LEFT | tr ' ' ,)")"
        [ -z "$FILES" ] || fail "$DESC: files left: $FILES"
    done
}

t_containment_says_mode() {
    MGPU_CGROUP=0 run_launch -v --nproc_per_node=1 /bin/true
    expect_grep err 'containment: subreaper keeper \(no cgroup: MGPU_CGROUP=0\)'
    MGPU_CGROUP=/nonexistent/parent run_launch -v --nproc_per_node=1 /bin/true
    expect_eq "$rc" 0
    expect_grep err 'containment: subreaper keeper \(no cgroup: .*/nonexistent/parent/cgroup.procs'
    MGPU_CGROUP=maybe run_launch --nproc_per_node=1 /bin/true
    expect_eq "$rc" 2 "exit status with MGPU_CGROUP=maybe"
    expect_grep err 'MGPU_CGROUP=maybe: expected 1'
}

t_containment_cgroup_removed() {
    require_cgroup
    local cg; cg=$(sed -n 's/.*containment: cgroup //p' err)
    [ -n "$cg" ] || fail "no cgroup path in: $(cat err)"
    [ ! -e "$cg" ] || fail "the job's cgroup $cg is still there"
    # after a kill -9 of the launcher the keeper removes it
    write_worker
    KINDS="setsid" NPROC=1 "$LAUNCH" -v --nproc_per_node=1 ./w.sh "$$$RANDOM" >out 2>err &
    local lp=$!
    wait_until 20 all_exist ready.0 || fail "worker not ready"
    cg=$(sed -n 's/.*containment: cgroup //p' err)
    [ -d "$cg" ] || fail "no cgroup $cg while the job runs: $(cat err)"
    kill -9 $lp
    wait_until 10 eval "[ ! -e '$cg' ]" || fail "the job's cgroup $cg is left after kill -9: $(cat "$cg/cgroup.procs")"
}

t_containment_cgroup_kill9() { require_cgroup; runs cgroup kill9; }
t_containment_cgroup_kill9_group() { require_cgroup; runs cgroup kill9pg; }
t_containment_cgroup_failure() { require_cgroup; runs cgroup fail; }
t_containment_fallback_failure() { runs fallback fail; }
# Without a cgroup, a launcher killed by SIGKILL leaves the keeper, the subreaper of every
# worker, to kill what they started, wherever it went (another session, a daemon), even when
# the whole launcher's group was killed (the keeper has a session of its own).
t_containment_fallback_kill9() { runs fallback kill9; }
t_containment_fallback_kill9_group() { runs fallback kill9pg; }

# kill_in_report MODE: the launcher is killed once its workers are gone, while it writes its
# report (it waits there to read a worker's error file that is a FIFO): the keeper, told that
# the job ended, must still remove the launcher's files, and keep the worker's.
kill_in_report() {
    local lp
    private_dirs
    cat >fifo.sh <<'EOS'
#!/bin/sh
[ "$RANK" = 1 ] && mkfifo "$TORCHELASTIC_ERROR_FILE" && exit 3
exec sleep 1000
EOS
    chmod +x fifo.sh
    (
        [ "$1" = fallback ] && export MGPU_CGROUP=0
        exec "$LAUNCH" --nproc_per_node=3 --grace_period=0.5 ./fifo.sh >out 2>err
    ) &
    lp=$!
    wait_until 20 grep -q 'Root Cause' err || { kill -9 $lp; fail "no report: $(cat err)"; }
    sleep 0.2
    kill -0 $lp || fail "the launcher did not wait in its report: $(cat err)"
    kill -9 $lp
    wait_until 10 no_files_left || fail "files left: $(files_left)"
    [ -p "$(echo "$TMPDIR"/mgpu_*/attempt_0/1/error.json)" ] || fail "the worker's FIFO is gone: $(find "$TMPDIR")"
}
t_containment_cgroup_kill9_in_report() { require_cgroup; kill_in_report cgroup; }
t_containment_fallback_kill9_in_report() { kill_in_report fallback; }

# Without a cgroup, the launcher that runs the job (the keeper's child) killed alone: the pid
# the caller sees exits with 128+9, and nothing is left, processes or files.
t_containment_fallback_kill9_job() {
    local m="$$$RANDOM" lp keeper sup
    write_worker
    private_dirs
    rm -f ready.*
    MGPU_CGROUP=0 TORCHELASTIC_ENABLE_FILE_TIMER=1 ERRFILE_RANK=0 KINDS="setsid daemon" NPROC=2 \
        "$LAUNCH" --nproc_per_node=2 ./w.sh "$m" >out 2>err &
    lp=$!
    wait_until 20 all_exist ready.0 ready.1 || { kill -9 $lp; fail "workers not ready: $(cat err)"; }
    keeper=$(pgrep -P "$lp")
    sup=$(pgrep -P "$keeper")
    [ -n "$sup" ] || { kill -9 $lp; fail "no launcher under the keeper $keeper"; }
    kill -9 "$sup"
    wait $lp
    expect_eq "$?" 137 "exit status after SIGKILL of the launcher that runs the job"
    wait_until 10 none_marked "$m" || fail "left: $(marked "$m")"
    wait_until 10 no_files_left || fail "files left: $(files_left)"
    [ -f "$(echo "$TMPDIR"/mgpu_*/attempt_0/0/error.json)" ] || fail "rank 0's error file is gone: $(find "$TMPDIR")"
}

# The pid the caller sees stays in the caller's process group and exits with the job's
# status; the keeper and the launcher that runs the job are in a session of their own.
t_containment_fallback_processes() {
    write_worker
    local m="$$$RANDOM" lp
    rm -f ready.*
    (
        export MGPU_CGROUP=0 KINDS="" NPROC=1
        exec setsid "$LAUNCH" --nproc_per_node=1 ./w.sh "$m" >out 2>err
    ) &
    lp=$!
    wait_until 20 all_exist ready.0 || { kill -9 $lp; fail "worker not ready: $(cat err)"; }
    local keeper sup
    keeper=$(pgrep -P "$lp")
    [ "$(wc -w <<<"$keeper")" = 1 ] || fail "expected one child of the launcher, got: $keeper"
    expect_eq "$(cat /proc/"$keeper"/comm)" mgpu-keeper "the launcher's child"
    expect_eq "$(ps -o sid= -p "$keeper" | tr -d ' ')" "$keeper" "the keeper's session"
    sup=$(pgrep -P "$keeper")
    [ -n "$sup" ] || fail "the keeper has no child"
    expect_eq "$(ps -o pgid= -p "$lp" | tr -d ' ')" "$lp" "the launcher's process group"
    # a signal to the pid the caller sees reaches the job: the worker is stopped, 128+15
    kill -TERM $lp
    wait $lp
    expect_eq "$?" 143 "exit status after SIGTERM"
    wait_until 5 none_marked "$m" || fail "left after SIGTERM: $(marked "$m")"
    [ ! -e /proc/"$keeper" ] || fail "the keeper $keeper outlived the launcher"
}

# Without a cgroup, the signals a terminal, `kill` or a scheduler send to the pid the caller
# sees reach the job as they do with one: 128+signal, nothing left.
t_containment_fallback_signals() {
    write_worker
    local sig m lp
    for sig in INT TERM HUP QUIT; do
        m="$$$RANDOM"
        rm -f ready.*
        MGPU_CGROUP=0 KINDS="setsid" NPROC=2 "$LAUNCH" --nproc_per_node=2 ./w.sh "$m" >out 2>err &
        lp=$!
        wait_until 20 all_exist ready.0 ready.1 || { kill -9 $lp; fail "SIG$sig: workers not ready: $(cat err)"; }
        kill -"$sig" $lp
        wait $lp
        expect_eq "$?" $((128 + $(kill -l "$sig"))) "exit status after SIG$sig"
        wait_until 5 none_marked "$m" || fail "left after SIG$sig: $(marked "$m")"
    done
}
