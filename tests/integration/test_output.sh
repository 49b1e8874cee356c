# test_output.sh - worker output through the launcher: whole lines, exactly once, in order per
# rank, prefixed; partial writes; lines without a newline at exit; prefix templates and
# --no_prefix; per-rank files in torchrun's --log_dir layout; -r/--redirects, -t/--tee (maps
# too) and --local_ranks_filter; --duplicate_std{out,err}_filters' filtered logs.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE PET_LOG_DIR \
    PET_REDIRECTS PET_TEE PET_LOCAL_RANKS_FILTER PET_DUPLICATE_STDOUT_FILTERS \
    PET_DUPLICATE_STDERR_FILTERS
export OMP_NUM_THREADS=1

NLINES=20000
PREFIX='[rank${rank}]:'

# A line whose writer pauses for 100 ms in its middle is shown in part at once, and another
# rank's line then ends it there (live partial lines, launcher/output.h). On a busy CPU a writer
# may pause that long: the console's checks take a line that arrived in pieces (verify's
# "pieces", a bounded number of them), and they run alone so that pieces stay rare.
# alone: t_output_integrity_4_workers_20000_lines t_output_integrity_with_tee_files_and_template
# alone: t_output_slow_reader_console t_output_all_output_before_exit_delivered

# verify FILE STREAM RANKS [TEMPLATE] [ROLE] [SEED] [pieces]
verify() {
    "$TW" verify "$1" "$2" "$3" "$NLINES" "${6:-1234}" "${4-$PREFIX}" "${5:-default}" ${7:+"$7"} \
        >verify.out 2>&1 || fail "$(cat verify.out)"
}

# the launcher's console: lines may arrive in pieces where a writer paused (see above)
# verify_console FILE STREAM RANKS [TEMPLATE] [ROLE] [SEED]
verify_console() {
    verify "$1" "$2" "$3" "${4-$PREFIX}" "${5:-default}" "${6:-1234}" pieces
}

t_output_verify_pieces_rules() {
    # the checker itself: a line split in two passes only with pieces; a piece with a byte
    # lost, or lines in pieces past the bound (1% + 1), fail
    local n=200
    RANK=0 "$TW" output $n 5 2>/dev/null >raw
    echo >>raw # the tail line without a newline, as the launcher ends it
    "$TW" verify raw 1 0 $n 5 "" default >v.out 2>&1 || fail "whole lines refused: $(cat v.out)"
    "$TW" verify raw 1 0 $n 5 "" default pieces >v.out 2>&1 || fail "pieces refused: $(cat v.out)"
    expect_grep v.out ', 0 line[(]s[)] in pieces'
    # the first line of 10 bytes or more, split after its 5th byte
    awk '!d && length($0) >= 10 { print substr($0, 1, 5); print substr($0, 6); d = 1; next } 1' \
        raw >split1
    "$TW" verify split1 1 0 $n 5 "" default >v.out 2>&1 && fail "a split line passed without pieces"
    "$TW" verify split1 1 0 $n 5 "" default pieces >v.out 2>&1 ||
        fail "a split line refused with pieces: $(cat v.out)"
    expect_grep v.out ', 1 line[(]s[)] in pieces'
    awk '!d && length($0) >= 10 { print substr($0, 1, 5); print substr($0, 7); d = 1; next } 1' \
        raw >lost1
    "$TW" verify lost1 1 0 $n 5 "" default pieces >v.out 2>&1 && fail "a lost byte passed"
    awk 'length($0) >= 10 { print substr($0, 1, 5); print substr($0, 6); next } 1' raw >many
    "$TW" verify many 1 0 $n 5 "" default pieces >v.out 2>&1 && fail "every line in pieces passed"
    expect_grep v.out 'arrived in pieces, expected at most 3'
}

t_output_integrity_4_workers_20000_lines() {
    # 4 workers x 20,000 lines to stdout and to stderr, 0 B..100 KB, written in random pieces
    run_launch --nproc_per_node=4 "$TW" output $NLINES 1234
    expect_eq "$rc" 0 "exit status ($(tail -n 3 err))"
    verify_console out 1 0,1,2,3
    verify_console err 2 0,1,2,3
}

t_output_integrity_with_tee_files_and_template() {
    run_launch --nproc_per_node=4 --role trainer --log_dir logs --rdzv_id run7 --tee 3 \
        --log_line_prefix_template '${role_name}-${local_rank}|${rank}> ' "$TW" output $NLINES 99
    expect_eq "$rc" 0 "exit status ($(tail -n 3 err))"
    verify_console out 1 0,1,2,3 '${role_name}-${local_rank}|${rank}> ' trainer 99
    verify_console err 2 0,1,2,3 '${role_name}-${local_rank}|${rank}> ' trainer 99
    local d; d=$(echo logs/run7_*)
    for k in 0 1 2 3; do
        verify "$d/attempt_0/$k/stdout.log" 1 $k "" trainer 99
        verify "$d/attempt_0/$k/stderr.log" 2 $k "" trainer 99
    done
}

t_output_slow_reader_console() {
    # the launcher's stdout is a pipe read slowly: nothing lost, nothing torn
    command -v python3 >/dev/null || skip "python3 needed"
    NLINES=3000
    "$LAUNCH" --nproc_per_node=3 "$TW" output $NLINES 5 2>err |
        python3 -c 'import sys,time
out=open("out","wb")
while True:
    b=sys.stdin.buffer.read(4096)
    if not b: break
    out.write(b); time.sleep(0.0005)'
    rc=${PIPESTATUS[0]}
    expect_eq "$rc" 0
    verify_console out 1 0,1,2 "$PREFIX" default 5
}

t_output_partial_line_at_exit_delivered() {
    run_launch --nproc_per_node=2 "$TW" print "first %r" noeol "no newline from %r" eprint "e-first %r" enoeol "e-no newline %r" exit 0
    expect_eq "$rc" 0
    for k in 0 1; do
        expect_grep out "^\[rank$k\]:first $k$"
        expect_grep out "^\[rank$k\]:no newline from $k$"
        expect_grep err "^\[rank$k\]:e-first $k$"
        expect_grep err "^\[rank$k\]:e-no newline $k$"
    done
    expect_eq "$(wc -l <out)" 4 "stdout lines"
    # output ends with a newline
    expect_eq "$(tail -c 1 out | od -An -c | tr -d ' ')" '\n' "last byte"
}

t_output_partial_line_of_killed_worker_delivered() {
    run_launch --nproc_per_node=1 "$TW" noeol "dying words" eprint "about to die" raise KILL
    expect_eq "$rc" 137
    expect_grep out '^\[rank0\]:dying words$'
    expect_grep err 'about to die'
}

# A worker's unfinished line on stderr (a progress bar) that the console shows when the
# launcher has to speak: its message starts on a line of its own, not glued onto the worker's.
t_output_launcher_message_after_unfinished_line() {
    "$LAUNCH" --nproc_per_node=1 "$TW" enoeol "progress 40%" pause >out 2>err &
    local pid=$!
    wait_until 30 grep -q 'progress 40%' err || { kill -9 $pid; fail "the unfinished line never showed"; }
    kill -TERM $pid
    wait $pid
    expect_grep err '^\[rank0\]:progress 40%$'
    expect_grep err '^mgpu-launch: warning: received SIGTERM'
}

t_output_all_output_before_exit_delivered() {
    # a worker that writes a lot and exits at once: everything arrives before the launcher exits
    NLINES=5000
    run_launch --nproc_per_node=1 "$TW" output $NLINES 77 exit 3
    expect_eq "$rc" 3
    verify_console out 1 0 "$PREFIX" default 77
    # stderr ends with the launcher's report: keep the workers' lines
    grep -a '^\[rank' err >err.workers
    verify_console err.workers 2 0 "$PREFIX" default 77
    # two workers: both write everything; rank 1 then fails, rank 0 is stopped; what rank 0
    # wrote before it was stopped still arrives whole
    run_launch --nproc_per_node=2 "$TW" output $NLINES 78 touch done.%l waitall done. 2 only 1 exit 3 pause
    expect_eq "$rc" 3
    verify_console out 1 0,1 "$PREFIX" default 78
    grep -a '^\[rank' err >err.workers
    verify_console err.workers 2 0,1 "$PREFIX" default 78
}

t_output_stopped_worker_output_delivered() {
    # the output of a worker stopped by the launcher, written in its SIGTERM handler time,
    # is delivered too
    run_launch --nproc_per_node=2 "$TW" print "hello %r" touch ready.%l only 1 waitall ready. 2 only 1 exit 1 pause
    expect_eq "$rc" 1
    expect_grep out '^\[rank0\]:hello 0$'
    expect_grep out '^\[rank1\]:hello 1$'
}

t_output_prefix_template_option() {
    run_launch --nproc_per_node=2 --role trainer --log_line_prefix_template '[${role_name}${local_rank}]: ' \
        "$TW" print "x%r"
    expect_eq "$rc" 0
    expect_grep out '^\[trainer0\]: x0$'
    expect_grep out '^\[trainer1\]: x1$'
}

t_output_prefix_template_env() {
    # torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='<${rank}/${local_rank}/${role_name}> ' \
        run_launch --nproc_per_node=2 --role=tr "$TW" print "y%l"
    expect_eq "$rc" 0
    expect_grep out '^<0/0/tr> y0$'
    expect_grep out '^<1/1/tr> y1$'
}

t_output_prefix_template_option_beats_env() {
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='env${rank}: ' \
        run_launch --nproc_per_node=1 --log_line_prefix_template 'opt${rank}: ' "$TW" print "z"
    expect_eq "$rc" 0
    expect_grep out '^opt0: z$'
}

t_output_default_prefix_multi_node_uses_global_rank() {
    # two nodes on this host: node 1's workers print with their global ranks 2 and 3
    local port; port=$(free_port)
    "$LAUNCH" --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=$port --nproc_per_node=2 \
        "$TW" print "g%l" >out.0 2>err.0 &
    local p0=$!
    "$LAUNCH" --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=$port --nproc_per_node=2 \
        "$TW" print "g%l" >out.1 2>err.1
    rc=$?
    wait $p0
    expect_eq "$rc/$?" 0/0 "exit statuses ($(cat err.0 err.1))"
    expect_grep out.0 '^\[rank0\]:g0$'
    expect_grep out.0 '^\[rank1\]:g1$'
    expect_grep out.1 '^\[rank2\]:g0$'
    expect_grep out.1 '^\[rank3\]:g1$'
}

t_output_no_prefix() {
    run_launch --nproc_per_node=2 --no_prefix "$TW" print "plain %r" eprint "eplain %r"
    expect_eq "$rc" 0
    expect_grep out '^plain 0$'
    expect_grep out '^plain 1$'
    expect_grep err '^eplain 1$'
    expect_no_grep out '\[rank'
}

t_output_worker_closes_stdout_early() {
    # a worker closing its stdout early must not confuse the launcher (EOF before exit)
    cat >w.sh <<'EOF'
#!/bin/sh
echo "before close $RANK"
exec 1>&-
sleep 0.3
echo "on stderr $RANK" >&2
exit 0
EOF
    chmod +x w.sh
    run_launch --nproc_per_node=2 ./w.sh
    expect_eq "$rc" 0
    expect_grep out '^\[rank1\]:before close 1$'
    expect_grep err '^\[rank1\]:on stderr 1$'
}

t_output_launcher_stdout_closed_by_reader() {
    # `mgpu-launch ... | head -1`: the launcher keeps supervising, exits with the workers' status
    "$LAUNCH" --nproc_per_node=2 "$TW" output 2000 3 exit 0 2>err | head -n 1 >first
    rc=${PIPESTATUS[0]}
    expect_eq "$rc" 0 "exit status when the reader goes away ($(tail -n 3 err))"
    expect_grep first '^\[rank[01]\]:'
}

# --- logs ---

t_logs_layout_and_tee() {
    run_launch --nproc_per_node=2 --log_dir "$PWD/logs" --rdzv_id myrun --tee 3 "$TW" \
        print "out %r" eprint "err %r" env e.%l
    expect_eq "$rc" 0
    local d n
    n=$(ls -d logs/myrun_* | wc -l)
    expect_eq "$n" 1 "run folders"
    d=$(ls -d logs/myrun_*)
    [[ "$(basename "$d")" =~ ^myrun_[A-Za-z0-9_]{8}$ ]] || fail "run folder '$d' is not <run_id>_<8 chars>"
    for k in 0 1; do
        expect_eq "$(cat "$d/attempt_0/$k/stdout.log")" "out $k" "rank $k stdout.log"
        expect_eq "$(cat "$d/attempt_0/$k/stderr.log")" "err $k" "rank $k stderr.log"
        expect_grep out "^\[rank$k\]:out $k$"
        expect_grep err "^\[rank$k\]:err $k$"
        expect_grep e.$k "^TORCHELASTIC_ERROR_FILE=$PWD/$d/attempt_0/$k/error.json$"
    done
}

t_logs_redirects_file_only() {
    run_launch --nproc_per_node=2 --log_dir logs -r 3 "$TW" print "out %r" eprint "err %r"
    expect_eq "$rc" 0
    local d; d=$(ls -d logs/none_*)
    expect_no_grep out 'out [01]'
    expect_no_grep err 'err [01]'
    for k in 0 1; do
        expect_eq "$(cat "$d/attempt_0/$k/stdout.log")" "out $k"
        expect_eq "$(cat "$d/attempt_0/$k/stderr.log")" "err $k"
    done
}

t_logs_redirects_stdout_only() {
    run_launch --nproc_per_node=2 --log_dir logs --redirects=1 "$TW" print "out %r" eprint "err %r"
    expect_eq "$rc" 0
    local d; d=$(ls -d logs/none_*)
    expect_no_grep out 'out [01]'
    expect_grep err '^\[rank0\]:err 0$'
    expect_grep "$d/attempt_0/1/stdout.log" '^out 1$'
}

t_logs_per_rank_maps() {
    # -t 0:1,1:2: rank 0 stdout to file and console; rank 1 stderr to file and console
    # -r 2:3: rank 2 everything to files only
    run_launch --nproc_per_node=4 --log_dir logs -t 0:1,1:2 -r 2:3 "$TW" print "out %r" eprint "err %r"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    local d; d=$(ls -d logs/none_*)/attempt_0
    expect_grep "$d/0/stdout.log" '^out 0$'
    expect_grep out '^\[rank0\]:out 0$'
    expect_grep err '^\[rank0\]:err 0$'
    expect_grep "$d/1/stderr.log" '^err 1$'
    expect_grep err '^\[rank1\]:err 1$'
    expect_grep out '^\[rank1\]:out 1$'
    expect_grep "$d/2/stdout.log" '^out 2$'
    expect_grep "$d/2/stderr.log" '^err 2$'
    expect_no_grep out 'out 2'
    expect_no_grep err 'err 2'
    expect_grep out '^\[rank3\]:out 3$'
    expect_grep err '^\[rank3\]:err 3$'
    [ ! -s "$d/3/stdout.log" ] || fail "rank 3 stdout went to a file"
}

t_logs_redirect_and_tee_long_option_forms() {
    run_launch --nproc_per_node=2 --log_dir=logs --redirects 0:3,1:3 --tee=1:1 "$TW" print "out %r"
    expect_eq "$rc" 0
    local d; d=$(ls -d logs/none_*)/attempt_0
    expect_no_grep out 'out 0'
    expect_grep out '^\[rank1\]:out 1$'
    expect_grep "$d/0/stdout.log" '^out 0$'
    expect_grep "$d/1/stdout.log" '^out 1$'
}

t_logs_local_ranks_filter() {
    run_launch --nproc_per_node=3 --log_dir logs --tee 3 --local_ranks_filter 0,2 "$TW" print "out %r" eprint "err %r"
    expect_eq "$rc" 0
    expect_grep out '^\[rank0\]:out 0$'
    expect_grep out '^\[rank2\]:out 2$'
    expect_no_grep out 'out 1'
    expect_no_grep err 'err 1'
    # files are unaffected by the filter
    local d; d=$(ls -d logs/none_*)/attempt_0
    expect_grep "$d/1/stdout.log" '^out 1$'
    expect_grep "$d/1/stderr.log" '^err 1$'
}

t_logs_local_ranks_filter_without_logs() {
    run_launch --nproc_per_node=3 --local_ranks_filter=1 "$TW" print "out %r" eprint "err %r"
    expect_eq "$rc" 0
    expect_eq "$(cat out)" "[rank1]:out 1"
    expect_no_grep err 'err [02]'
}

t_logs_filtered_rank_failure_still_reported() {
    # output hidden by the filter, but the failing rank's stderr still makes the report
    run_launch --nproc_per_node=2 --local_ranks_filter=0 "$TW" only 1 eprint "secret failure reason" only 1 exit 3 exit 0
    expect_eq "$rc" 3
    expect_grep err 'secret failure reason'
}

t_logs_no_log_dir_leaves_nothing() {
    # without --log_dir the launcher's temporary folder (error files) is removed at exit
    local tmp; tmp=$(mktemp -d)
    TMPDIR=$tmp run_launch --nproc_per_node=2 "$TW" env e.%l exit 0
    expect_eq "$rc" 0
    case "$(grep '^TORCHELASTIC_ERROR_FILE=' e.0)" in
        "TORCHELASTIC_ERROR_FILE=$tmp/"*) ;;
        *) fail "error file not under TMPDIR: $(grep '^TORCHELASTIC_ERROR_FILE=' e.0)" ;;
    esac
    expect_eq "$(ls -A "$tmp")" "" "leftovers in TMPDIR"
    rm -rf "$tmp"
}

t_output_bytes_passed_unchanged() {
    # NUL, CR, tabs, invalid UTF-8, escape sequences: bytes pass through as they are
    printf '#!/bin/sh\nprintf "a\\000b\\rc\\td\\377\\033[1m\\n"\n' >bytes.sh
    chmod +x bytes.sh
    run_launch --nproc_per_node=1 ./bytes.sh
    expect_eq "$rc" 0
    printf '[rank0]:a\000b\rc\td\377\033[1m\n' >expected
    cmp expected out || fail "bytes changed: $(od -c out | head)"
}

# A line of 5 MB (a JSON or base64 blob), and one of 3 MB with no newline at the end: the log
# files hold exactly the worker's bytes (the unfinished last line completed with a newline, as
# any is), and the console has each line whole, prefixed once.
t_output_lines_of_megabytes_pass_whole() {
    printf '#!/bin/sh\nhead -c 5000000 /dev/zero | tr "\\0" A; echo; head -c 3000000 /dev/zero | tr "\\0" B\n' >long.sh
    chmod +x long.sh
    { ./long.sh; echo; } >want
    run_launch --nproc_per_node=1 --log_dir "$PWD/logs" --tee 3 ./long.sh
    expect_eq "$rc" 0
    cmp want logs/*/attempt_0/0/stdout.log || fail "the log file differs from the worker's bytes"
    { sed -n '1s/^/[rank0]:/p' want; sed -n '2s/^/[rank0]:/p' want; } >want_console
    cmp want_console out || fail "the console differs: $(cut -c1-20 out | head -5)"
    run_launch --nproc_per_node=1 --no_prefix ./long.sh
    cmp want out || fail "with --no_prefix the console differs"
}

t_logs_redirect_without_log_dir_kept() {
    # -r 3 without --log_dir: the output goes to files in a folder the launcher makes and keeps
    # (torchrun: a torchelastic_* temporary folder), and says where
    local tmp; tmp=$(mktemp -d)
    TMPDIR=$tmp run_launch --nproc_per_node=2 -r 3 "$TW" print "out %r"
    expect_eq "$rc" 0
    expect_no_grep out 'out [01]'
    local f; f=$(find "$tmp" -name stdout.log -path '*/attempt_0/1/*')
    [ -n "$f" ] || fail "no rank 1 stdout.log under TMPDIR: $(find "$tmp")"
    expect_grep "$f" '^out 1$'
    expect_grep err "$tmp"
    rm -rf "$tmp"
}

# --duplicate_stdout_filters / --duplicate_stderr_filters: the lines shown on the console that
# contain one of the substrings are also copied, with their prefix, to one file for every rank,
# <run>/attempt_<n>/filtered_std{out,err}.log.

t_logs_duplicate_filters_copy_lines_shown() {
    # rank 1's stdout goes to its file only (-r 1:1), rank 2 is not shown (--local_ranks_filter):
    # neither is copied, as torchrun copies only what it shows
    run_launch --nproc_per_node=3 --log_dir=logs -r 1:1 --local_ranks_filter=0,1 -t 0:1 \
        --duplicate_stdout_filters='apple,or,,ange' --duplicate-stderr-filters NCCL "$TW" \
        print "an apple %r" print "or,ange %r" print "or ange %r" print "plain %r" \
        eprint "NCCL WARN %r" eprint "other %r" noeol "apple without newline %r"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    local d; d=$(echo logs/none_*/attempt_0)
    [ -d "$d" ] || fail "no attempt folder: $(find logs)"
    printf '%s\n' '[rank0]:an apple 0' '[rank0]:or,ange 0' '[rank0]:apple without newline 0' \
        >expected.out
    diff expected.out "$d/filtered_stdout.log" || fail "filtered_stdout.log"
    sort "$d/filtered_stderr.log" >got.err
    printf '%s\n' '[rank0]:NCCL WARN 0' '[rank1]:NCCL WARN 1' >expected.err
    diff expected.err got.err || fail "filtered_stderr.log"
    # the copies are in addition: the console and the per-rank files are as without filters
    expect_grep out '^\[rank0\]:an apple 0$'
    expect_grep out '^\[rank0\]:plain 0$'
    expect_grep "$d/1/stdout.log" '^an apple 1$'
    expect_grep "$d/0/stdout.log" '^plain 0$'
}

t_logs_full_disk_is_said_and_the_job_goes_on() {
    # the log folder on a 64 KB tmpfs (a mount namespace of the test's own): each file that
    # fills is named once with the reason and the job still exits 0; the console still has
    # every line it shows (rank 1's, tee'd), not rank 0's (-r 0:1: its file alone)
    [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null || skip "needs root and a mount namespace"
    mkdir -p small
    unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs small && exec "$@"' sh \
        "$LAUNCH" --nproc_per_node=2 --log_dir small/logs --tee 1:1 -r 0:1 \
        --duplicate_stdout_filters=line -- sh -c 'seq -f "line %g of padding to fill it" 4000' \
        >out 2>err
    rc=$?
    if [ "$rc" != 0 ] && grep -q '^mount:' err; then skip "no tmpfs here: $(head -c 200 err)"; fi
    expect_eq "$rc" 0 "exit status ($(cat err))"
    local d='small/logs/none_[A-Za-z0-9_]+/attempt_0'
    expect_grep err "^mgpu-launch: warning: $d/1/stdout.log: No space left on device; rank 1's output from here on is not in it \\(the console still shows it\\)\$"
    expect_grep err "^mgpu-launch: warning: $d/0/stdout.log: No space left on device; rank 0's output from here on is not in it\$"
    expect_grep err "^mgpu-launch: warning: $d/filtered_stdout.log: No space left on device; every rank's output from here on is not in it"
    expect_eq "$(grep -c 'No space' err)" 3 "warnings: one a full file"
    expect_eq "$(grep -c '^\[rank1\]:line' out)" 4000 "rank 1's lines on the console"
    expect_eq "$(grep -c '^\[rank0\]:line' out)" 0 "rank 0's lines on the console"
}

t_logs_duplicate_filters_one_file_per_attempt() {
    PET_DUPLICATE_STDOUT_FILTERS=attempt run_launch --nproc_per_node=2 --log_dir=logs \
        --max_restarts=1 --no_prefix "$TW" print "attempt %a rank %r" touch p.%a.%r \
        waitall p.%a. 2 fail_until 1 3
    expect_eq "$rc" 0 "exit status ($(cat err))"
    sort logs/none_*/attempt_0/filtered_stdout.log >a0
    sort logs/none_*/attempt_1/filtered_stdout.log >a1
    printf '%s\n' 'attempt 0 rank 0' 'attempt 0 rank 1' | diff - a0 || fail "attempt 0's copy"
    printf '%s\n' 'attempt 1 rank 0' 'attempt 1 rank 1' | diff - a1 || fail "attempt 1's copy"
    [ ! -e logs/none_*/attempt_0/filtered_stderr.log ] || fail "a filtered_stderr.log without filters"
}

t_logs_duplicate_filters_without_log_dir_kept() {
    # no --log_dir: the run's temporary folder is kept for the file, and the launcher says where
    local tmp; tmp=$(mktemp -d)
    TMPDIR=$tmp run_launch --nproc_per_node=1 --duplicate_stdout_filters=loss "$TW" \
        print "step 1 loss 0.5" print "step 1 lr 0.1"
    expect_eq "$rc" 0
    local f; f=$(find "$tmp" -name filtered_stdout.log)
    [ -n "$f" ] || fail "no filtered_stdout.log under TMPDIR: $(find "$tmp")"
    expect_eq "$(cat "$f")" '[rank0]:step 1 loss 0.5' "filtered_stdout.log"
    expect_grep err "worker logs are in $tmp/"
    rm -rf "$tmp"
}

t_logs_duplicate_filters_empty_copies_nothing() {
    # torchrun: "An empty filters list won't duplicate any lines"; empty entries are left out
    local tmp; tmp=$(mktemp -d)
    TMPDIR=$tmp run_launch --duplicate_stdout_filters= --duplicate_stderr_filters=, "$TW" \
        print x eprint y
    expect_eq "$rc" 0
    expect_eq "$(ls -A "$tmp")" "" "leftovers in TMPDIR"
    rm -rf "$tmp"
    run_launch --dup=x "$TW" print x
    expect_eq "$rc" 2
    expect_grep err 'ambiguous option --dup=x: could match --duplicate_stdout_filters, --duplicate_stderr_filters'
}
