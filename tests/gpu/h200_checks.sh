#!/usr/bin/env bash
# tests/gpu/h200_checks.sh [OUTDIR] - what mgpu checks on a machine with one NVIDIA GPU (the
# H200 of the device tool), after `make` here and carrying build/bin, build/lib and
# build/tests there:
#   - the GPU unit tests (CUDA kernels against the C reference, the NCCL backend and its
#     watchdog, GPU training against the CPU and CUDA-graph replay against eager steps);
#   - the GPU integration tests (CUDA_VISIBLE_DEVICES as the real driver reads it);
#   - the article's scenarios 3 and 4 on the real GPU, and its demo.py (PyTorch, NCCL) under
#     mgpu-launch with world size 1;
#   - the main job on the GPU, with its startup timeline;
#   - start-to-exit of mgpu-launch with 7, 8 and 16 CPU workers of /bin/true.
# Everything lands in OUTDIR (default gpu-out); the last line says how many parts passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-gpu-out}
mkdir -p "$out"
cd "$root" || exit 2
export NCCL_NVLS_ENABLE=0 # KINDS.md: NVLink multicast stays off
source tests/gpu/lib.sh # part
torch_py=
for p in /opt/torch/.venv/bin/python3 python3 /usr/bin/python3; do
    "$p" -c 'import torch, torch.distributed' 2>/dev/null && { torch_py=$p; break; }
done
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,pci.bus_id,uuid --format=csv
  [ -n "$torch_py" ] && "$torch_py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
} >"$out/machine.txt" 2>&1
unit() { for t in test_kernels_cuda test_comm_nccl test_train_gpu test_devices; do
        "build/tests/$t" || return 1; done; }
part unit_gpu unit
part integration_gpu bash tests/run.sh integration test_gpu
part scenario3 bash scripts/scenario3.sh
part scenario4 bash scripts/scenario4.sh
if [ -n "$torch_py" ]; then
    part demo_py env PYTHON_EXEC="$torch_py" build/bin/mgpu-launch --nproc_per_node=1 scripts/demo.py
else
    echo "skip - demo_py: no python with torch here"
fi
part main_job bash scripts/main_job.sh metrics_file="$out/main_job_metrics.jsonl"
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
part launch_times launch_times
echo "$ok passed, $bad failed"
