#!/usr/bin/env bash
# tests/bench/gpt_bench.sh - mgpu-worker's GPT (model = gpt) on one GPU against PyTorch training
# the same model (tests/bench/gpt_torch_bench.py: nanoGPT's GPT with
# F.scaled_dot_product_attention, fused AdamW, bf16 autocast), eager and torch.compile, in one
# go on the same machine, at world size 1, at the two shapes of configs/bench_gpt_124m.cfg
# (GPT-2 124M: 12 layers, 768 wide, context 1024, vocabulary 50304, batch 16) and
# configs/bench_gpt_small.cfg (6 layers, 384 wide, context 256, bytes, batch 64). Builds
# nothing: it runs $MGPU_BUILD/bin/mgpu-worker as built.
#
#   1. synthetic tokens: 8,388,609 random little-endian uint16 ids below each vocabulary, in
#      OUTDIR/work (every batch full, so that the step is replayed from a CUDA graph);
#   2. mgpu-worker, RUNS runs per shape: tokens/s from the final metrics line's step_us (CUDA
#      events over the steps after timing_warmup; tokens_per_s or the output's last "tokens/s"
#      when there is none), the median of the runs; a shape the worker refuses (its
#      `mgpu-worker --check` fails) or cannot run is said so in the table, with its message;
#   3. PyTorch, one process per shape and variant (eager, compiled), then bare bf16 products of
#      the 124M step's GEMM shapes and an 8192^3 square (the denominator of "the step's GEMMs
#      at X% of the bare product");
#   3b. with GEMM_PROFILE=1, 20 steps of mgpu-worker and 10 of PyTorch eager at 124M under
#      Nsight Systems (nsys, CUDA graphs traced node by node): the time of their GEMM kernels
#      per step, against the bare products of 3 ("the step's GEMMs at X%"); without nsys,
#      mgpu's side alone through build/lib/libmgpu_trace.so (CUPTI);
#   4. the table: tokens/s of each, mgpu over compiled against the targets (1.1x at 124M, 1.5x
#      for the small model), model FLOP utilisation, peak GPU memory of each process
#      (nvidia-smi's per-process used memory sampled every 200 ms, or the device's used memory
#      above what it was before the run when no process is listed) and PyTorch's
#      max_memory_allocated.
#
# usage: tests/bench/gpt_bench.sh [OUTDIR [key=value ...]]   the key=values go to mgpu-worker
#        (MGPU_BUILD: build dir, RUNS: default 3 (one when a run takes over 60 s),
#        MGPU_TIMEOUT_S: the most one worker run may take, default 150, PYTHON: default
#        python3, SHAPES: default "124m small", SKIP_TORCH_COMPILE=1 to leave out the compiled
#        variant, TORCH_COMPILE_BUDGET_S: seconds all of PyTorch's compiles may take together,
#        default 300: each compile gets what is left, one that runs past it is stopped and
#        reported, and those left when it is spent are skipped; TORCH_ARGS: more options of
#        gpt_torch_bench.py run, e.g. "--steps 40 --compile-mode max-autotune"; GEMM_PROFILE=1
#        adds part 3b: the 124M step's GEMM kernel time, mgpu's and PyTorch eager's, under
#        Nsight Systems, against the bare products: two profiled runs more)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
OUT=${1:-$(mktemp -d)}
[ $# -gt 0 ] && shift
RUNS=${RUNS:-3}
PY=${PYTHON:-python3}
SHAPES=${SHAPES:-"124m small"}
BUDGET=${TORCH_COMPILE_BUDGET_S:-300}
TOKENS=8388609
mkdir -p "$OUT/work"
OUT=$(cd "$OUT" && pwd)
W=$OUT/work
log=$OUT/bench.log
: >"$log"
: >"$W/mgpu.jsonl"
: >"$W/torch.jsonl"
: >"$W/peaks.jsonl"
bench=$here/gpt_torch_bench.py
source "$root/tests/gpu/lib.sh" # json_last

say() { echo "$@" | tee -a "$log"; }
vocab_of() { case $1 in 124m) echo 50304 ;; small) echo 256 ;; *) return 1 ;; esac; }
for s in $SHAPES; do
    vocab_of "$s" >/dev/null ||
        { echo "gpt_bench.sh: SHAPES: unknown shape '$s' (expected 124m, small)" >&2; exit 2; }
done

# GPU memory during a run, sampled by nvidia-smi into PREFIX.apps (pid, MiB of each process)
# and PREFIX.gpu (the device's used MiB), with PREFIX.base the device's used MiB before it.
smi_pids=
smi_start() { # PREFIX
    : >"$1.apps"
    : >"$1.gpu"
    : >"$1.base"
    smi_pids=
    command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >"$1.base" 2>/dev/null
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 200 \
        >"$1.apps" 2>/dev/null &
    smi_pids=$!
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 \
        >"$1.gpu" 2>/dev/null &
    smi_pids="$smi_pids $!"
}
smi_stop() {
    local p
    for p in $smi_pids; do
        kill "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    smi_pids=
}
trap smi_stop EXIT

say "gpt_bench: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1 | sed 's/^/  gpu: /' | tee -a "$log"
"$PY" -c 'import torch; print("  torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tee -a "$log"
say "  mgpu-worker: $BUILD/bin/mgpu-worker, $(git -C "$root" log -1 --format='%h %s' 2>/dev/null)"

# --- 1. tokens ---------------------------------------------------------------------------------
for s in $SHAPES; do
    v=$(vocab_of "$s")
    [ -s "$W/tokens_$v.bin" ] || "$PY" "$bench" tokens "$W/tokens_$v.bin" "$TOKENS" "$v" ||
        { say "cannot write $W/tokens_$v.bin"; exit 1; }
done

# --- 2. mgpu-worker ----------------------------------------------------------------------------
say "2. mgpu-worker, $RUNS runs per shape"
for s in $SHAPES; do
    v=$(vocab_of "$s")
    cfg=$root/configs/bench_gpt_$s.cfg
    "$BUILD/bin/mgpu-worker" --check "$cfg" data_tokens="$W/tokens_$v.bin" "$@" \
        >"$W/mgpu_${s}_check.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        say "  mgpu $s: the worker refuses the cfg (exit $rc):" \
            "$(tail -n 1 "$W/mgpu_${s}_check.out")"
        "$PY" "$bench" mgpu "$s" "$rc" /dev/null "$W/mgpu_${s}_check.out" /dev/null \
            >>"$W/mgpu.jsonl"
        continue
    fi
    for i in $(seq "$RUNS"); do
        n=mgpu_${s}_$i
        rm -f "$W/$n.jsonl"
        smi_start "$W/$n.smi"
        t0=$(date +%s)
        # a worker that runs but slowly (on the CPU, say) must not take the whole run's time
        timeout "${MGPU_TIMEOUT_S:-150}" "$BUILD/bin/mgpu-worker" "$cfg" \
            data_tokens="$W/tokens_$v.bin" metrics_file="$W/$n.jsonl" "$@" >"$W/$n.out" 2>&1
        rc=$?
        smi_stop
        "$PY" "$bench" mgpu "$s" "$rc" "$W/$n.jsonl" "$W/$n.out" "$W/$n.smi" |
            tee -a "$W/mgpu.jsonl" >>"$log"
        say "  mgpu $s run $i: exit $rc, $(grep -h -m1 'step time' "$W/$n.out")"
        [ $rc -eq 0 ] || { sed 's/^/    /' "$W/$n.out" | tail -n 5 | tee -a "$log"; break; }
        if [ "$i" -lt "$RUNS" ] && [ $(($(date +%s) - t0)) -gt 60 ]; then
            say "  mgpu $s: a run took over 60 s, the other runs are left out"
            break
        fi
    done
done

# --- 3. PyTorch --------------------------------------------------------------------------------
say "3. PyTorch (compile budget ${BUDGET} s in all)"
modes="eager compile"
[ "${SKIP_TORCH_COMPILE:-0}" = 1 ] && modes=eager
left=$BUDGET
torch_error() { # SHAPE MODE TEXT: a record of a variant that gave no figure
    "$PY" -c 'import json, sys
print(json.dumps({"impl": "torch", "shape": sys.argv[1], "mode": sys.argv[2],
                  "error": sys.argv[3][-250:]}))' "$@" >>"$W/torch.jsonl"
}
torch_case() { # SHAPE MODE
    local n=torch_$1_$2 rc t0 spent
    if [ "$2" = compile ] && [ "$left" -lt 10 ]; then
        say "  torch $1 $2: skipped, the compile budget of $BUDGET s is spent"
        torch_error "$1" "$2" "skipped: the compile budget of $BUDGET s is spent"
        return
    fi
    smi_start "$W/$n.smi"
    t0=$(date +%s)
    # shellcheck disable=SC2086 # TORCH_ARGS is a list of options
    timeout $((left + 120)) "$PY" "$bench" run --shapes "$1" --modes "$2" \
        --compile-budget "$left" ${TORCH_ARGS:-} >"$W/$n.jsonl" 2>"$W/$n.err"
    rc=$?
    smi_stop
    if [ "$2" = compile ]; then
        spent=$(json_last "$W/$n.jsonl" compile_s)
        [ "$spent" = nan ] && spent=$(($(date +%s) - t0))
        left=$((left - ${spent%.*}))
    fi
    cat "$W/$n.jsonl" >>"$W/torch.jsonl"
    tee -a "$log" <"$W/$n.jsonl"
    "$PY" "$bench" peak "$1" "$2" "$W/$n.smi" >>"$W/peaks.jsonl"
    if [ $rc -ne 0 ]; then
        torch_error "$1" "$2" "exit $rc: $(grep -v Warning "$W/$n.err" | tail -n 1)"
        say "  torch $1 $2: exit $rc"
        grep -v Warning "$W/$n.err" | tail -n 5 | tee -a "$log"
    fi
}
for s in $SHAPES; do
    for m in $modes; do
        torch_case "$s" "$m"
    done
done
case " $SHAPES " in *" 124m "*) torch_case 124m gemm ;; esac

# --- 3b. the step's GEMM time under Nsight Systems (GEMM_PROFILE=1) -----------------------------
# Every kernel of STEPS steps (the CUDA graph's nodes one by one), summed by name; the GEMM
# kernels' share per step is set against the bare products above.
nsys_case() { # IMPL STEPS CMD... : a profile of CMD, summarised into $W/profile.jsonl
    local impl=$1 steps=$2 rep=$W/prof_$1
    shift 2
    nsys profile -t cuda --cuda-graph-trace=node --force-overwrite true -o "$rep" "$@" \
        >"$W/prof_$impl.out" 2>&1
    # the report's name in current nsys, then in releases before 2023
    { nsys stats -q -r cuda_gpu_kern_sum -f csv "$rep.nsys-rep" ||
        nsys stats -q -r gpukernsum -f csv "$rep.nsys-rep"; } >"$W/prof_$impl.csv" \
        2>>"$W/prof_$impl.out"
    "$PY" "$bench" kernels "$impl" 124m "$steps" "$W/prof_$impl.csv" |
        tee -a "$W/profile.jsonl" >>"$log"
}
: >"$W/profile.jsonl"
if [ "${GEMM_PROFILE:-0}" = 1 ] && case " $SHAPES " in *" 124m "*) true ;; *) false ;; esac; then
    say "3b. GEMM kernels of the 124M step under nsys"
    if command -v nsys >/dev/null; then
        nsys_case mgpu 20 "$BUILD/bin/mgpu-worker" "$root/configs/bench_gpt_124m.cfg" \
            data_tokens="$W/tokens_50304.bin" max_steps=20 timing_warmup=0 log_interval=0 "$@"
        nsys_case torch 10 "$PY" "$bench" run --shapes 124m --modes eager --warmup 0 \
            --steps 10 --windows 1
    elif [ -f "$BUILD/lib/libmgpu_trace.so" ]; then
        # mgpu's side through the CUPTI injection library: every kernel of the graph replays
        # as the GPU ran them; the last 20 of 40 steps, a step ending with AdamW's kernel
        say "  (no nsys: mgpu's step through build/lib/libmgpu_trace.so, CUPTI)"
        CUDA_INJECTION64_PATH=$BUILD/lib/libmgpu_trace.so MGPU_TRACE_OUT=$W/trace_mgpu.csv \
            "$BUILD/bin/mgpu-worker" "$root/configs/bench_gpt_124m.cfg" \
            data_tokens="$W/tokens_50304.bin" max_steps=40 log_interval=0 "$@" \
            >"$W/trace_mgpu.out" 2>&1
        "$PY" "$bench" trace mgpu 124m 20 "$W/trace_mgpu.csv" adamw_multi |
            tee -a "$W/profile.jsonl" >>"$log"
    else
        say "  neither nsys nor build/lib/libmgpu_trace.so: no GEMM time per step"
    fi
fi

# --- 4. table ----------------------------------------------------------------------------------
say ""
"$PY" "$bench" table "$W/mgpu.jsonl" "$W/torch.jsonl" "$W/peaks.jsonl" "$W/profile.jsonl" |
    tee -a "$log"
say ""
say "outputs in $OUT (bench.log, work/)"
