#!/usr/bin/env bash
# tests/bench/gpt_bench.sh - mgpu-worker's GPT (model = gpt) on one GPU against PyTorch training
# the same model (tests/bench/gpt_torch_bench.py: nanoGPT's GPT with
# F.scaled_dot_product_attention, fused AdamW, bf16 autocast), eager and torch.compile, in one
# go on the same machine, at world size 1, at the shapes named on the command line: GPT-2's
# 124m (12 x 768, context 1024, batch 16), 124m-2k (context 2048, batch 8), 350m (24 x 1024, 16
# heads), 774m (36 x 1280, 20 heads), h128 (12 x 1536, 12 heads of 128), 1.5b (48 x 1600, 25
# heads, batch 4), all with the vocabulary 50304; small (the byte model of
# configs/bench_gpt_small.cfg); or L=24,D=1024,H=16,T=1024,B=8[,V=50304] (layers, width, heads,
# context, batch, vocabulary). Builds nothing: it runs $MGPU_BUILD/bin/mgpu-worker as built.
#
#   1. synthetic tokens: 8,388,609 random little-endian uint16 ids below each vocabulary, in
#      OUTDIR/work (every batch full, so that the step is replayed from a CUDA graph);
#   2. per shape and precision (bf16, then fp32): mgpu-worker, RUNS runs, with the shape's cfg
#      (configs/bench_gpt_*.cfg; the generic form: bench_gpt_124m.cfg) and the shape's
#      key=values, max_steps sized from the model's FLOPs so that the timed steps take about
#      MGPU_TIME_S; tokens/s from the final metrics line's step_us (CUDA events over the steps
#      after timing_warmup), the median of the runs; a shape the worker refuses (its
#      `mgpu-worker --check` fails) or cannot run is said so in the table, with its message;
#      then PyTorch, one process per variant: eager, and compiled in bf16 (TORCH_COMPILE_BUDGET_S
#      per shape); eager alone at fp32, the row where mgpu must be at least as fast as eager;
#   3. after the shapes, with 124m among them: bare bf16 products of the 124M step's GEMM
#      shapes and an 8192^3 square (the denominator of "the step's GEMMs at X% of the bare
#      product"); with GEMM_PROFILE=1, 20 steps of mgpu-worker and 10 of PyTorch eager at 124M
#      under Nsight Systems (nsys, CUDA graphs traced node by node): the time of their GEMM
#      kernels per step; without nsys, mgpu's side alone through build/lib/libmgpu_trace.so;
#   4. the table (also OUTDIR/table.md) of every shape whose results OUTDIR holds (a run into
#      one that holds other shapes' results replaces those of its own shapes and keeps the rest,
#      so that a run too long for one call can be split): per shape and precision tokens/s of
#      each, mgpu over compiled (bf16, target 1.2x; 1.5x for the small model) and over eager
#      (fp32, target 1.0x), model FLOP utilisation, peak GPU memory of each process
#      (nvidia-smi's per-process used memory sampled every 200 ms, or the device's used memory
#      above what it was before the run when no process is listed) and PyTorch's
#      max_memory_allocated.
#
# Every variant is bounded: a worker run by MGPU_TIMEOUT_S, a compile by its budget, and the
# whole call by DEADLINE_S: what is left when it comes is reported as skipped, and the table is
# still written.
#
# usage: tests/bench/gpt_bench.sh [OUTDIR [SHAPE ...] [key=value ...]]
#        SHAPEs as above (default: SHAPES, or "124m small"); key=values (lower-case keys) go to
#        mgpu-worker after the shape's own. Environment: MGPU_BUILD: build dir; RUNS: mgpu runs
#        per shape and precision, default 3 with up to two shapes, else 1 (and one when a run
#        takes over 60 s); PRECISIONS: default "bf16 fp32" (fp32: no TF32 on either side; tf32:
#        TF32 products on both); MGPU_TIME_S: seconds of a worker run's timed steps, default 4;
#        MGPU_TIMEOUT_S: the most one worker run may take, default 150; PYTHON: default
#        python3; SKIP_TORCH_COMPILE=1 leaves out the compiled variant;
#        TORCH_COMPILE_BUDGET_S: seconds one shape's compile may take, default 120;
#        TORCH_WINDOW_S: seconds of each of PyTorch's 5 timed windows, default 1; TORCH_ARGS:
#        more options of gpt_torch_bench.py run, e.g. "--compile-mode max-autotune";
#        DEADLINE_S: the most the whole call may take, default 540; GEMMS=0 leaves out part 3;
#        GEMM_PROFILE=1 adds its profiled runs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
PY=${PYTHON:-python3}
bench=$here/gpt_torch_bench.py
if [ $# -gt 0 ] && [ ! -d "$1" ] && "$PY" "$bench" spec bf16 1 "$1" >/dev/null 2>&1; then
    echo "gpt_bench.sh: the first argument is the output folder, not a shape ('$1')" \
        "(usage: gpt_bench.sh OUTDIR [SHAPE ...] [key=value ...])" >&2
    exit 2
fi
OUT=${1:-$(mktemp -d)}
[ $# -gt 0 ] && shift
shapes=()
wargs=()
for a in "$@"; do
    case $a in
    [a-z_]*=*) wargs+=("$a") ;; # a worker key=value; the generic shape's keys are capitals
    *) shapes+=("$a") ;;
    esac
done
# shellcheck disable=SC2206 # SHAPES is a list of names
[ ${#shapes[@]} -eq 0 ] && shapes=(${SHAPES:-124m small})
PRECISIONS=${PRECISIONS:-bf16 fp32}
for p in $PRECISIONS; do
    case $p in
    bf16 | tf32 | fp32) ;;
    *)
        echo "gpt_bench.sh: PRECISIONS: unknown precision '$p' (expected bf16, tf32, fp32)" >&2
        exit 2
        ;;
    esac
done
for v in RUNS DEADLINE_S TORCH_COMPILE_BUDGET_S MGPU_TIMEOUT_S TOKENS; do
    if ! [[ ${!v:-1} =~ ^[0-9]+$ ]]; then
        echo "gpt_bench.sh: $v='${!v}': expected a whole number" >&2
        exit 2
    fi
done
for v in MGPU_TIME_S TORCH_WINDOW_S; do
    if ! [[ ${!v:-1} =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
        echo "gpt_bench.sh: $v='${!v}': expected a number of seconds" >&2
        exit 2
    fi
done
# each shape known or well-formed before anything runs (the message names it and the known)
"$PY" "$bench" spec bf16 1 "${shapes[@]}" >/dev/null || exit 2
RUNS=${RUNS:-$([ ${#shapes[@]} -le 2 ] && echo 3 || echo 1)}
BUDGET=${TORCH_COMPILE_BUDGET_S:-120}
DEADLINE=${DEADLINE_S:-540}
TOKENS=${TOKENS:-8388609}
t_start=$(date +%s)
mkdir -p "$OUT/work"
OUT=$(cd "$OUT" && pwd)
W=$OUT/work
log=$OUT/bench.log
touch "$log" "$W/mgpu.jsonl" "$W/torch.jsonl" "$W/peaks.jsonl" "$W/profile.jsonl"
# this call's shapes replace their earlier results; the others' stay for the table
"$PY" "$bench" drop "$W/mgpu.jsonl" "$W/torch.jsonl" "$W/peaks.jsonl" "$W/profile.jsonl" \
    -- "${shapes[@]}"

say() { echo "$@" | tee -a "$log"; }
left() { echo $((DEADLINE - ($(date +%s) - t_start))); }
record_error() { # IMPL SHAPE MODE PRECISION TEXT: a record of a variant that gave no figure
    "$PY" -c 'import json, sys
print(json.dumps({"impl": sys.argv[1], "shape": sys.argv[2], "mode": sys.argv[3],
                  "precision": sys.argv[4], "error": sys.argv[5][-250:]}))' "$@"
}

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

say "gpt_bench: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n): ${shapes[*]}," \
    "precisions $PRECISIONS, deadline $DEADLINE s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1 | sed 's/^/  gpu: /' | tee -a "$log"
"$PY" -c 'import torch; print("  torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tee -a "$log"
# the commit, and whether the tree the binary was built from had changes beyond it
dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | head -c1)
say "  mgpu-worker: $BUILD/bin/mgpu-worker, $(git -C "$root" log -1 --format='%h %s' 2>/dev/null)$([ -n "$dirty" ] && echo ' (with uncommitted changes to tracked files)')"

# --- 1. tokens ---------------------------------------------------------------------------------
for v in $("$PY" "$bench" spec bf16 1 "${shapes[@]}" | cut -f2 | sort -u); do
    [ -s "$W/tokens_$v.bin" ] || "$PY" "$bench" tokens "$W/tokens_$v.bin" "$TOKENS" "$v" ||
        { say "cannot write $W/tokens_$v.bin"; exit 1; }
done

# --- 2. per shape and precision: mgpu-worker, then PyTorch -------------------------------------
mgpu_case() { # SHAPE PRECISION
    local s=$1 p=$2 tag vocab cfg args n i rc t0 lim
    IFS=$'\t' read -r tag vocab cfg args < <("$PY" "$bench" spec "$p" "${MGPU_TIME_S:-4}" "$s")
    cfg=$root/configs/$cfg
    # shellcheck disable=SC2206 # the spec's key=values, one word each
    local kv=($args data_tokens="$W/tokens_$vocab.bin" ${wargs[@]+"${wargs[@]}"})
    if [ "$(left)" -lt 20 ]; then
        say "  mgpu $s $p: skipped, the deadline of $DEADLINE s is reached"
        record_error mgpu "$s" mgpu "$p" "skipped: the deadline of $DEADLINE s was reached" \
            >>"$W/mgpu.jsonl"
        return
    fi
    "$BUILD/bin/mgpu-worker" --check "$cfg" "${kv[@]}" >"$W/mgpu_${tag}_${p}_check.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        say "  mgpu $s $p: the worker refuses the cfg (exit $rc):" \
            "$(tail -n 1 "$W/mgpu_${tag}_${p}_check.out")"
        "$PY" "$bench" mgpu "$s" "$rc" /dev/null "$W/mgpu_${tag}_${p}_check.out" /dev/null "$p" \
            >>"$W/mgpu.jsonl"
        return
    fi
    for i in $(seq "$RUNS"); do
        n=mgpu_${tag}_${p}_$i
        # MGPU_TIMEOUT_S, or what the deadline leaves less 10 s for the table
        lim=$(($(left) - 10))
        [ "$lim" -gt "${MGPU_TIMEOUT_S:-150}" ] && lim=${MGPU_TIMEOUT_S:-150}
        if [ "$lim" -lt 10 ]; then
            say "  mgpu $s $p run $i: skipped, the deadline of $DEADLINE s is reached"
            [ "$i" -eq 1 ] && record_error mgpu "$s" mgpu "$p" \
                "skipped: the deadline of $DEADLINE s was reached" >>"$W/mgpu.jsonl"
            break
        fi
        rm -f "$W/$n.jsonl"
        smi_start "$W/$n.smi"
        t0=$(date +%s)
        # a worker that runs but slowly (on the CPU, say) must not take the whole run's time
        timeout -k 5 "$lim" "$BUILD/bin/mgpu-worker" "$cfg" "${kv[@]}" \
            metrics_file="$W/$n.jsonl" >"$W/$n.out" 2>&1
        rc=$?
        smi_stop
        "$PY" "$bench" mgpu "$s" "$rc" "$W/$n.jsonl" "$W/$n.out" "$W/$n.smi" "$p" |
            tee -a "$W/mgpu.jsonl" >>"$log"
        say "  mgpu $s $p run $i: exit $rc, $(grep -h -m1 'step time' "$W/$n.out")"
        [ $rc -eq 0 ] || { sed 's/^/    /' "$W/$n.out" | tail -n 5 | tee -a "$log"; break; }
        if [ "$i" -lt "$RUNS" ] && [ $(($(date +%s) - t0)) -gt 60 ]; then
            say "  mgpu $s $p: a run took over 60 s, the other runs are left out"
            break
        fi
    done
}

torch_case() { # SHAPE MODE PRECISION
    local s=$1 m=$2 p=$3 tag n rc lim budget
    tag=$("$PY" "$bench" spec bf16 1 "$s" | cut -f1)
    n=torch_${tag}_${m}_$p
    lim=$(left)
    if [ "$lim" -lt 30 ]; then
        say "  torch $s $m $p: skipped, the deadline of $DEADLINE s is reached"
        record_error torch "$s" "$m" "$p" "skipped: the deadline of $DEADLINE s was reached" \
            >>"$W/torch.jsonl"
        return
    fi
    # a compile gets its budget or what the deadline leaves after the timed steps' minute
    budget=$BUDGET
    [ $((lim - 60)) -lt "$budget" ] && budget=$((lim - 60))
    [ "$budget" -lt 10 ] && budget=10
    smi_start "$W/$n.smi"
    # shellcheck disable=SC2086 # TORCH_ARGS is a list of options
    timeout -k 5 "$((lim - 10))" "$PY" "$bench" run --shapes "$s" --modes "$m" --precision "$p" \
        --compile-budget "$budget" --window-s "${TORCH_WINDOW_S:-1}" ${TORCH_ARGS:-} \
        >"$W/$n.jsonl" 2>"$W/$n.err"
    rc=$?
    smi_stop
    cat "$W/$n.jsonl" >>"$W/torch.jsonl"
    tee -a "$log" <"$W/$n.jsonl"
    "$PY" "$bench" peak "$s" "$m" "$W/$n.smi" "$p" >>"$W/peaks.jsonl"
    if [ $rc -ne 0 ]; then
        # the last line that says why: an out-of-memory error, a timeout's kill
        record_error torch "$s" "$m" "$p" \
            "exit $rc$([ $rc -eq 124 ] && echo ' (timeout)'): $(grep -v Warning "$W/$n.err" |
                grep -v '^ *$' | tail -n 1)" >>"$W/torch.jsonl"
        say "  torch $s $m $p: exit $rc"
        grep -v Warning "$W/$n.err" | tail -n 5 | tee -a "$log"
    fi
}

for s in "${shapes[@]}"; do
    say "2. $s: $("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1])
import gpt_torch_bench as b; print(b.describe(sys.argv[2]))' "$here" "$s")"
    for p in $PRECISIONS; do
        mgpu_case "$s" "$p"
        torch_case "$s" eager "$p"
        [ "$p" = bf16 ] && [ "${SKIP_TORCH_COMPILE:-0}" != 1 ] && torch_case "$s" compile "$p"
    done
done

# --- 3. the 124M step's GEMMs bare ---------------------------------------------------------------
has_124m=0
for s in "${shapes[@]}"; do [ "$s" = 124m ] && has_124m=1; done
[ $has_124m = 1 ] && [ "${GEMMS:-1}" != 0 ] && torch_case 124m gemm bf16

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
if [ "${GEMM_PROFILE:-0}" = 1 ] && [ $has_124m = 1 ] && [ "$(left)" -gt 60 ]; then
    say "3b. GEMM kernels of the 124M step under nsys"
    if command -v nsys >/dev/null; then
        nsys_case mgpu 20 "$BUILD/bin/mgpu-worker" "$root/configs/bench_gpt_124m.cfg" \
            data_tokens="$W/tokens_50304.bin" max_steps=20 timing_warmup=0 log_interval=0 \
            ${wargs[@]+"${wargs[@]}"}
        nsys_case torch 10 "$PY" "$bench" run --shapes 124m --modes eager --warmup 0 \
            --steps 10 --windows 1
    elif [ -f "$BUILD/lib/libmgpu_trace.so" ]; then
        # mgpu's side through the CUPTI injection library: every kernel of the graph replays
        # as the GPU ran them; the last 20 of 40 steps, a step ending with AdamW's kernel
        say "  (no nsys: mgpu's step through build/lib/libmgpu_trace.so, CUPTI)"
        CUDA_INJECTION64_PATH=$BUILD/lib/libmgpu_trace.so MGPU_TRACE_OUT=$W/trace_mgpu.csv \
            "$BUILD/bin/mgpu-worker" "$root/configs/bench_gpt_124m.cfg" \
            data_tokens="$W/tokens_50304.bin" max_steps=40 log_interval=0 \
            ${wargs[@]+"${wargs[@]}"} >"$W/trace_mgpu.out" 2>&1
        "$PY" "$bench" trace mgpu 124m 20 "$W/trace_mgpu.csv" adamw_multi |
            tee -a "$W/profile.jsonl" >>"$log"
    else
        say "  neither nsys nor build/lib/libmgpu_trace.so: no GEMM time per step"
    fi
fi

# --- 4. table ----------------------------------------------------------------------------------
say ""
"$PY" "$bench" table "$W/mgpu.jsonl" "$W/torch.jsonl" "$W/peaks.jsonl" "$W/profile.jsonl" \
    >"$OUT/table.md"
tee -a "$log" <"$OUT/table.md"
say ""
say "outputs in $OUT (table.md: every shape's results in OUT; bench.log, work/)"
