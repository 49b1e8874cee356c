# test_libmgpu.sh - libmgpu's CPU collectives in workers started by the real mgpu-launch.
BENCH="$MGPU_BUILD/tests/allreduce_bench"
# Alone: it counts every segment of this user in /dev/shm, which other tests' jobs make for a
# moment while they start.
# alone: t_launch_allreduce_checks_itself

# All-reduce results checked by the workers themselves (#wrong column) for 3 and 4 ranks.
t_launch_allreduce_checks_itself() {
    local n
    for n in 3 4; do
        run_launch --nproc_per_node=$n -- "$BENCH" --min 4K --max 1M --seconds 0.01
        expect_eq "$rc" 0 "exit status with $n ranks"
        expect_grep out "\[rank0\]:# mgpu CPU all-reduce .* $n ranks on 1 node \(mgpu-launch\)"
        expect_eq "$(grep -cE '^\[rank0\]: +[0-9]+ ' out)" 5 "sizes measured with $n ranks"
        expect_eq "$(grep -E '^\[rank0\]: +[0-9]+ ' out | awk '$NF != 0' | wc -l)" 0 \
            "sizes with wrong elements"
        # libmgpu published each rank's startup timeline; the launcher printed it (a value
        # may be slightly negative: the launcher stamps a worker after its spawn returns).
        expect_grep err 'rank +(exec +)?init +device +store +comm'
        for r in $(seq 0 $((n - 1))); do expect_grep err "^ +$r( +-?[0-9.]+){4,5}$"; done
    done
    # Nothing left behind in /dev/shm by these jobs.
    expect_eq "$(ls /dev/shm | grep -c "^mgpu-$(id -u)-")" 0 "leftover segments"
}

# A job whose rank 1 exits while rank 0 waits for it in the shared memory rank 0 made: the
# launcher stops rank 0, and removes the segment it left (its creator is dead).
t_failed_start_leaves_no_shared_memory() {
    run_launch --nproc_per_node=2 --no_python sh -c "echo \$\$ >pid.\$RANK; if [ \$RANK = 1 ]; then sleep 0.5; exit 3; fi; exec \"$BENCH\" --min 4K --max 8K --seconds 0.01"
    expect_eq "$rc" 3 "exit status ($(tail -2 err))"
    # segments made by rank 0 (the head's creator pid, at byte 32)
    python3 - "$(cat pid.0)" <<'EOF2' || fail "a segment of rank 0 is left in /dev/shm"
import os, struct, sys
pid, left = int(sys.argv[1]), []
for n in os.listdir("/dev/shm"):
    if n.startswith("mgpu-%d-" % os.getuid()):
        try:
            head = open("/dev/shm/" + n, "rb").read(36)
        except OSError:
            continue
        if len(head) == 36 and struct.unpack_from("<i", head, 32)[0] == pid:
            left.append(n)
print(" ".join(left))
sys.exit(1 if left else 0)
EOF2
}

# The same program under Open MPI's mpirun: rank from OMPI_COMM_WORLD_*, one host's shm.
t_mpirun_allreduce_checks_itself() {
    command -v mpirun >/dev/null || skip "mpirun not installed (apt-get install openmpi-bin)"
    mpirun --allow-run-as-root --oversubscribe -np 3 "$BENCH" --min 4K --max 256K \
        --seconds 0.01 >out 2>err
    rc=$?
    expect_eq "$rc" 0 "mpirun exit status"
    expect_grep out "^# mgpu CPU all-reduce .* 3 ranks on 1 node \(openmpi\)"
    expect_eq "$(grep -cE '^ +[0-9]+ ' out)" 4 "sizes measured"
    expect_eq "$(grep -E '^ +[0-9]+ ' out | awk '$NF != 0' | wc -l)" 0 "sizes with wrong elements"
}

# Two launchers on this host as nodes 0 and 1 of one job: shared memory inside each node, TCP
# between the leaders, addresses through the launchers' store.
t_two_nodes_allreduce_checks_itself() {
    local port i pids=() rcs=()
    port=$(free_port)
    for i in 0 1; do
        "$LAUNCH" --nnodes=2 --node_rank=$i --nproc_per_node=2 --master_addr=127.0.0.1 \
            --master_port=$port -- "$BENCH" --min 4K --max 1M --seconds 0.01 >out.$i 2>err.$i &
        pids+=($!)
    done
    for i in 0 1; do wait ${pids[$i]}; rcs+=($?); done
    expect_eq "${rcs[*]}" "0 0" "exit statuses of the two launchers"
    expect_grep out.0 "\[rank0\]:# mgpu CPU all-reduce .* 4 ranks on 2 nodes \(mgpu-launch\)"
    expect_eq "$(grep -cE '^\[rank0\]: +[0-9]+ ' out.0)" 5 "sizes measured"
    expect_eq "$(grep -E '^\[rank0\]: +[0-9]+ ' out.0 | awk '$NF != 0' | wc -l)" 0 \
        "sizes with wrong elements"
}

# The general collectives (all-reduce, reduce-scatter, all-gather; every dtype and reduction)
# in workers started by mgpu-launch: each size checks itself (#wrong column).
t_launch_collectives_check_themselves() {
    local bench="$MGPU_BUILD/tests/collectives_bench"
    run_launch --nproc_per_node=3 -- "$bench" --min 1K --max 64K --step 8 --seconds 0.005
    expect_eq "$rc" 0 "exit status"
    expect_grep out "\[rank0\]:# mgpu collectives, CPU backend \(shared memory\), 3 ranks on 1 node \(mgpu-launch\)"
    expect_grep out "\[rank0\]:# +size +count +type +redop +time_us +algbw_GB/s +busbw_GB/s +#wrong"
    # 6 dtypes x 4 reductions x 3 sizes for each reduction, 6 x 3 for the gather.
    expect_eq "$(grep -cE '^\[rank0\]: +[0-9]+ +[0-9]+ +[a-z0-9]+ +(sum|avg|max|min) ' out)" 144 \
        "reduction lines"
    expect_eq "$(grep -cE '^\[rank0\]: +[0-9]+ +[0-9]+ +[a-z0-9]+ +none ' out)" 18 "gather lines"
    expect_eq "$(grep -E '^\[rank0\]: +[0-9]+ ' out | awk '$NF != 0' | wc -l)" 0 \
        "sizes with wrong elements"
    # Bad usage names the argument and exits 2.
    "$bench" --dtypes f8 >out 2>err
    expect_eq "$?" 2 "exit status of a bad --dtypes"
    expect_grep err 'collectives_bench: --dtypes "f8": expected one of f32 f64 f16 bf16 i32 i64'
}
