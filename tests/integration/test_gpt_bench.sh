# test_gpt_bench.sh - the GPT's GPU check and benchmark scripts, checked without a GPU:
# tests/gpu/gpt_train_checks.sh skips where there is none and judges loss curves right (fed a
# stand-in mgpu-worker that writes chosen losses), and tests/bench/gpt_torch_bench.py's
# helpers (synthetic tokens, a worker run's record, the table) need no torch.

BENCH=$MGPU_ROOT/tests/bench/gpt_torch_bench.py
CHECKS=$MGPU_ROOT/tests/gpu/gpt_train_checks.sh

# a stand-in worker: per-step losses of a decaying curve, scaled by 1 + DRIFT on the CPU
# backend (CUDA_VISIBLE_DEVICES empty) and in bf16 and by 1 + GDRIFT with cuda_graph=false,
# and the final line naming its backend and whether a CUDA graph ran (not said with NOGRAPH)
fake_worker() {
    mkdir -p fake/bin
    cat >fake/bin/mgpu-worker <<'EOF'
#!/usr/bin/env bash
m= p=tf32 n=20 g=true
grep -q 'max_steps = 500' "$1" && n=500
ck=
for a in "$@"; do
    case $a in
    metrics_file=*) m=${a#*=} ;; precision=*) p=${a#*=} ;; max_steps=*) n=${a#*=} ;;
    cuda_graph=*) g=${a#*=} ;; checkpoint=*) ck=${a#*=} ;;
    esac
done
# a checkpoint holds the last step; a run that finds one goes on from it (RDRIFT: its losses
# drift, as a resume that lost the weights' bf16 copy would)
s=0
[ -n "$ck" ] && [ -f "$ck" ] && s=$(cat "$ck")
b=cuda
[ "${CUDA_VISIBLE_DEVICES-x}" = "" ] && b=cpu && g=false
[ -n "${NOGRAPH:-}" ] && g=
# the first line says which path bf16 took (NOBF16PATH: the fp32 activations' one)
[ "$p" = bf16 ] && [ -z "${NOBF16PATH:-}" ] && a="; bf16 activations"
echo "gpt: 10 parameters (6 layers, 6 heads, 384 wide, context 256, vocab 256${a:-}); ..."
awk -v n=$n -v p=$p -v b=$b -v g="$g" -v d="${DRIFT:-0}" -v gd="${GDRIFT:-0}" -v s=$s \
    -v rd="${RDRIFT:-0}" 'BEGIN {
    for (i = s + 1; i <= n; i++) {
        l = 5.5 * exp(-i / 200) + 1
        if (p == "bf16" || b == "cpu") l *= 1 + d
        if (g == "false") l *= 1 + gd
        if (s > 0) l *= 1 + rd
        printf "{\"epoch\":1,\"step\":%d,\"loss\":%.7f}\n", i, l
    }
    printf "{\"final\":true,\"loss\":1,\"backend\":\"%s\"%s}\n", b,
        g == "" ? "" : ",\"cuda_graph\":" g }' >"$m"
[ -n "$ck" ] && echo "$n" >"$ck"
EOF
    chmod +x fake/bin/mgpu-worker
}

t_gpt_train_checks_skip_without_a_gpu() {
    fake_worker
    MGPU_GPU_PRESENT=0 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >out 2>&1
    expect_eq "$?" 77 "exit status without a GPU"
    expect_grep out '^skip - gpt_gpu_matches_cpu$'
    expect_grep out '^skip - gpt_bf16_tracks_fp32$'
    expect_grep out '^skip - gpt_graph_matches_eager$'
    out=$PWD
    source "$MGPU_ROOT/tests/gpu/lib.sh"
    expect_grep "$(judge 77 out 0)" '^skip - '
}

t_gpt_train_checks_judge_the_curves() {
    fake_worker
    MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >same 2>&1
    expect_eq "$?" 0 "exit status with matching curves ($(cat same))"
    expect_grep same '^ok - gpt_gpu_matches_cpu$'
    expect_grep same '^ok - gpt_bf16_tracks_fp32$'
    expect_grep same '^ok - gpt_graph_matches_eager$'
    expect_grep same '^ok - gpt_bf16_resume_matches$'
    expect_eq "$(grep -c 'gpt_graph_matches_eager' same)" 1 "one verdict for both precisions"
    # the CPU run's metrics stay in its file: on a GPU machine the part passes
    out=$PWD
    source "$MGPU_ROOT/tests/gpu/lib.sh"
    expect_eq "$(judge 0 same 1)" ok "the verdict of h200_checks.sh on it"
    # 5e-5 is inside both tolerances; 3% is outside both
    DRIFT=0.00005 MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >close 2>&1
    expect_eq "$?" 0 "exit status with curves 5e-5 apart ($(cat close))"
    DRIFT=0.03 MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >apart 2>&1
    expect_eq "$?" 1 "exit status with curves 3% apart"
    expect_grep apart '^not ok - gpt_gpu_matches_cpu: relative difference 0\.029[0-9]* > 0\.0001$'
    expect_grep apart '^not ok - gpt_bf16_tracks_fp32: relative difference 0.03 > 0.02$'
    # the graph against the eager step: 1e-6 in fp32
    GDRIFT=0.00001 MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >gapart 2>&1
    expect_eq "$?" 1 "exit status with graph and eager losses 1e-5 apart"
    expect_grep gapart '^ok - gpt_gpu_matches_cpu$'
    expect_grep gapart '^not ok - gpt_graph_matches_eager: relative difference [0-9.e-]* > 1e-06$'
    # a worker that never says it replayed a graph (it ignored cuda_graph) fails it
    NOGRAPH=1 MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >nograph 2>&1
    expect_eq "$?" 1 "exit status when no run says cuda_graph"
    expect_grep nograph '^not ok - gpt_graph_matches_eager: cuda_graph None in .* expected true'
    # a resumed run whose losses leave the straight run's fails the resume check
    RDRIFT=0.00001 MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >rapart 2>&1
    expect_eq "$?" 1 "exit status with resumed losses 1e-5 apart"
    expect_grep rapart '^not ok - gpt_bf16_resume_matches: relative difference [0-9.e-]* > 0$'
    expect_grep rapart '^ok - gpt_graph_matches_eager$'
    # a bf16 run that kept its activations in fp32 fails the bf16 check
    NOBF16PATH=1 MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >nopath 2>&1
    expect_eq "$?" 1 "exit status when the bf16 run did not take the bf16 path"
    expect_grep nopath '^not ok - gpt_bf16_tracks_fp32: the bf16 run did not take the bf16 path'
    expect_grep nopath '^ok - gpt_gpu_matches_cpu$'
    # a worker that cannot train a GPT fails both checks by name
    printf '#!/bin/sh\necho "mgpu-worker: error: model = gpt" >&2\nexit 2\n' >fake/bin/mgpu-worker
    MGPU_GPU_PRESENT=1 MGPU_BUILD=$PWD/fake bash "$CHECKS" o >refused 2>&1
    expect_eq "$?" 1 "exit status when the worker refuses"
    expect_grep refused '^not ok - gpt_gpu_matches_cpu: .*no final metrics line'
    expect_grep refused 'mgpu-worker: error: model = gpt'
}

t_gpt_bench_helpers() {
    python3 "$BENCH" tokens tok.bin 1001 300 >out 2>&1
    expect_eq "$?" 0 "exit status of tokens ($(cat out))"
    expect_eq "$(stat -c %s tok.bin)" 2002 "size of 1001 uint16 tokens"
    expect_eq "$(od -An -v -tu2 tok.bin | tr -s ' ' '\n' | sed '/^$/d' | sort -n | tail -n 1 |
        awk '{ print ($1 < 300) }')" 1 "every token below the vocabulary"
    python3 "$BENCH" tokens tok.bin 10 70000 >out 2>&1
    expect_eq "$?" 2 "exit status of a vocabulary over 65536"
    expect_grep out 'VOCAB 70000 in 1..65536'
    # a refused cfg and a run with its step time
    echo "mgpu-worker: error: x.cfg:11: model = 'gpt': expected one of linear, mlp" >refused.out
    python3 "$BENCH" mgpu small 2 /dev/null refused.out /dev/null >mgpu.jsonl
    printf '%s\n' '{"step":1,"loss":9}' '{"final":true,"step_us":32768,"backend":"cuda"}' >m.jsonl
    printf '%s\n' '1234, 7000' '1234, 9100' >run.smi.apps
    python3 "$BENCH" mgpu 124m 0 m.jsonl /dev/null run.smi >>mgpu.jsonl
    expect_grep mgpu.jsonl '"tokens_per_s": 500000.0, "tokens_per_s_from": "step_us"'
    expect_grep mgpu.jsonl '"process_peak_mib": 9100'
    printf '%s\n' '{"impl":"torch","shape":"124m","mode":"compile","tokens_per_s":400000}' \
        '{"impl":"torch","shape":"small","mode":"compile","error":"compile ran past 9 s"}' \
        >t.jsonl
    # nsys's kernel summary: the GEMM kernels' time a step against the bare products
    printf '%s\n' 'Processing [p.sqlite] with [cuda_gpu_kern_sum.py]...' \
        '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Name"' \
        '"50.0","6,000,000","200","30000","nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT"' \
        '"25.0","3000000","20","150000","attention_backward_kernel(float *)"' \
        '"25.0","3000000","200","15000","sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n"' >k.csv
    python3 "$BENCH" kernels mgpu 124m 20 k.csv >p.jsonl
    expect_grep p.jsonl '"gemm_us_per_step": 450.0, "kernels_us_per_step": 600.0'
    echo '{"impl":"torch","shape":"124m","mode":"gemm_total","us_per_step":405,"flops_per_step":2e11,"tflops":500}' >>t.jsonl
    python3 "$BENCH" table mgpu.jsonl t.jsonl p.jsonl >table 2>&1
    expect_eq "$?" 0 "exit status of table ($(cat table))"
    expect_grep table '^\| 124m \| bf16 \| 500\.0k \| - \| 400\.0k \| 1\.250x \| - \| >= 1\.2x compiled \| yes \|'
    expect_grep table '^\| small \| bf16 \| not run: exit 2: .* \| - \| error: compile ran past 9 s \| - \| - \| >= 1\.5x compiled \| - \|'
    expect_grep table "^small bf16: mgpu-worker did not run the GPT on the GPU here \(exit 2: .*'gpt'"
    expect_grep table '^small bf16: torch compile: compile ran past 9 s$'
    # mgpu's process memory against compiled's
    expect_grep table '^\| 124m \| bf16 \| 9,100 \| .* \| - \|$'
    echo '{"impl":"torch","shape":"124m","mode":"compile","peak_of_run":true,"process_peak_mib":9000}' >pk.jsonl
    python3 "$BENCH" table mgpu.jsonl t.jsonl pk.jsonl >mem 2>&1
    expect_grep mem '^\| 124m \| bf16 \| 9,100 \| - \| - \| - \| 9,000 \| - \| no \|$'
    # an fp32 row is judged against eager
    printf '%s\n' '{"impl":"torch","shape":"124m","mode":"eager","precision":"fp32","tokens_per_s":100000}' >t32.jsonl
    python3 "$BENCH" mgpu 124m 0 m.jsonl /dev/null run.smi fp32 >m32.jsonl
    python3 "$BENCH" table mgpu.jsonl t.jsonl m32.jsonl t32.jsonl >fp32 2>&1
    expect_grep fp32 '^\| 124m \| fp32 \| 500\.0k \| 100\.0k \| - \| - \| 5\.000x \| >= 1\.0x eager \| yes \|'
    # drop forgets the named shapes' records and keeps the others'
    # a worker stopped by its time limit says so
    echo 'epoch 1/1 step 50/220 loss 5.5 tokens/s 84687' >slow.out
    python3 "$BENCH" mgpu 350m 124 /dev/null slow.out /dev/null bf16 >slow.jsonl
    expect_grep slow.jsonl '"error": "exit 124 \(stopped by its time limit\): epoch 1/1 step 50'
    cp mgpu.jsonl d.jsonl
    python3 "$BENCH" drop d.jsonl -- 124m
    expect_eq "$(grep -c '"shape": "small"' d.jsonl) $(grep -c '"shape": "124m"' d.jsonl)" \
        "1 0" "records of small and 124m left after drop"
    expect_grep table "^124m: mgpu's GEMM kernels take 0\.450 ms a step .*: at 90\.0% of the bare products$"
    # a CUPTI trace (kernel_trace.c's CSV): the last 2 of 3 steps, each ending with AdamW
    {
        echo start_ns,end_ns,stream,kind,name
        t=0
        for step in 1 2 3; do
            for k in "nvjet_tst_256x128,$((step * 100))" "ln16_fwd_kernel,50" \
                "adamw_multi_kernel,10"; do
                echo "$t,$((t + ${k#*,})),7,k,${k%,*}"
                t=$((t + ${k#*,} + 5))
            done
        done
        echo "$t,$((t + 1000)),7,c,memcpy"
    } >trace.csv
    python3 "$BENCH" trace mgpu 124m 2 trace.csv adamw_multi >q.jsonl
    expect_grep q.jsonl '"gemm_us_per_step": 0.25, "kernels_us_per_step": 0.31'
    python3 "$BENCH" trace mgpu 124m 3 trace.csv adamw_multi >q.jsonl
    expect_grep q.jsonl '"error": "trace.csv: 3 steps ending in /adamw_multi/, expected 4'
    python3 "$BENCH" table mgpu.jsonl t.jsonl q.jsonl >table 2>&1
    expect_grep table "^124m: mgpu GEMMs under CUPTI trace: trace.csv: 3 steps"
}

# the shapes on the command line: each named one and the generic form resolve to a cfg that the
# real mgpu-worker accepts at both precisions; a wrong one is refused before anything runs
t_gpt_bench_shapes() {
    python3 "$MGPU_ROOT/tests/bench/gpt_torch_bench.py" tokens tok.bin 300000 50304 || exit 1
    local p tag v cfg args n=0
    for p in bf16 fp32; do
        while IFS=$'\t' read -r tag v cfg args; do
            # shellcheck disable=SC2086 # the spec's key=values, one word each
            "$WORKER" --check "$MGPU_ROOT/configs/$cfg" $args data_tokens=tok.bin >chk 2>&1
            expect_eq "$?" 0 "mgpu-worker --check of $tag at $p: $(cat chk)"
            n=$((n + 1))
        done < <(python3 "$BENCH" spec "$p" 4 124m 124m-2k 350m 774m h128 1.5b \
            L=24,D=1024,H=16,T=1024,B=8)
    done
    expect_eq "$n" 14 "shapes checked"
    python3 "$BENCH" spec bf16 4 1.5b h128 124m-2k >spec
    expect_grep spec $'^1\\.5b\t50304\tbench_gpt_1558m\\.cfg\tn_layer=48 n_head=25 n_embd=1600 context=1024 vocab=50304 batch_size=4 precision=bf16 max_steps=[0-9]* timing_warmup=[0-9]*$'
    expect_grep spec $'^h128\t.*n_layer=12 n_head=12 n_embd=1536 context=1024 .* batch_size=8 '
    expect_grep spec $'^124m-2k\t.*n_embd=768 context=2048 .* batch_size=8 '
    bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o 124m 350n >out 2>&1
    expect_eq "$?" 2 "exit status of an unknown shape"
    expect_grep out "unknown shape '350n' \(expected one of 124m, 124m-2k, 350m, 774m, h128, 1\.5b, small, or L=24,D=1024,H=16,T=1024,B=8\[,V=50304\]\)"
    [ ! -e o ] || fail "an unknown shape left o behind"
    bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o L=2,D=65,H=2,T=8,B=1 >out 2>&1
    expect_eq "$?" 2 "exit status of a generic shape whose width is no multiple of its heads"
    expect_grep out "shape 'L=2,D=65,H=2,T=8,B=1': D = 65 is not a multiple of H = 2"
    bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o L=2,D=64,H=2 >out 2>&1
    expect_eq "$?" 2 "exit status of a generic shape with letters missing"
    expect_grep out "shape 'L=2,D=64,H=2': T, B missing"
    bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" 124m 350m >out 2>&1
    expect_eq "$?" 2 "exit status of a shape where the output folder goes"
    expect_grep out "the first argument is the output folder, not a shape \('124m'\)"
    DEADLINE_S=9m bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o 124m >out 2>&1
    expect_eq "$?" 2 "exit status of a deadline that is no number"
    expect_grep out "DEADLINE_S='9m': expected a whole number"
    [ ! -e o ] || fail "a refused call left o behind"
    PRECISIONS="bf16 fp16" bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o small >out 2>&1
    expect_eq "$?" 2 "exit status of an unknown precision"
    expect_grep out "PRECISIONS: unknown precision 'fp16' \(expected bf16, tf32, fp32\)"
}

# the whole driver on the CPU, split in two calls into one OUTDIR: the real mgpu-worker (which
# runs on the CPU here, so gives no GPU figure) and PyTorch 1.13's CPU run of a tiny generic
# shape; the table holds both calls' shapes, a shape run again replaces its own rows, and a
# deadline that is spent skips what is left and still writes the table
t_gpt_bench_cpu_runs_merge() {
    need_torch 'import torch'
    skip_under_sanitizers "its time goes to PyTorch; make test runs it"
    export PYTHON=$PY TOKENS=20000 TORCH_WINDOW_S=0.05 RUNS=1
    export TORCH_ARGS="--device cpu --warmup 2 --windows 2 --steps 3"
    local a=L=1,D=32,H=2,T=16,B=2,V=256 b=L=2,D=32,H=4,T=8,B=2,V=300
    local cpu='not run: ran on backend cpu, not on the GPU'
    bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o "$a" max_steps=30 >one 2>&1
    expect_eq "$?" 0 "exit status of the first call ($(tail -n 5 one))"
    expect_grep one "^\| $a \| bf16 \| $cpu \| [0-9.]*k \| error: torch 1\.13.* has no torch\.compile \|"
    expect_grep one "^\| $a \| fp32 \| $cpu \| [0-9.]*k \| - \| - \| - \| >= 1\.0x eager \| - \|"
    # the command line's key=values come after the shape's
    expect_grep o/work/mgpu_L_1_D_32_H_2_T_16_B_2_V_256_fp32_1.out ' 30 steps of '
    expect_grep o/work/torch.jsonl '"precision": "fp32", "device": "cpu"'
    PRECISIONS=fp32 bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o "$b" >two 2>&1
    expect_eq "$?" 0 "exit status of the second call ($(tail -n 5 two))"
    expect_grep two "^\| $a \| bf16 \| $cpu \|"
    expect_grep two "^\| $a \| fp32 \| $cpu \|"
    expect_grep two "^\| $b \| fp32 \| $cpu \| [0-9.]*k \|"
    # run again in bf16 alone, a shape's rows are this call's: its fp32 row is gone
    PRECISIONS=bf16 SKIP_TORCH_COMPILE=1 bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o "$a" \
        >three 2>&1
    expect_eq "$(grep -c "^| $a | " three)" 2 "rows of the shape run again (two tables)"
    expect_eq "$(grep -c "\"shape\": \"$a\", \"mode\": \"eager\"" o/work/torch.jsonl)" 1 \
        "eager records of the shape run again"
    expect_grep three "^\| $b \| fp32 \| $cpu \|"
    DEADLINE_S=1 bash "$MGPU_ROOT/tests/bench/gpt_bench.sh" o "$b" >four 2>&1
    expect_eq "$?" 0 "exit status of a call past its deadline"
    expect_grep four "^\| $b \| bf16 \| not run: skipped: the deadline of 1 s was reached \| error: skipped"
    expect_grep four "^\| $a \| bf16 \| $cpu \|"
    expect_grep o/table.md "^\| $b \| bf16 \| not run: skipped"
}
