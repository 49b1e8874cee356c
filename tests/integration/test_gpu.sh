# test_gpu.sh - the launcher against real NVIDIA GPUs and the CUDA driver (skipped on machines
# without one): the GPUs it finds without initialising CUDA, the GPU each worker gets, and
# CUDA_VISIBLE_DEVICES read exactly as the driver reads it. The testworker's "cuda" action asks
# the driver (libcuda.so.1, loaded at run time) what a process sees.

for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC MGPU_SIM_GPUS CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER
export OMP_NUM_THREADS=1

need_gpus() {
    ls -d /proc/driver/nvidia/gpus/*/ >/dev/null 2>&1 || skip "no NVIDIA GPU here (/proc/driver/nvidia/gpus)"
    "$TW" cuda drv
    case "$(head -n 1 drv)" in
        count*) ;;
        *) skip "the CUDA driver does not answer: $(cat drv)" ;;
    esac
    NGPU=$(ls -d /proc/driver/nvidia/gpus/*/ | wc -l)
}
envval() { local l; l=$(grep -m1 "^$2=" "$1") || { echo "<unset>"; return; }; echo "${l#*=}"; }
# the driver's uuid of ordinal K in a file written by "testworker cuda"
drv_uuid() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
drv_count() { awk '$1 == "count" { print $2 }' "$1"; }

t_gpu_discovery_matches_driver() {
    need_gpus
    run_launch --dry-run=json --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 0 "dry run ($(cat err))"
    python3 - out drv "$NGPU" <<'EOF' || fail "plan vs driver: $(cat drv) / $(head -c 1500 out)"
import json, sys
d = json.load(open(sys.argv[1]))
drv = {}
for line in open(sys.argv[2]):
    a, b = line.split()
    if a != "count":
        drv[int(a)] = b
assert d["simulated"] is False, "real GPUs reported as simulated"
assert d["gpus_installed"] == int(sys.argv[3]), (d["gpus_installed"], sys.argv[3])
assert d["gpus_visible"] == len(drv), (d["gpus_visible"], drv)
for g in d["visible"]:
    assert g["uuid"].lower() == drv[g["ordinal"]].lower(), (g, drv)
EOF
}

t_gpu_each_worker_gets_its_gpu() {
    need_gpus
    run_launch --nproc_per_node=gpu "$TW" env e.%l cuda c.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    local k
    for k in $(seq 0 $((NGPU - 1))); do
        [ -f e.$k ] || fail "no worker $k (--nproc_per_node=gpu with $NGPU GPUs)"
        expect_eq "$(envval e.$k MGPU_GPU_ORDINAL)" $k "rank $k ordinal"
        expect_eq "$(envval e.$k MGPU_GPU_SIMULATED)" "<unset>" "rank $k simulated flag"
        local want; want=$(drv_uuid c.$k "$(envval e.$k MGPU_GPU_ORDINAL)")
        expect_eq "$(envval e.$k MGPU_GPU_UUID | tr A-Z a-z)" "$(echo "$want" | tr A-Z a-z)" "rank $k: the launcher's GPU vs the driver's ordinal $k"
    done
    [ ! -e e.$NGPU ] || fail "more workers than GPUs"
}

t_gpu_cvd_read_as_the_driver_reads_it() {
    need_gpus
    local u0; u0=$(drv_uuid drv 0)
    local cvd last=$((NGPU - 1)) past=$NGPU
    # value -> the launcher's visible list must equal the driver's, entry by entry
    for cvd in "0" "$last" "$past" "0,$past" "$past,0" "0,-1" "-1" "-1,0" " 0" "0 " "abc" "0,abc" "" \
        "$u0" "${u0:0:8}" "${u0:0:12}" "GPU-" "$u0,$past" "0,0" "$u0,0"; do
        CUDA_VISIBLE_DEVICES=$cvd "$TW" cuda d
        CUDA_VISIBLE_DEVICES=$cvd "$LAUNCH" --dry-run=json --nproc_per_node=1 "$TW" exit 0 >out 2>err
        rc=$?
        case "$(head -n 1 d)" in
            error*)
                # the driver refuses the list (a repeated device): the launcher must refuse too
                [ "$rc" -eq 2 ] || fail "CUDA_VISIBLE_DEVICES='$cvd': the driver says $(cat d), the launcher ran (exit $rc)"
                continue ;;
        esac
        [ "$rc" -eq 0 ] || fail "CUDA_VISIBLE_DEVICES='$cvd': dry run exit $rc ($(cat err)), the driver sees $(cat d)"
        python3 - out d <<'EOF' || fail "CUDA_VISIBLE_DEVICES='$cvd': launcher $(python3 -c 'import json; d=json.load(open("out")); print([g["uuid"] for g in d["visible"]])') vs driver $(cat d)"
import json, sys
d = json.load(open(sys.argv[1]))
drv = []
for line in open(sys.argv[2]):
    a, b = line.split()
    if a != "count":
        drv.append(b.lower())
assert [g["uuid"].lower() for g in d["visible"]] == drv
assert d["gpus_visible"] == len(drv)
EOF
    done
}

t_gpu_scenario4_real_refused() {
    need_gpus
    run_launch --nproc_per_node=$((NGPU + 1)) "$TW" touch started.%l
    expect_eq "$rc" 2 "exit status"
    sleep 0.1
    ! ls started.* >/dev/null 2>&1 || fail "a worker was started"
    expect_grep err "nproc_per_node=$((NGPU + 1))"
    expect_grep err 'CUDA_VISIBLE_DEVICES'
    expect_grep err "$(drv_uuid drv 0 | cut -c1-12)"
    expect_no_grep err 'simulated'
}

t_gpu_sharing_real() {
    need_gpus
    run_launch --allow_gpu_sharing --nproc_per_node=$((NGPU + 1)) "$TW" env e.%l cuda c.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(envval e.$NGPU MGPU_GPU_ORDINAL)" 0 "the extra worker's ordinal (k mod n)"
    expect_eq "$(envval e.$NGPU MGPU_GPU_UUID | tr A-Z a-z)" "$(drv_uuid c.$NGPU 0 | tr A-Z a-z)" "the extra worker's GPU"
}

t_gpu_none_visible_runs_on_cpu() {
    need_gpus
    CUDA_VISIBLE_DEVICES=$NGPU run_launch --nproc_per_node=2 "$TW" env e.%l cuda c.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(envval e.1 MGPU_DEVICE)" cpu
    expect_eq "$(drv_count c.1)" 0 "devices the driver shows the worker"
    expect_grep err 'CPU'
}

# One rank has nothing to exchange: with backend = auto the worker makes no NCCL communicator
# (which would hold about 0.6 GiB of the GPU for nothing), while backend = nccl still makes one.
# NCCL_DEBUG=INFO makes NCCL say so when it initialises.
t_gpu_one_rank_makes_no_nccl_communicator() {
    need_gpus
    NCCL_DEBUG=INFO run_launch --nproc_per_node=1 "$WORKER" "$MGPU_ROOT/configs/train.cfg" \
        epochs=1 metrics_file= log_interval=0
    expect_eq "$rc" 0 "world size 1, backend = auto ($(tail -n 3 err))"
    ! grep -q 'NCCL INFO' out err || fail "backend = auto at world size 1 initialised NCCL: $(grep -m2 'NCCL INFO' out err)"
    NCCL_DEBUG=INFO run_launch --nproc_per_node=1 "$WORKER" "$MGPU_ROOT/configs/train.cfg" \
        epochs=1 metrics_file= log_interval=0 backend=nccl
    expect_eq "$rc" 0 "world size 1, backend = nccl ($(tail -n 3 err))"
    grep -q 'NCCL INFO' out err || fail "backend = nccl made no NCCL communicator (no 'NCCL INFO' line)"
}
