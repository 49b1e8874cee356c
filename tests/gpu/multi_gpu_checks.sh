#!/usr/bin/env bash
# tests/gpu/multi_gpu_checks.sh [OUTDIR] - the runs on a machine with several NVIDIA GPUs (4 or
# 8 H200s, say), after `make` and with build/bin, build/lib and build/tests in the checkout.
# Each part's output lands in OUTDIR/<part>.txt (default multi-out); a summary of figures is
# printed, then the checks' count last. Parts 1, 3 and 7 are checks: a skipped test, simulated
# GPUs or a CPU run fail them (tests/gpu/lib.sh, judge); parts 2, 4, 5 and 6 are benchmarks,
# reported apart. The status is non-zero when a check or a benchmark failed.
#
#   1. the article's four scenarios on the real GPUs (scripts/scenario1-4.sh use them when
#      there are enough), with nvidia-smi's view of each GPU (index, UUID, PCI bus id);
#   2. all-reduce bus bandwidth, mgpu's NCCL path against NCCL called directly, 8 B to 1 GiB,
#      at 2, 4 and 8 ranks (build/tests/nccl_bench);
#   3. DDP matches one GPU with the same global batch (the main job's model, final loss);
#   4. weak scaling 1 -> 2 -> 4 -> 8 GPUs on the large MLP (bf16 and TF32), the no-overlap run
#      (bucket_overlap = false) and a bucket-size sweep (1, 5, 25, 100 MiB) at the most GPUs;
#   5. DataParallel mode (one process, every GPU) against DDP: samples/s and each GPU's load
#      (nvidia-smi dmon during the run);
#   6. torchrun + PyTorch DDP against mgpu-launch + mgpu-worker at the most GPUs: start to
#      first step and step time (tests/bench/torch_train_bench.py ddp_steps);
#   7. faults: SIGKILL one rank in the middle of the all-reduces; the others must stop within
#      the watchdog's timeout, the launcher exit non-zero, and nvidia-smi show no process left;
#      then the same with --max_restarts 1 and a checkpoint: the group resumes from it.
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0 for every process started here.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-multi-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root" || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
L=build/bin/mgpu-launch
W=build/bin/mgpu-worker
PY=${PYTHON:-python3}
source tests/gpu/lib.sh # part, bench, summary, json_last
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c .; }

N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$N" -ge 2 ] || { echo "this machine has $N GPU(s): these runs need 2 or more"; exit 2; }
{ nvidia-smi -L; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version --format=csv
  nvidia-smi topo -m; "$PY" -c 'import torch; print("torch", torch.__version__)'; } >"$out/machine.txt" 2>&1
counts=""
for n in 1 2 4 8; do [ "$n" -le "$N" ] && counts="$counts $n"; done
echo "$N GPUs; world sizes:$counts"

# 1. scenarios
scenarios() {
    local s
    for s in 1 2 3 4; do
        echo "== scenario $s"
        bash "scripts/scenario$s.sh" || return 1
    done
}
part scenarios scenarios

# 2. all-reduce bandwidth
allreduce() {
    local n
    for n in $counts; do
        [ "$n" -ge 2 ] || continue
        echo "== $n ranks"
        "$L" --nproc_per_node="$n" --local_ranks_filter 0 -- build/tests/nccl_bench || return 1
    done
}
bench allreduce allreduce

# 3. DDP = one GPU with the global batch: train.cfg's model, batch 64 per rank on N ranks
# against batch 64 N on one GPU (no shuffle: both see the same samples in each step); the same
# parameters give the same held-out loss (seen equal to the last digit on 2 CPU ranks).
ddp_equals_one() {
    local n=$N b=64 a c
    "$L" --nproc_per_node="$n" configs/train.cfg batch_size=$b shuffle=false epochs=2 \
        metrics_file="$out/ddp_n.jsonl" log_interval=0 || return 1
    "$L" --nproc_per_node=1 configs/train.cfg batch_size=$((b * n)) shuffle=false epochs=2 \
        metrics_file="$out/ddp_1.jsonl" log_interval=0 || return 1
    # the final metrics lines name the backend: judge fails a CPU run
    tail -n 1 "$out/ddp_n.jsonl" "$out/ddp_1.jsonl"
    a=$(json_last "$out/ddp_n.jsonl" eval_loss) c=$(json_last "$out/ddp_1.jsonl" eval_loss)
    echo "final loss: $n GPUs x batch $b: $a; 1 GPU x batch $((b * n)): $c (held out)"
    "$PY" -c "import sys; a, c = $a, $c; sys.exit(abs(a - c) > 1e-4 * max(1, abs(c)))"
}
part ddp_equals_one_gpu ddp_equals_one

# 4. weak scaling, overlap, buckets: bench_large_*.cfg with 8192 samples per rank.
large() { # large NAME N CFG [key=value ...]
    local name=$1 n=$2 cfg=$3
    shift 3
    "$L" --nproc_per_node="$n" "configs/$cfg" samples=$((8192 * n)) metrics_file="$out/$name.jsonl" "$@" \
        >"$out/$name.out" 2>&1 || { tail "$out/$name.out"; return 1; }
    echo "$name: $(json_last "$out/$name.jsonl" step_us) us/step"
}
scaling() {
    local n p
    for p in bf16 tf32; do
        for n in $counts; do large "scale_${p}_$n" "$n" "bench_large_$p.cfg" || return 1; done
    done
    large no_overlap "$N" bench_large_bf16.cfg bucket_overlap=false || return 1
    for b in 1 5 25 100; do large "bucket_$b" "$N" bench_large_bf16.cfg bucket_mb=$b || return 1; done
}
bench scaling scaling

# 5. DP against DDP, with each GPU's load sampled once a second.
dp_vs_ddp() {
    local dmon
    nvidia-smi dmon -s u -d 1 >"$out/dmon_dp.txt" 2>&1 &
    dmon=$!
    "$L" --nproc_per_node=1 configs/bench_large_tf32.cfg mode=dp dp_devices="$N" epochs=10 \
        samples=$((8192 * N)) metrics_file="$out/dp.jsonl" || { kill "$dmon"; return 1; }
    kill "$dmon"
    nvidia-smi dmon -s u -d 1 >"$out/dmon_ddp.txt" 2>&1 &
    dmon=$!
    "$L" --nproc_per_node="$N" configs/bench_large_tf32.cfg epochs=10 samples=$((8192 * N)) \
        metrics_file="$out/ddp.jsonl" || { kill "$dmon"; return 1; }
    kill "$dmon"
    echo "dp: $(json_last "$out/dp.jsonl" samples_per_s) samples/s; ddp: $(json_last "$out/ddp.jsonl" samples_per_s) samples/s"
}
bench dp_vs_ddp dp_vs_ddp

# 6. torchrun + PyTorch DDP against mgpu at N GPUs (bench_large_bf16's model, 8192 a rank).
torch_vs_mgpu() {
    local t0
    t0=$(date +%s.%N)
    "$PY" -m torch.distributed.run --nproc_per_node="$N" tests/bench/torch_train_bench.py \
        ddp_steps large_bf16 >"$out/torch_ddp.out" 2>&1 || { tail "$out/torch_ddp.out"; return 1; }
    echo "torchrun: started $t0, $(grep -h step_us "$out/torch_ddp.out")"
    t0=$(date +%s.%N)
    large mgpu_ddp "$N" bench_large_bf16.cfg || return 1
    echo "mgpu: started $t0, first step $(json_last "$out/mgpu_ddp.jsonl" first_step_unix_s)"
}
bench torch_vs_mgpu torch_vs_mgpu

# 7. faults
kill_mid_allreduce() {
    local pid victim t0 t1 rc left
    [ "$(apps)" -eq 0 ] || { echo "GPU processes before the test:"; nvidia-smi; return 1; }
    "$L" --nproc_per_node="$N" configs/bench_large_bf16.cfg samples=$((8192 * N)) epochs=1000 \
        timeout=10 >"$out/kill.out" 2>&1 &
    pid=$!
    sleep 20 # past the start and the first steps: the ranks are in their all-reduces
    victim=$(pgrep -P "$pid" -f mgpu-worker | tail -1)
    [ -n "$victim" ] || { echo "no worker found"; kill "$pid"; return 1; }
    t0=$(date +%s.%N)
    kill -9 "$victim"
    wait "$pid"
    rc=$?
    t1=$(date +%s.%N)
    left=$(apps)
    echo "killed rank pid $victim; launcher exit $rc after $("$PY" -c "print(round($t1 - $t0, 3))") s; GPU processes left: $left"
    nvidia-smi --query-compute-apps=pid,process_name --format=csv
    [ "$rc" -ne 0 ] && [ "$left" -eq 0 ]
}
part kill_mid_allreduce kill_mid_allreduce

restart_resumes() {
    local pid victim ck=$out/ckpt
    rm -rf "$ck"
    mkdir -p "$ck"
    "$L" --nproc_per_node="$N" --max_restarts 1 configs/bench_large_bf16.cfg \
        samples=$((8192 * N)) epochs=200 checkpoint="$ck/large.ckpt" checkpoint_interval=20 \
        >"$out/restart.out" 2>&1 &
    pid=$!
    sleep 30
    victim=$(pgrep -P "$pid" -f mgpu-worker | tail -1)
    [ -n "$victim" ] || { echo "no worker found"; kill "$pid"; return 1; }
    kill -9 "$victim"
    wait "$pid" || return 1
    grep -E "resumed from" "$out/restart.out" || { echo "no resume"; return 1; }
    [ "$(apps)" -eq 0 ]
}
part restart_resumes restart_resumes

grep -h "us/step\|final loss\|samples/s\|torchrun\|mgpu:\|killed" "$out"/*.txt
summary
