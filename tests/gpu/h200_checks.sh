#!/usr/bin/env bash
# tests/gpu/h200_checks.sh [OUTDIR] - what mgpu checks on a machine with one NVIDIA GPU (an
# H200, say), after `make` and with build/bin, build/lib and build/tests in the checkout:
#   - the GPU unit tests (CUDA kernels against the C reference, the NCCL backend and its
#     watchdog, GPU training against the CPU and CUDA-graph replay against eager steps);
#   - the GPT's CUDA kernels against the C reference (build/tests/test_gpt_cuda, and the bf16
#     path's: test_gpt_linear16, test_gpt_ops16, test_gpt_attn16, also with MGPU_GPT_WGMMA=0),
#     the gradients' average inside the GPT's CUDA graph step (test_gpt_graph, a stand-in
#     all-reduce), and short GPT trainings: fp32 on the GPU against the CPU, bf16 against
#     fp32 (tests/gpu/gpt_train_checks.sh); zero = 1 against zero = 0 on the GPU: one rank,
#     thread-ranks sharing it, a resume at another world size (tests/gpu/zero_checks.sh);
#   - the GPU integration tests (CUDA_VISIBLE_DEVICES as the real driver reads it);
#   - the article's scenarios 3 and 4 on the real GPU, and its demo.py (PyTorch, NCCL) under
#     mgpu-launch with world size 1;
#   - the main job on the GPU, with its startup timeline;
# and, reported apart as benchmarks, start-to-exit of mgpu-launch with 7, 8 and 16 CPU workers
# of /bin/true, and the GPT kernels' figures beside PyTorch's attention (gpt_kernels_bench).
# On a machine with a GPU a check passes only if it ran there: a skipped test, simulated GPUs
# or a run on the CPU fail it (tests/gpu/lib.sh, judge). Everything lands in OUTDIR (default
# gpu-out); the last line says how many checks passed; the status is non-zero when a check or
# a benchmark failed. PYTHON names a python with torch (default: the first of python3 and
# /usr/bin/python3 that imports it).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-gpu-out}
mkdir -p "$out"
cd "$root" || exit 2
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off
source tests/gpu/lib.sh # part, bench, summary
torch_py=
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    "$p" -c 'import torch, torch.distributed' 2>/dev/null && { torch_py=$p; break; }
done
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,pci.bus_id,uuid --format=csv
  [ -n "$torch_py" ] && "$torch_py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
} >"$out/machine.txt" 2>&1
unit() {
    local t rc=0
    for t in test_kernels_cuda test_kernels_cuda_ops test_kernels_cuda_head test_comm_nccl \
        test_train_gpu test_devices; do
        "build/tests/$t" || rc=1
    done
    return $rc
}
part unit_gpu unit
gpt_kernels() {
    local t rc=0
    for t in test_gpt_cuda test_gpt_linear16 test_gpt_ops16 test_gpt_attn16 test_gpt_graph; do
        [ -x "build/tests/$t" ] || {
            echo "build/tests/$t is missing: the GPT's CUDA kernels were not built"
            rc=1
            continue
        }
        "build/tests/$t" || rc=1
    done
    # the attention's mma.sync kernels, which Hopper otherwise leaves for its wgmma ones
    [ ! -x build/tests/test_gpt_attn16 ] || MGPU_GPT_WGMMA=0 build/tests/test_gpt_attn16 || rc=1
    return $rc
}
part gpt_kernels_gpu gpt_kernels
part gpt_train bash tests/gpu/gpt_train_checks.sh "$out/gpt_train"
part zero_gpu bash tests/gpu/zero_checks.sh "$out/zero"
part integration_gpu bash tests/run.sh integration test_gpu
part scenario3 bash scripts/scenario3.sh
part scenario4 bash scripts/scenario4.sh
demo_py() {
    [ -n "$torch_py" ] || { echo "skip - demo_py: no python with torch here"; return 77; }
    env PYTHON_EXEC="$torch_py" build/bin/mgpu-launch --nproc_per_node=1 scripts/demo.py
}
part demo_py demo_py
# the final metrics line names the kernels' backend: judge fails a CPU run on a GPU machine
main_job() {
    local rc
    bash scripts/main_job.sh metrics_file="$out/main_job_metrics.jsonl"
    rc=$?
    tail -n 1 "$out/main_job_metrics.jsonl"
    return $rc
}
part main_job main_job
launch_times() {
    local n i t0 t1
    for n in 7 8 16; do
        for i in $(seq 1 15); do
            t0=$(date +%s%N)
            MGPU_SIM_GPUS=0 build/bin/mgpu-launch -q --nproc_per_node=$n -- /bin/true || return 1
            t1=$(date +%s%N)
            echo "$n $(((t1 - t0) / 1000))"
        done
    done | awk '{s[$1] = s[$1] " " $2} END {for (n in s) print n " workers, us:" s[n]}'
}
bench launch_times launch_times
bench gpt_kernels env MGPU_PYTHON="${torch_py:-python3}" build/tests/gpt_kernels_bench
summary
