# test_numa.sh - --numa_binding: each worker's CPU affinity (its /proc/self/status), on a fake
# sysfs topology (MGPU_SYSFS_ROOT) of two NUMA nodes of one CPU each, with simulated GPUs;
# what --dry-run shows; workers that cannot be bound run unbound with a warning; bad values.
# Each t_* runs in its own subshell, in a fresh folder, with lib.sh sourced.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES MGPU_SYSFS_ROOT
export MGPU_SIM_GPUS=2 OMP_NUM_THREADS=1

# The tests bind to CPUs 0 and 1: they must be this shell's (and so the launcher's).
need_cpus_0_1() {
    local mine; mine=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)
    [ "$mine" = "0-1" ] || [[ "$mine" =~ ^0-([2-9]|[1-9][0-9]+)$ ]] ||
        skip "this shell may not run on CPUs 0 and 1 (Cpus_allowed_list $mine)"
}

put() { mkdir -p "$(dirname "$1")" && printf '%s\n' "$2" >"$1"; }

# fake_sysfs DIR: node 0 = CPU 0, node 1 = CPU 1, one socket each; the simulated GPUs 0 and 1
# (bus ids 0000:10:00.0 and 0000:11:00.0) on nodes 0 and 1, GPU 2 reporting no node (-1).
fake_sysfs() {
    local r=$1 c
    put "$r/devices/system/node/node0/cpulist" 0
    put "$r/devices/system/node/node1/cpulist" 1
    for c in 0 1; do
        put "$r/devices/system/cpu/cpu$c/topology/physical_package_id" $c
        put "$r/devices/system/cpu/cpu$c/topology/thread_siblings_list" $c
    done
    put "$r/bus/pci/devices/0000:10:00.0/numa_node" 0
    put "$r/bus/pci/devices/0000:11:00.0/numa_node" 1
    put "$r/bus/pci/devices/0000:12:00.0/numa_node" -1
}

# What a worker and a process it starts may run on, as the kernel says.
AFF='grep Cpus_allowed_list /proc/self/status | cut -f2 >aff.$LOCAL_RANK; sh -c "grep Cpus_allowed_list /proc/self/status" | cut -f2 >child.$LOCAL_RANK'

t_numa_node_binds_each_worker_near_its_gpu() {
    need_cpus_0_1
    fake_sysfs sys
    MGPU_SYSFS_ROOT=$PWD/sys run_launch -v --nproc_per_node=2 --numa-binding=node --no_python \
        sh -c "$AFF"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(cat aff.0)" 0 "local rank 0's CPUs"
    expect_eq "$(cat aff.1)" 1 "local rank 1's CPUs"
    expect_eq "$(cat child.0)" 0 "CPUs of a process local rank 0 started"
    expect_eq "$(cat child.1)" 1 "CPUs of a process local rank 1 started"
    expect_grep err 'info: --numa_binding=node: local rank 1 on CPUs 1 \(NUMA node 1\)'
    expect_no_grep err 'warning'
}

t_numa_follows_cuda_visible_devices() {
    # ordinal 0 is physical GPU 1 (node 1): local rank 0 runs on CPU 1
    need_cpus_0_1
    fake_sysfs sys
    CUDA_VISIBLE_DEVICES=1,0 MGPU_SYSFS_ROOT=$PWD/sys run_launch --nproc_per_node=2 \
        --numa_binding socket --no_python sh -c "$AFF"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(cat aff.0)" 1 "local rank 0's CPUs"
    expect_eq "$(cat aff.1)" 0 "local rank 1's CPUs"
}

t_numa_exclusive_splits_a_node() {
    # one node of two one-CPU cores and both GPUs on it: a core each
    need_cpus_0_1
    fake_sysfs sys
    put sys/devices/system/node/node0/cpulist 0-1
    rm -r sys/devices/system/node/node1
    put sys/bus/pci/devices/0000:11:00.0/numa_node 0
    MGPU_SYSFS_ROOT=$PWD/sys run_launch --nproc_per_node=2 --numa=exclusive --no_python \
        sh -c "$AFF"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(cat aff.0)" 0 "local rank 0's CPUs"
    expect_eq "$(cat aff.1)" 1 "local rank 1's CPUs"
    # three GPUs on those two cores: refused, nothing started
    MGPU_SIM_GPUS=3 MGPU_SYSFS_ROOT=$PWD/sys run_launch --nproc_per_node=3 \
        --numa_binding=exclusive --no_python sh -c 'touch started'
    expect_eq "$rc" 2 "exit status with more GPUs than cores"
    expect_grep err '^mgpu-launch: error: --numa_binding=exclusive: NUMA node 0 has 2 physical cores \(CPUs 0-1\) for its 3 GPUs'
    [ ! -e started ] || fail "a worker started"
}

t_numa_dry_run_shows_each_binding() {
    fake_sysfs sys
    MGPU_SIM_GPUS=3 MGPU_SYSFS_ROOT=$PWD/sys run_launch --nproc_per_node=3 --numa_binding=node \
        --dry-run "$TW" exit 0
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep out '^  cpus: 0 \(NUMA node 0, --numa_binding=node\)$'
    expect_grep out '^  cpus: 1 \(NUMA node 1, --numa_binding=node\)$'
    # GPU 2 reports -1 on a machine of two nodes
    expect_grep out '^  cpus: not bound \(--numa_binding=node: its NUMA node is unknown \(.*0000:12:00.0/numa_node is -1, and this machine has 2 NUMA nodes\)\)$'
    MGPU_SIM_GPUS=3 MGPU_SYSFS_ROOT=$PWD/sys run_launch --nproc_per_node=3 --numa_binding=node \
        --dry-run=json "$TW" exit 0
    python3 -c 'import json, sys
w = json.load(open("out"))["workers"]
assert w[0]["numa_binding"] == {"mode": "node", "node": 0, "cpus": "0"}, w[0]
assert w[1]["numa_binding"]["cpus"] == "1", w[1]
assert w[2]["numa_binding"]["cpus"] is None and "unknown" in w[2]["numa_binding"]["unbound"], w[2]
' || fail "--dry-run=json: $(cat out)"
    run_launch --nproc_per_node=2 --dry-run "$TW" exit 0
    expect_no_grep out 'cpus:'
}

t_numa_unbound_workers_warn_and_run() {
    # GPUs sysfs does not list (simulated, no MGPU_SYSFS_ROOT), and CPU workers: a warning
    # each, and the job runs where the launcher may
    local mine; mine=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)
    run_launch --nproc_per_node=2 --numa_binding=node --no_python sh -c "$AFF"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep err '^mgpu-launch: warning: --numa_binding=node: local rank 0 \(GPU 0, 0000:10:00.0, simulated\) runs unbound: its NUMA node is unknown'
    expect_eq "$(cat aff.0)" "$mine" "an unbound worker's CPUs"
    MGPU_SIM_GPUS=0 run_launch --nproc_per_node=2 --numa_binding=core-complex --no_python \
        sh -c "$AFF"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep err '^mgpu-launch: warning: --numa_binding=core-complex: the workers run on the CPU \(no GPU is installed\): no GPU to bind them near; they run unbound$'
    expect_eq "$(cat aff.1)" "$mine" "a CPU worker's CPUs"
}

t_numa_bad_values_refused() {
    local v
    for v in nodes '' NODE core; do
        run_launch --numa_binding="$v" "$TW" touch started
        expect_eq "$rc" 2 "exit status for '$v'"
        expect_grep err "^mgpu-launch: error: --numa_binding='$v': expected node, socket, exclusive or core-complex$"
        [ ! -e started ] || fail "a worker started with --numa_binding='$v'"
    done
    run_launch --numa-binding --nproc_per_node=1 "$TW" touch started
    expect_eq "$rc" 2
    expect_grep err "argument --numa_binding: expected one argument"
}
