# test_startup.sh - the launcher's own start and stop: MGPU_LAUNCH_TRACE's timeline of its
# phases; workers started side by side and born in the job's cgroup, or forked where clone3 is
# refused, exec failures reported either way; where the run's temporary folder goes; what
# waits until the workers run (the status socket) or is skipped (timelines none wrote).

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC MGPU_CGROUP MGPU_LAUNCH_TRACE
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES
export OMP_NUM_THREADS=1

# trace_rows FILE: the phase rows of the trace tables in FILE ("name took end share mono")
trace_rows() { awk '/^mgpu-launch trace:/ { t = 1; next } t && /^  / && !/^  phase / && $0 !~ /\((point|start)\)/' "$1"; }

t_trace_phases_in_order() {
    MGPU_LAUNCH_TRACE=1 run_launch --nproc_per_node=2 /bin/true
    expect_eq "$rc" 0
    expect_grep err '^mgpu-launch trace: pid [0-9]+, [0-9.]+ ms from main to exit$'
    # the start path's phases come in this order, exit last
    local names prev=0 n w
    names=$(trace_rows err | awk '{ n = $0; sub(/^  /, "", n); sub(/ +[0-9].*$/, "", n); print n }')
    for w in parse plan pages cgroup keeper rendezvous pipes fork exec "status socket" "workers exit" \
        "store stop" exit; do
        n=$(grep -nxF "$w" <<<"$names" | head -1 | cut -d: -f1)
        [ -n "$n" ] || fail "no phase '$w' in: $(cat err)"
        [ "$n" -gt "$prev" ] || fail "phase '$w' comes before the one listed ahead of it: $(cat err)"
        prev=$n
    done
    expect_eq "$(tail -n 1 <<<"$names")" exit "the last phase"
    # numbers: each phase's end is its start plus its length, the ends never go back, and the
    # shares add up to 100%
    trace_rows err | awk '{ n = NF; took = $(n - 3); end = $(n - 2); share = $(n - 1); sub(/%/, "", share)
            d = end - prev - took; if (d < -0.0025 || d > 0.0025 || end < prev) { print "bad row: " $0; bad = 1 }
            prev = end; sum += share }
        END { if (sum < 99 || sum > 101) { print "shares add up to " sum; bad = 1 } exit bad }' ||
        fail "inconsistent table: $(cat err)"
    expect_grep err '^  first exec +\(point\) +[0-9.]+ +[0-9]+$'
}

t_trace_to_a_file_appends() {
    MGPU_LAUNCH_TRACE=$PWD/trace.txt run_launch --nproc_per_node=1 /bin/true
    expect_eq "$rc" 0
    MGPU_LAUNCH_TRACE=$PWD/trace.txt run_launch --nproc_per_node=1 /bin/false
    expect_eq "$rc" 1
    expect_eq "$(grep -c '^mgpu-launch trace:' trace.txt)" 2 "tables in trace.txt"
    ! grep -q 'mgpu-launch trace' err || fail "a trace on stderr too: $(cat err)"
    # a file that cannot be written: said, and the table comes on stderr
    MGPU_LAUNCH_TRACE=$PWD/no/such/dir/trace.txt run_launch --nproc_per_node=1 /bin/true
    expect_eq "$rc" 0
    expect_grep err "MGPU_LAUNCH_TRACE=$PWD/no/such/dir/trace.txt: open: No such file or directory"
    expect_grep err '^mgpu-launch trace: pid'
}

t_trace_off_by_default() {
    run_launch --nproc_per_node=1 /bin/true
    expect_eq "$rc" 0
    ! grep -q 'mgpu-launch trace' err || fail "a trace without MGPU_LAUNCH_TRACE: $(cat err)"
    MGPU_LAUNCH_TRACE=0 run_launch --nproc_per_node=1 /bin/true
    ! grep -q 'mgpu-launch trace' err || fail "a trace with MGPU_LAUNCH_TRACE=0: $(cat err)"
}

# require_cgroup: skips where no cgroup can be made for the job (not root, no delegation)
require_cgroup() {
    MGPU_CGROUP= "$LAUNCH" -v --nproc_per_node=1 /bin/true >out 2>err
    grep -q 'containment: cgroup /' err || skip "no cgroup for the job here: $(grep containment: err)"
}
# require_strace: skips without strace, or where it may not trace (a container without ptrace)
require_strace() {
    command -v strace >/dev/null 2>&1 || skip "no strace (apt-get install strace)"
    strace -f -o /dev/null /bin/true 2>/dev/null || skip "strace cannot trace here"
}
# traced ARGS...: strace ARGS; in the sanitizer build without the leak check, which cannot run
# under ptrace (it would fail the launcher's exit)
traced() { ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 strace "$@"; }

# in_job_cgroup ERR N: the N workers' /proc/self/cgroup (files cg.K) name the job's group
in_job_cgroup() {
    local cg k rel
    cg=$(sed -n 's/.*containment: cgroup //p' "$1")
    [ -n "$cg" ] || fail "no cgroup in: $(cat "$1")"
    for k in $(seq 0 $(($2 - 1))); do
        rel=$(sed -n 's/^0:://p' "cg.$k")
        [ -n "$rel" ] && [[ "$cg" == *"$rel" ]] || fail "local rank $k is in '$rel', not in the job's $cg"
    done
}
CG_WORKER='cat /proc/self/cgroup >cg.$LOCAL_RANK'

# Workers are started side by side (clone3 with CLONE_VM, no copy of the launcher's page tables,
# and no CLONE_VFORK: no wait for one worker's exec before the next starts), with default signal
# handlers where the kernel can (CLONE_CLEAR_SIGHAND, 5.5), and born inside the job's cgroup
# (CLONE_INTO_CGROUP): none moves itself there by writing to cgroup.procs, which waits for an
# RCU grace period, worker after worker. (The store's thread is a clone3 with CLONE_VM too, but
# with CLONE_THREAD and no exit signal.)
SPAWN_RE='clone3\(\{flags=CLONE_VM(\|CLONE_CLEAR_SIGHAND)?(\|CLONE_INTO_CGROUP)?, exit_signal=SIGCHLD'
SPAWN_CG_RE='clone3\(\{flags=CLONE_VM(\|CLONE_CLEAR_SIGHAND)?\|CLONE_INTO_CGROUP, exit_signal=SIGCHLD'
SPAWN_NOCG_RE='clone3\(\{flags=CLONE_VM(\|CLONE_CLEAR_SIGHAND)?, exit_signal=SIGCHLD'
# traced_ff ARGS...: traced -ff -o st ARGS, then every process's calls in st.txt: a file per
# process, so that no call is split around another's ("<unfinished ...>")
traced_ff() {
    rm -f st.[0-9]*
    traced -ff -o st "$@"
    local rc=$?
    cat st.[0-9]* >st.txt
    return $rc
}
t_workers_born_in_the_cgroup() {
    require_cgroup
    require_strace
    traced_ff -e trace=clone3,write "$LAUNCH" -v --nproc_per_node=3 sh -c "$CG_WORKER" \
        >out 2>err || fail "launcher failed: $(cat err)"
    grep -qE "$SPAWN_CG_RE.*= [0-9]" st.txt || ! grep -qE "$SPAWN_RE.*= -1 (ENOSYS|EINVAL)" st.txt ||
        skip "this kernel has no clone3 or no CLONE_INTO_CGROUP (before 5.7)"
    expect_eq "$(grep -cE "$SPAWN_CG_RE.*= [0-9]" st.txt)" 3 \
        "workers started side by side into the cgroup"
    expect_eq "$(grep -c CLONE_VFORK st.txt)" 0 "workers whose exec the launcher waited for"
    expect_eq "$(grep -c 'clone3({flags=CLONE_INTO_CGROUP' st.txt)" 0 "workers forked"
    ! grep -qE 'write\([0-9]+, "0", 1' st.txt ||
        fail "a worker joined by writing cgroup.procs: $(grep -E 'write\([0-9]+, "0", 1' st.txt)"
    in_job_cgroup err 3
}

# Without a cgroup (MGPU_CGROUP=0, or none can be made) the workers are started side by side too.
t_workers_side_by_side_without_cgroup() {
    require_strace
    MGPU_CGROUP=0 traced_ff -e trace=clone,clone3,fork,vfork "$LAUNCH" -v \
        --nproc_per_node=3 "$TW" env e.%l exit 0 >out 2>err || fail "launcher failed: $(cat err)"
    grep -qE "$SPAWN_RE.*= -1 ENOSYS" st.txt && skip "this kernel has no clone3 (before 5.3)"
    expect_eq "$(grep -cE "$SPAWN_NOCG_RE.*= [0-9]" st.txt)" 3 "workers started side by side"
    expect_eq "$(grep -c CLONE_VFORK st.txt)" 0 "workers whose exec the launcher waited for"
    for k in 0 1 2; do grep -qx "LOCAL_RANK=$k" "e.$k" || fail "local rank $k: no environment: $(cat err)"; done
}

# Where the kernel refuses clone3 (before 5.7, or a seccomp filter), each worker is forked and
# joins the group itself, before it execs.
t_workers_join_the_cgroup_without_clone3() {
    require_cgroup
    require_strace
    traced -f -e trace=clone3,write -e inject=clone3:error=ENOSYS -o st.txt "$LAUNCH" -v \
        --nproc_per_node=3 sh -c "$CG_WORKER" >out 2>err || fail "launcher failed: $(cat err)"
    expect_eq "$(grep -cE 'write\([0-9]+, "0", 1' st.txt)" 3 "workers that joined by cgroup.procs"
    in_job_cgroup err 3
}

# A worker whose execve fails reports its errno and exits 127 (not found) or 126 (not
# executable), started side by side or forked (clone3 refused).
t_exec_failure_reported_both_ways() {
    require_strace
    local how inject
    printf '#!/nonexistent/interpreter\n' >badinterp.sh
    printf '#!/bin/sh\n' >noexec.sh
    chmod 755 badinterp.sh
    chmod 644 noexec.sh
    for how in clone fork; do
        inject=
        [ "$how" = fork ] && inject=-einject=clone3:error=ENOSYS
        traced_ff -e trace=clone,clone3 $inject "$LAUNCH" --nproc_per_node=2 ./badinterp.sh \
            >out 2>err
        rc=$?
        expect_eq "$rc" 127 "exit status ($how) for a missing interpreter"
        expect_grep err "could not be executed: './badinterp.sh': its interpreter '/nonexistent/interpreter'.*No such file or directory"
        if [ "$how" = clone ]; then
            grep -qE "$SPAWN_RE.*= -1 ENOSYS" st.txt && skip "this kernel has no clone3 (before 5.3)"
            expect_eq "$(grep -cE "$SPAWN_RE.*= [0-9]" st.txt)" 2 "workers started side by side"
        else
            expect_eq "$(grep -cE "$SPAWN_RE.*= [0-9]" st.txt)" 0 "workers started side by side with clone3 refused"
        fi
        traced -f $inject -o /dev/null "$LAUNCH" --nproc_per_node=2 ./noexec.sh >out 2>err
        rc=$?
        expect_eq "$rc" 126 "exit status ($how) for a file without execute permission"
        expect_grep err "noexec.sh.*Permission denied"
    done
}

# The run's temporary folder: $TMPDIR when set; else in memory when it only holds error files
# ($XDG_RUNTIME_DIR when it is this user's, else /dev/shm when it is a tmpfs); /tmp for logs.
# Removed at exit either way when no worker wrote an error file.
errfile_of() { sed -n 's/^TORCHELASTIC_ERROR_FILE=//p' "$1"; }
# (the folder mgpu/ of $XDG_RUNTIME_DIR holds the status sockets: it stays, empty)
t_run_folder_in_memory() {
    local xdg=$PWD/xdg f
    mkdir -m 700 "$xdg"
    env -u TMPDIR XDG_RUNTIME_DIR="$xdg" "$LAUNCH" --nproc_per_node=2 "$TW" env e.%l exit 0 >out 2>err ||
        fail "launcher failed: $(cat err)"
    f=$(errfile_of e.1)
    case "$f" in "$xdg"/mgpu_none_*/attempt_0/1/error.json) ;; *) fail "error file '$f' not under \$XDG_RUNTIME_DIR" ;; esac
    expect_eq "$(find "$xdg" -mindepth 1 ! -path "$xdg/mgpu")" "" "leftovers in \$XDG_RUNTIME_DIR (its mgpu/ holds status sockets)"
    # without XDG_RUNTIME_DIR (or one that is not a folder of this user's): /dev/shm, a tmpfs
    if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] && [ -w /dev/shm ]; then
        env -u TMPDIR XDG_RUNTIME_DIR=/nonexistent "$LAUNCH" --nproc_per_node=2 "$TW" env e.%l exit 0 \
            >out 2>err || fail "launcher failed: $(cat err)"
        f=$(errfile_of e.0)
        case "$f" in /dev/shm/mgpu_none_*/attempt_0/0/error.json) ;; *) fail "error file '$f' not under /dev/shm" ;; esac
        [ ! -e "${f%/attempt_0/0/error.json}" ] || fail "the run folder ${f%/attempt_0/0/error.json} is left"
    fi
    # a worker's error file keeps the folder, and the report names it
    env -u TMPDIR XDG_RUNTIME_DIR="$xdg" "$LAUNCH" --nproc_per_node=2 "$TW" only 1 errfile "RuntimeError: kept" \
        only 1 exit 1 pause >out 2>err
    f=$(sed -n 's/^ *error_file: //p' err)
    case "$f" in "$xdg"/mgpu_none_*/attempt_0/1/error.json) ;; *) fail "reported error file '$f' not under \$XDG_RUNTIME_DIR: $(cat err)" ;; esac
    [ -f "$f" ] || fail "the error file $f is gone"
}

t_run_folder_with_logs_on_disk() {
    local xdg=$PWD/xdg f
    mkdir -m 700 "$xdg"
    env -u TMPDIR XDG_RUNTIME_DIR="$xdg" "$LAUNCH" --nproc_per_node=1 --tee 3 "$TW" env e.%l exit 0 >out 2>err ||
        fail "launcher failed: $(cat err)"
    f=$(errfile_of e.0)
    case "$f" in /tmp/mgpu_none_*/attempt_0/0/error.json) ;; *) fail "error file '$f' with --tee not under /tmp" ;; esac
    expect_grep err "worker logs are in /tmp/mgpu_none_"
    rm -rf "${f%/attempt_0/0/error.json}"
    expect_eq "$(find "$xdg" -mindepth 1 ! -path "$xdg/mgpu")" "" "leftovers in \$XDG_RUNTIME_DIR (its mgpu/ holds status sockets)"
    # TMPDIR, when set, wins
    mkdir tmp2
    TMPDIR=$PWD/tmp2 XDG_RUNTIME_DIR="$xdg" "$LAUNCH" --nproc_per_node=1 "$TW" env e.%l exit 0 >out 2>err ||
        fail "launcher failed: $(cat err)"
    f=$(errfile_of e.0)
    case "$f" in "$PWD"/tmp2/mgpu_none_*/attempt_0/0/error.json) ;; *) fail "error file '$f' not under \$TMPDIR" ;; esac
}

# The launcher asks the store for each rank's startup timeline only when some worker wrote to
# the store: with none (a program without libmgpu), the requests are as many for 16 workers as
# for 1 (test_timeline.sh checks that published timelines are still read).
t_no_timeline_requests_when_none_published() {
    require_strace
    local n1 n16
    traced -f -e trace=sendto -o st1.txt "$LAUNCH" --nproc_per_node=1 /bin/true >out 2>err ||
        fail "launcher failed: $(cat err)"
    traced -f -e trace=sendto -o st16.txt "$LAUNCH" --nproc_per_node=16 /bin/true >out 2>err ||
        fail "launcher failed: $(cat err)"
    n1=$(grep -c 'sendto(' st1.txt)
    n16=$(grep -c 'sendto(' st16.txt)
    expect_eq "$n16" "$n1" "requests to the store with 16 workers (1 worker: $n1)"
}
