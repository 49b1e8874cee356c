# test_transformer_ref.sh - the GPT ops' C reference (kernels/transformer.c) against PyTorch:
# test_transformer_ref --dump writes a tiny GPT's weights, tokens, loss, gradients and one
# clipped AdamW step; tests/unit/transformer_ref_torch.py recomputes them with torch in float64
# and compares to 1e-5 relative. Debian's python3-torch is importable from /usr/bin/python3
# only (the python3 first on PATH is a separate build).


t_gpt_reference_matches_torch() {
    [ -x "$PY" ] || skip "$PY not found"
    "$PY" -c 'import torch' >/dev/null 2>&1 ||
        skip "torch is not importable from $PY (apt-get install python3-torch)"
    "$MGPU_BUILD/tests/test_transformer_ref" --dump gpt.bin >out 2>err
    expect_eq "$?" 0 "exit status of test_transformer_ref --dump ($(cat err))"
    OMP_NUM_THREADS=1 "$PY" "$MGPU_ROOT/tests/unit/transformer_ref_torch.py" gpt.bin >cmp 2>&1
    local rc=$?
    cat cmp
    expect_eq "$rc" 0 "exit status of transformer_ref_torch.py"
    expect_grep cmp '^dwte '
    expect_grep cmp '^dh1\.qkv\.w '
    expect_grep cmp '^adamw lnf\.b '
    expect_grep cmp '^largest relative difference'
}

t_gpt_reference_dump_refuses_bad_file() {
    [ -x "$PY" ] || skip "$PY not found"
    "$PY" -c 'import torch' >/dev/null 2>&1 || skip "torch is not importable from $PY"
    printf 'NOTGPT\0\0' >bad.bin
    "$PY" "$MGPU_ROOT/tests/unit/transformer_ref_torch.py" bad.bin >cmp 2>&1
    expect_eq "$?" 1 "exit status on a file of another layout"
    expect_grep cmp 'bad.bin: not a GPTREF1 file'
}
