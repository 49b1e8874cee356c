# test_lostpeer.sh - what libmgpu's workers do when their launcher says that a node of the job
# is lost. Two "nodes" on loopback run "testworker allreduce_loop"; node 1's launcher and
# workers are stopped (SIGSTOP: a hung host sends nothing and closes nothing), and the word is
# written into node 0's progress pages from outside, at the offsets and in the order of
# mgpu_progress_set_lost (common/progress.h; tests/unit/test_lostpeer.c pins the offsets).
# Node 0's workers must fail naming the lost ranks at once, not at the collectives' 300 s
# deadline; allreduce_loop's own behaviour (sums, SIGTERM, exit statuses) is checked too.

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"

LOST="ranks 2-3 (node 1, host h1) lost: heartbeat missed for 15.0 s"
LOST_RE="ranks 2-3 \\(node 1, host h1\\) lost: heartbeat missed for 15\\.0 s\$"

# set_lost FILE NPAGES TEXT: the launcher's word in every page of a progress file
set_lost() {
    "$PY3" - "$@" <<'EOF'
import mmap, os, struct, sys
path, n, text = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()[:255]
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, n * 4096)
for k in range(n):
    base = k * 4096
    seq = struct.unpack_from("<I", m, base + 656)[0]
    struct.pack_into("<I", m, base + 656, seq | 1)  # odd: the text changes
    m[base + 664:base + 664 + 256] = text.ljust(256, b"\0")
    struct.pack_into("<I", m, base + 656, (seq | 1) + 1)
EOF
}

t_lost_allreduce_loop_alone() {
    # one node: SIGTERM does not end the loop, which ends after SECS with its count on every
    # rank (the same count: they stop together)
    "$LAUNCH" --nproc_per_node=2 "$TW" ids ids.%l allreduce_loop 1 >out 2>err &
    local l=$!
    wait_until 10 all_exist ids.0 ids.1 || fail "workers did not start"
    sleep 0.3
    kill -TERM "$(cut -d' ' -f1 ids.0)"
    wait "$l"
    expect_eq "$?" 0 "exit status ($(tail -n 5 err))"
    expect_grep out '^\[rank0\]:allreduce_loop: [1-9][0-9]* all-reduces in [0-9.]+ s$'
    expect_eq "$(sed -n 's/^\[rank1\]:allreduce_loop: \([0-9]*\) all-reduces.*/\1/p' out)" \
        "$(sed -n 's/^\[rank0\]:allreduce_loop: \([0-9]*\) all-reduces.*/\1/p' out)" "rank 1's count"
    # a peer that dies: the first error is said, with status 3
    "$LAUNCH" --nproc_per_node=2 "$TW" ids ids2.%l allreduce_loop 30 >out 2>err &
    l=$!
    wait_until 10 all_exist ids2.0 ids2.1 || fail "workers did not start"
    sleep 0.3
    local victim; victim=$(cut -d' ' -f1 ids2.1)
    kill -KILL "$victim"
    wait "$l"
    expect_eq "$?" 137 "exit status (rank 1 killed first)"
    expect_grep err "^\[rank0\]:allreduce_loop: error after [0-9.]+ s: mgpu_allreduce_f32\(count=65, sum\) #[0-9]+ on rank 0: rank 1 \(pid $victim\) died"
    expect_grep err 'rank 0 \(local_rank: 0, pid: [0-9]+\): sent SIGTERM, exitcode 3$'
}

t_lost_node_named_by_waiting_workers() {
    local port; port=$(free_port)
    local a="--nnodes=2 --master_addr=127.0.0.1 --master_port=$port"
    start_node 1 - $a --node_rank=1 --nproc_per_node=2 "$TW" ids ids.1.%l allreduce_loop 60
    start_node 0 - $a --node_rank=0 --nproc_per_node=2 "$TW" env e.0.%l allreduce_loop 60
    wait_until 30 all_exist e.0.0 e.0.1 ids.1.0 ids.1.1 || { dump_nodes err.0 err.1; fail "workers did not start"; }
    sleep 1 # the loop runs on both nodes
    # node 1 hangs whole: its launcher too, which would wake its workers (SIGCONT before the
    # SIGTERM) once node 0 fails, and let the last data through
    local w pids=("${MN_PID[1]}")
    for w in ids.1.0 ids.1.1; do pids+=("$(cut -d' ' -f1 "$w")"); done
    pids+=($(pgrep -P "${MN_PID[1]}"))
    kill -STOP "${pids[@]}"
    MN_KILL+=("${pids[@]:1}") # killed at the end whatever happens
    sleep 0.5                 # node 0's workers wait for node 1 now
    alive "${MN_PID[0]}" || { dump_nodes err.0 err.1; fail "node 0 ended before node 1 was lost"; }
    local t0; t0=$(now_ms)
    set_lost "$(envval e.0.0 MGPU_PROGRESS_FILE)" 2 "$LOST"
    wait_until 20 eval "[ \$(grep -c '^\[rank[01]\]:allreduce_loop: error' err.0) = 2 ]"
    local ms=$(($(now_ms) - t0))
    # node 1 comes back and is stopped with node 0 (a lost node's launcher is the
    # rendezvous' business, not this test's)
    kill -CONT "${pids[@]}"
    wait_node 0 60
    wait_node 1 60
    expect_eq "${MN_RC[0]}" 3 "node 0's exit status ($(dump_nodes err.0 2>&1))"
    # both ranks of node 0: the leader waiting on the ring, rank 1 in shared memory for it
    expect_grep err.0 "^\[rank0\]:allreduce_loop: error after [0-9.]+ s: mgpu_allreduce_f32\(count=65, sum\) across 2 nodes, rank 0: $LOST_RE"
    expect_grep err.0 "^\[rank1\]:allreduce_loop: error after [0-9.]+ s: mgpu_allreduce_f32\(count=65, sum\) across 2 nodes, rank 1.*: $LOST_RE"
    # the word, not the deadline (300 s); the bound leaves room for a loaded machine
    [ "$ms" -lt 5000 ] || fail "node 0's workers failed ${ms} ms after the word"
    echo "node 0's workers failed ${ms} ms after the word"
}
