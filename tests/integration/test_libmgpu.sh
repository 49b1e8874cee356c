# test_libmgpu.sh - libmgpu's CPU collectives in workers started by the real mgpu-launch.
BENCH="$MGPU_BUILD/tests/allreduce_bench"

# All-reduce results checked by the workers themselves (#wrong column) for 3 and 4 ranks.
t_launch_allreduce_checks_itself() {
    local n
    for n in 3 4; do
        run_launch --nproc_per_node=$n -- "$BENCH" --min 4K --max 1M --seconds 0.01
        expect_eq "$rc" 0 "exit status with $n ranks"
        expect_grep out "\[rank0\]:# mgpu CPU all-reduce .* $n ranks \(mgpu-launch\)"
        expect_eq "$(grep -cE '^\[rank0\]: +[0-9]+ ' out)" 5 "sizes measured with $n ranks"
        expect_eq "$(grep -E '^\[rank0\]: +[0-9]+ ' out | awk '$NF != 0' | wc -l)" 0 \
            "sizes with wrong elements"
    done
    # Nothing left behind in /dev/shm by these jobs.
    expect_eq "$(ls /dev/shm | grep -c "^mgpu-$(id -u)-")" 0 "leftover segments"
}

# The same program under Open MPI's mpirun: rank from OMPI_COMM_WORLD_*, one host's shm.
t_mpirun_allreduce_checks_itself() {
    command -v mpirun >/dev/null || skip "mpirun not installed (apt-get install openmpi-bin)"
    mpirun --allow-run-as-root --oversubscribe -np 3 "$BENCH" --min 4K --max 256K \
        --seconds 0.01 >out 2>err
    rc=$?
    expect_eq "$rc" 0 "mpirun exit status"
    expect_grep out "^# mgpu CPU all-reduce .* 3 ranks \(openmpi\)"
    expect_eq "$(grep -cE '^ +[0-9]+ ' out)" 4 "sizes measured"
    expect_eq "$(grep -E '^ +[0-9]+ ' out | awk '$NF != 0' | wc -l)" 0 "sizes with wrong elements"
}
