# test_gpu_checks.sh - the pass/fail logic of tests/gpu/h200_checks.sh and multi_gpu_checks.sh
# (tests/gpu/lib.sh), fed recorded outputs, so that it is checked on machines without a GPU: on
# a machine with a GPU, a skipped test, simulated GPUs or a CPU run fail a check; without one, a
# part whose tests all skip is a skip, not a pass; a benchmark's failure is never hidden.

gpu_lib() { out=$TEST_TMP; source "$MGPU_ROOT/tests/gpu/lib.sh"; }
verdict() { judge "$1" "$2" "$3"; } # verdict RC FILE GPU

t_gpu_judge_with_a_gpu() {
    gpu_lib
    printf '%s\n' 'ok - test_gemm_fp32' 'ok - test_gemm_tf32' '3 passed, 0 failed' >all_ok
    expect_eq "$(verdict 0 all_ok 1)" ok "every test ran"
    printf '%s\n' 'ok - test_gemm_fp32' '  skip: no CUDA device' 'skip - test_nccl' >one_skip
    expect_grep "$(verdict 0 one_skip 1)" '^fail - skipped on a machine with a GPU'
    expect_grep "$(verdict 77 all_ok 1)" '^fail - skipped'
    printf '%s\n' 'GPUs: 8 [simulated] (simulated: MGPU_SIM_GPUS)' 'local rank 0 -> GPU 1' >sim
    expect_grep "$(verdict 0 sim 1)" '^fail - simulated GPUs'
    printf '%s\n' '+ mgpu-launch --nproc_per_node=4 configs/train.cfg   (0 GPU(s) visible)' >nogpu
    expect_grep "$(verdict 0 nogpu 1)" '^fail - ran on the CPU'
    printf '%s\n' "[rank0]:Let's use 0 GPUs!" >demo_cpu # demo.py falls back to gloo on the CPU
    expect_grep "$(verdict 0 demo_cpu 1)" '^fail - ran on the CPU'
    printf '%s\n' '{"final":true,"loss":0.01,"world_size":1,"backend":"cpu"}' >cpu_metrics
    expect_grep "$(verdict 0 cpu_metrics 1)" '^fail - ran on the CPU'
    printf '%s\n' '{"final":true,"loss":0.01,"world_size":1,"backend":"cuda"}' >cuda_metrics
    expect_eq "$(verdict 0 cuda_metrics 1)" ok "a run on the GPU"
    # test names are not what the tests saw: a test of the simulated mode may pass anywhere
    printf '%s\n' 'ok - test_sim_parse_errors_simulated' 'ok - test_gpu:t_gpu_none_visible_runs_on_cpu' >names
    expect_eq "$(verdict 0 names 1)" ok "result lines"
    expect_eq "$(verdict 1 all_ok 1)" "fail - exit 1" "a failing command"
    printf '%s\n' 'ok - test_nccl_refused' '  mgpu_comm_create(NCCL): rank 0 has no real (only a simulated) GPU' >words
    expect_eq "$(verdict 0 words 1)" ok "a test's own words about simulated GPUs"
    printf '%s\n' '{"world_size":4,"simulated_gpus": true}' >sim_json
    expect_grep "$(verdict 0 sim_json 1)" '^fail - simulated GPUs'
    # a test that needs more GPUs than there are is not a skipped GPU path; one that could run is
    printf '%s\n' 'ok - test_a' '  skip: fewer than 2 CUDA devices (1)' 'skip - test_nccl_gpus' \
        '1 passed, 0 failed, 1 skipped' >needs_more
    expect_eq "$(verdict 0 needs_more 1)" ok "a test for more GPUs than the machine has"
    printf '%s\n' 'ok - test_a' '  skip: fewer than 2 CUDA devices (2)' 'skip - test_nccl_gpus' >could_run
    expect_grep "$(verdict 0 could_run 1)" '^fail - skipped'
    printf '%s\n' 'ok - test_a' '  skip: fewer than 2 CUDA devices (1)' 'skip - test_nccl_gpus' \
        '  skip: no CUDA device' 'skip - test_b' >and_another
    expect_grep "$(verdict 0 and_another 1)" '^fail - skipped on a machine with a GPU \(  skip: no CUDA device\)'
}

t_gpu_judge_without_a_gpu() {
    gpu_lib
    printf '%s\n' '  skip: no CUDA device' 'skip - test_a' 'skip - test_b' '0 passed, 0 failed, 2 skipped' >all_skip
    expect_grep "$(verdict 0 all_skip 0)" '^skip - '
    expect_grep "$(verdict 77 all_skip 0)" '^skip - '
    printf '%s\n' 'ok - test_devices' 'skip - test_nccl' >some_ok
    expect_eq "$(verdict 0 some_ok 0)" ok "some tests ran"
    printf '%s\n' 'GPUs: 8 [simulated]' >sim
    expect_eq "$(verdict 0 sim 0)" ok "simulated GPUs where there is none"
    expect_eq "$(verdict 2 sim 0)" "fail - exit 2" "a failing command"
}

t_gpu_parts_and_benchmarks_counted_apart() {
    gpu_lib
    all_skip() { echo "skip - test_a"; echo "skip - test_b"; }
    cpu_run() { echo '{"final":true,"backend":"cpu"}'; }
    hidden() { false | cat; } # a failure in a pipeline's first stage
    MGPU_GPU_PRESENT=0 part p_ok true >log
    MGPU_GPU_PRESENT=0 part p_skip all_skip >>log
    MGPU_GPU_PRESENT=1 part p_skip_gpu all_skip >>log
    MGPU_GPU_PRESENT=1 part p_cpu cpu_run >>log
    MGPU_GPU_PRESENT=1 bench b_ok true >>log
    MGPU_GPU_PRESENT=1 bench b_hidden hidden >>log
    expect_grep log '^ok - p_ok$'
    expect_grep log '^skip - p_skip: '
    expect_grep log '^not ok - p_skip_gpu: skipped on a machine with a GPU'
    expect_grep log '^not ok - p_cpu: ran on the CPU'
    expect_grep log '^bench - b_ok$'
    expect_grep log '^bench not ok - b_hidden \(exit 1\)$'
    summary >sum && fail "summary said success: $(cat sum)"
    expect_eq "$(tail -n 1 sum)" "1 passed, 2 failed, 1 skipped" "summary line"
    expect_grep sum '^benchmarks: 1 ran, 1 failed$'
    ok=1 bad=0 skipped=0 bench_ok=1 bench_bad=0
    summary >sum || fail "summary said failure: $(cat sum)"
    expect_eq "$(tail -n 1 sum)" "1 passed, 0 failed" "summary line"
}

t_gpu_check_scripts_use_the_judged_helpers() {
    # every check goes through part or bench; the last word is summary's
    local f
    for f in h200_checks.sh multi_gpu_checks.sh; do
        f=$MGPU_ROOT/tests/gpu/$f
        bash -n "$f" || fail "$f does not parse"
        expect_eq "$(grep -v '^ *#' "$f" | grep -cE 'echo "\$ok passed')" 0 "hand-made summaries in $f"
        expect_eq "$(grep -v '^ *#' "$f" | sed '/^$/d' | tail -n 1)" summary "last line of $f"
    done
    expect_grep "$MGPU_ROOT/tests/gpu/h200_checks.sh" '^bench launch_times launch_times$'
}
