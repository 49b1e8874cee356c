# test_scenarios.sh - the article's scenarios (scripts/scenario1-4.sh) and its demo.py, as a
# user runs them. Without GPUs here, the scenarios simulate the article's 8-GPU machine.

TORCH_PY=${MGPU_TEST_TORCH_PYTHON:-/usr/bin/python3}

scenario() { # scenario N: runs scripts/scenarioN.sh, its output in out
    MGPU_LAUNCH="$LAUNCH" bash "$MGPU_ROOT/scripts/scenario$1.sh" >out 2>&1
    local rc=$?
    [ $rc -eq 0 ] || { cat out >&2; fail "scenario$1.sh exited $rc"; }
    expect_grep out '^Reproduced\.$'
    expect_no_grep out 'NOT REPRODUCED'
}

t_scenario1_two_of_four_visible() {
    scenario 1
    expect_grep out 'local rank 0 -> GPU 1'
    expect_grep out 'local rank 1 -> GPU 2'
    expect_grep out "rank 0's batches: 30 15"
}

t_scenario2_local_rank_is_a_process_number() {
    scenario 2
    expect_grep out 'local rank 3 -> GPU 4'
    expect_grep out "rank 3's batches: 23"
}

t_scenario3_all_visible() {
    scenario 3
    expect_grep out 'local rank 0 -> GPU 0'
}

t_scenario4_refused_then_shared() {
    scenario 4
    expect_grep out 'exit status of the refusal: 2'
    expect_grep out 'local rank 4 -> ordinal 0'
}

t_scenario_detects_a_wrong_result() {
    # the scripts must be able to fail: a launcher that ignores CUDA_VISIBLE_DEVICES (a fake
    # that strips it) makes scenario 1 report "Not reproduced" and exit 1
    cat >fake-launch <<EOF2
#!/usr/bin/env bash
unset CUDA_VISIBLE_DEVICES
exec "$LAUNCH" "\$@"
EOF2
    chmod +x fake-launch
    MGPU_LAUNCH=$PWD/fake-launch bash "$MGPU_ROOT/scripts/scenario1.sh" >out 2>&1 && fail "passed with a broken launcher"
    expect_grep out 'NOT REPRODUCED'
}

t_demo_py_unchanged_under_mgpu_launch() {
    "$TORCH_PY" -c 'import torch.distributed' 2>/dev/null || skip "no torch for $TORCH_PY"
    PYTHON_EXEC=$TORCH_PY "$LAUNCH" --nproc_per_node=2 "$MGPU_ROOT/scripts/demo.py" >out 2>err ||
        { cat err >&2; fail "demo.py failed"; }
    expect_eq "$(grep -c 'Outside: input size \[30, 5\]' out)" 2 "batches of 30"
    expect_eq "$(grep -c 'Outside: input size \[15, 5\]' out)" 2 "batches of 15"
    # the article's form: --local_rank=N passed by the launcher
    PYTHON_EXEC=$TORCH_PY "$LAUNCH" --nproc_per_node=2 --legacy_local_rank \
        "$MGPU_ROOT/scripts/demo.py" >out 2>err || { cat err >&2; fail "demo.py --local_rank"; }
    expect_grep out '^\[rank1\]:local_rank 1$'
}
