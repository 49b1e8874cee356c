# test_weights.sh - GPT-2 weights in and out of mgpu-worker against the real clients: files
# written by Hugging Face's safetensors package (F32 and BF16) and in llm.c's layout (fp32 and
# bf16) give the loss Debian's PyTorch computes from the same tensors; an export holds the
# trained parameters exactly under GPT2LMHeadModel's names and Conv1D layout, and loads back
# to the same loss; weights that do not fit the cfg are refused by name; the GPU check against
# transformers skips without a GPU and fails without transformers. The Python side
# (tests/unit/gpt_weights_ref.py) needs torch and safetensors from /usr/bin/python3 and skips
# without them.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES
export MGPU_SIM_GPUS=0
export OMP_NUM_THREADS=1

REF=$MGPU_ROOT/tests/unit/gpt_weights_ref.py

# A token file (ids below 50) and a cfg that measures the loss of the first 4 windows: one
# step at lr 0, no shuffle, the embedding padded from 50 rows to vocab 56, context 16 of 24.
setup_run() {
    need_torch 'import torch, safetensors.torch'
    python3 -c '
import struct
ids = [(i * 7 + i // 13) % 50 for i in range(3000)]
open("t.bin", "wb").write(struct.pack("<%dH" % len(ids), *ids))'
    cat >t.cfg <<'EOF'
model = gpt
dataset = tokens
data_tokens = t.bin
vocab = 56
n_layer = 2
n_head = 2
n_embd = 32
context = 16
batch_size = 4
max_steps = 1
lr = 0
weight_decay = 0
shuffle = false
log_interval = 1
eval_fraction = 0
backend = cpu
EOF
}

# step1_loss METRICS: the loss logged at step 1
step1_loss() {
    python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if json.loads(l).get("step") == 1][0]["loss"])' "$1"
}

# agree MINE REF_OUTPUT WHAT: mgpu's loss within 1e-5 relative of PyTorch's, and PyTorch's loss
# with the Conv1D weights untransposed off by more than 1e-3 (the check can tell them apart)
agree() {
    local mine=$1 out=$2 what=$3
    python3 - "$mine" "$out" "$what" <<'EOF' || fail "$3: the losses differ"
import sys
mine, what = float(sys.argv[1]), sys.argv[3]
ref = {l.split()[0]: float(l.split()[1]) for l in open(sys.argv[2])}
print(f"{what}: mgpu {mine:.9f} torch {ref['loss']:.9f} untransposed {ref['untransposed']:.9f}")
assert abs(ref["untransposed"] - ref["loss"]) > 1e-3 * ref["loss"], "the transposes go untested"
sys.exit(0 if abs(mine - ref["loss"]) <= 1e-5 * abs(ref["loss"]) else 1)
EOF
}

t_weights_hf_safetensors_give_torchs_loss() {
    setup_run
    local dt
    "$PY" "$REF" make hf_F32 50 24 32 2 2 7 F32 + make hf_BF16 50 24 32 2 2 7 BF16 \
        + loss hf_F32/model.safetensors t.bin 16 4 56 out=ref_F32 \
        + loss hf_BF16/model.safetensors t.bin 16 4 56 out=ref_BF16 || fail "gpt_weights_ref.py"
    for dt in F32 BF16; do
        "$WORKER" t.cfg init_from=hf_$dt/model.safetensors metrics_file=m_$dt.jsonl >out 2>err ||
            { cat out err >&2; fail "init_from a $dt file: exit $?"; }
        expect_grep out "^init_from: hf_$dt/model.safetensors \(Hugging Face safetensors, $dt, 28 tensors; wte 50 of the cfg's 56 rows \(the rest zero\), wpe 16 of 24 positions\)"
        agree "$(step1_loss m_$dt.jsonl)" ref_$dt "$dt safetensors"
    done
}

t_weights_export_holds_the_trained_model_and_loads_back() {
    setup_run
    mkdir out
    # trained from the seed: 6 steps that change every parameter
    "$WORKER" t.cfg max_steps=6 lr=0.01 weight_decay=0.1 shuffle=true export=out/model.safetensors \
        checkpoint=c.ckpt >out1 2>err1 || { cat out1 err1 >&2; fail "train and export: exit $?"; }
    expect_grep out1 '^export: out/model.safetensors and config.json beside it \(27776 parameters, F32\)$'
    "$PY" "$REF" same out/model.safetensors c.ckpt 2 out=cmp + make hf 50 24 32 2 2 7 F32 \
        + loss out/model.safetensors t.bin 16 4 56 out=ref >err0 2>&1 ||
        { cat cmp err0 >&2; fail "export differs"; }
    cat cmp
    python3 - <<'EOF' || fail "config.json"
import json
c = json.load(open("out/config.json"))
want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 56,
        "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 2,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
print(bad or "config.json: as GPT2Config writes it")
assert not bad
EOF
    # the export's loss in PyTorch and in mgpu loading it back
    "$WORKER" t.cfg init_from=out/model.safetensors metrics_file=m.jsonl >out2 2>err2 ||
        { cat out2 err2 >&2; fail "init_from the export: exit $?"; }
    agree "$(step1_loss m.jsonl)" ref "the export"
    # the folder, as from_pretrained takes it: the same weights, the same loss
    "$WORKER" t.cfg init_from=out metrics_file=m2.jsonl >out2 2>err2 ||
        { cat out2 err2 >&2; fail "init_from the export's folder: exit $?"; }
    expect_eq "$(step1_loss m2.jsonl)" "$(step1_loss m.jsonl)" "the folder's first loss"
    # and a folder to export to, as save_pretrained takes it
    mkdir again
    "$WORKER" t.cfg init_from=out max_steps=1 lr=0 export=again >out2 2>err2 ||
        { cat out2 err2 >&2; fail "export to a folder: exit $?"; }
    expect_grep out2 '^export: again/model.safetensors and config.json beside it'
    [ -s again/model.safetensors ] && [ -s again/config.json ] || fail "again/: $(ls again)"
    # Hugging Face's file through mgpu and out again: the same tensors (lr 0)
    mkdir back
    "$WORKER" t.cfg init_from=hf/model.safetensors vocab=50 context=24 \
        export=back/model.safetensors >out3 2>err3 || { cat out3 err3 >&2; fail "round trip: exit $?"; }
    "$PY" "$REF" equal hf/model.safetensors back/model.safetensors >cmp3 2>&1 ||
        { cat cmp3 >&2; fail "the round trip changed the tensors"; }
    cat cmp3
}

t_weights_llmc_checkpoint_gives_torchs_loss() {
    setup_run
    "$PY" "$REF" make hf 50 24 32 2 2 7 F32 + llmc hf/model.safetensors gpt2_v3.bin 3 64 \
        + llmc hf/model.safetensors gpt2_v5.bin 5 64 \
        + loss hf/model.safetensors t.bin 16 4 56 out=ref_3 \
        + loss hf/model.safetensors t.bin 16 4 56 llmc-bf16 out=ref_5 || fail "gpt_weights_ref.py"
    local v
    for v in 3 5; do
        "$WORKER" t.cfg init_from=gpt2_v$v.bin metrics_file=m_$v.jsonl >out 2>err ||
            { cat out err >&2; fail "init_from llm.c version $v: exit $?"; }
        expect_grep out "^init_from: gpt2_v$v.bin \(llm.c checkpoint, $([ $v = 3 ] && echo fp32 || echo bf16); wte 50 of the cfg's 56 rows \(padded vocab 64\), wpe 16 of 24 positions\)"
        agree "$(step1_loss m_$v.jsonl)" ref_$v "llm.c version $v"
    done
}

# check_refused EXPECTED_MESSAGE KEY=VALUE...: --check of t.cfg with the overrides exits 2
# with a message that names the problem.
check_refused() {
    local want=$1
    shift
    "$WORKER" --check t.cfg "$@" >out 2>err
    expect_eq "$?" 2 "exit status of --check with $*"
    expect_grep err "$want"
}

t_weights_misfits_are_refused_by_name() {
    setup_run
    "$PY" "$REF" make hf 50 24 32 2 2 7 F32 + llmc hf/model.safetensors g.bin 3 64 || fail "make"
    check_refused "command line: init_from: .*hf/model.safetensors: tensor 'transformer.wte.weight' has shape \[50, 32\], expected \[at most vocab = 48, n_embd = 32\]" \
        init_from=hf/model.safetensors vocab=48
    check_refused "tensor 'transformer.wpe.weight' has shape \[24, 32\], expected \[at least context = 32" \
        init_from=hf/model.safetensors context=32
    check_refused "no tensor 'transformer.h.2.ln_1.weight' \(the cfg's GPT-2 has n_layer = 3\)" \
        init_from=hf/model.safetensors n_layer=3
    check_refused "hf/config.json: n_head 2, the cfg has n_head = 4" \
        init_from=hf/model.safetensors n_head=4
    check_refused "g.bin: llm.c header: 2 layers, 2 heads, 32 channels; the cfg has n_layer = 2, n_head = 2, n_embd = 48" \
        init_from=g.bin n_embd=48 n_head=2
    head -c 5000 g.bin >short.bin
    check_refused "short.bin: 5000 bytes, expected [0-9]+ \(a 1024-byte header and [0-9]+ fp32 parameters\): truncated" \
        init_from=short.bin
    head -c 100 g.bin >stub.bin
    check_refused "stub.bin: llm.c's weights \(magic 20240326\) cut short: 100 bytes, its header alone is 1024" \
        init_from=stub.bin
    check_refused "missing.bin: cannot open init_from: No such file" init_from=missing.bin
    # a folder: its model.safetensors, or why there is none to read
    mkdir pickled empty && : >pickled/pytorch_model.bin
    check_refused "pickled: a folder with pytorch_model.bin \(PyTorch's pickle\) and no model.safetensors" \
        init_from=pickled
    check_refused "empty: a folder with no model.safetensors, expected a safetensors file" \
        init_from=empty
    # an lm_head.weight beside wte is only taken when it is wte (the output layer is tied)
    "$PY" - <<'PY' || fail "writing the lm_head files"
from safetensors.torch import load_file, save_file
t = load_file("hf/model.safetensors")
wte = t["transformer.wte.weight"]
save_file(dict(t, **{"lm_head.weight": wte.clone()}), "tied.safetensors", metadata={"format": "pt"})
head = wte.clone()
head[3, 5] += 1
save_file(dict(t, **{"lm_head.weight": head}), "untied.safetensors", metadata={"format": "pt"})
PY
    "$WORKER" --check t.cfg init_from=tied.safetensors >out 2>err ||
        { cat err >&2; fail "an lm_head.weight equal to wte refused"; }
    check_refused "untied.safetensors: tensor 'lm_head.weight' differs from transformer.wte.weight" \
        init_from=untied.safetensors
    check_refused "t.bin: header length [0-9]+ \(the first 8 bytes\).*\(expected a safetensors file or llm.c's weights, magic 20240326\)" \
        init_from=t.bin
    check_refused "export = 'model.bin': expected a file name ending in .safetensors" export=model.bin
    check_refused "export = 'nodir/model.safetensors': directory 'nodir'" export=nodir/model.safetensors
    touch plain
    check_refused "export = 'plain/model.safetensors': directory 'plain': Not a directory" \
        export=plain/model.safetensors
    mkdir -p busy/config.json
    check_refused "export = 'busy/model.safetensors': busy/config.json, where its config.json goes, is a directory" \
        export=busy/model.safetensors
    printf 'model = mlp\nhidden = 8\n' >mlp.cfg
    "$WORKER" --check mlp.cfg init_from=hf/model.safetensors >out 2>err
    expect_eq "$?" 2 "exit status of init_from with model = mlp"
    expect_grep err 'init_from needs model = gpt \(model is mlp\)'
    # the launcher checks the weights before it starts anything
    "$LAUNCH" --nproc_per_node=2 t.cfg init_from=hf/model.safetensors n_layer=1 >out 2>err
    expect_eq "$?" 2 "exit status of mgpu-launch with weights that do not fit"
    expect_grep err "unexpected tensor 'transformer.h.1.[a-z_.12]+': the cfg's GPT-2 \(n_layer = 1\) has no such parameter"
}

# Two ranks start from the same file and end with one export, rank 0's; a later run that finds
# their checkpoint resumes from it rather than from the file.
t_weights_two_ranks_start_from_a_file_and_export_once() {
    setup_run
    "$PY" "$REF" make hf 50 24 32 2 2 7 F32 || fail "make"
    mkdir out
    "$LAUNCH" --nproc_per_node=2 t.cfg init_from=hf/model.safetensors batch_size=2 max_steps=3 \
        lr=0.01 export=out/model.safetensors checkpoint=c.ckpt >o 2>e ||
        { cat o e >&2; fail "2 ranks: exit $?"; }
    expect_eq "$(grep -c 'init_from: ' o)" 1 "init_from lines (rank 0's)"
    expect_eq "$(grep -c '^\[rank0\]:export: out/model.safetensors' o)" 1 "rank 0's export line"
    "$PY" "$REF" same out/model.safetensors c.ckpt 2 >cmp 2>&1 || { cat cmp >&2; fail "export differs"; }
    # a checkpoint to resume from wins over init_from
    "$WORKER" t.cfg init_from=hf/model.safetensors max_steps=4 checkpoint=c.ckpt >o2 2>e2 ||
        { cat o2 e2 >&2; fail "resume: exit $?"; }
    expect_grep o2 '^resumed from c.ckpt at epoch 1, step 3'
    expect_grep o2 '^init_from: hf/model.safetensors not read: c.ckpt is there to resume from$'
    # and needs no init_from file then (a job restarted after the pretrained file went)
    mv hf/model.safetensors hf/gone.safetensors
    "$LAUNCH" --nproc_per_node=2 t.cfg init_from=hf/model.safetensors batch_size=2 max_steps=5 \
        checkpoint=c.ckpt >o3 2>e3 || { cat o3 e3 >&2; fail "resume without the init file: exit $?"; }
    expect_grep o3 'resumed from c.ckpt at epoch 1, step 4'
}

# An export is model.safetensors and its config.json, both or neither: a folder with room for
# the model but not its config.json keeps what it held, and no temporary file stays behind.
t_weights_export_is_both_files_or_neither() {
    setup_run
    mkdir full small
    "$WORKER" t.cfg export=full/model.safetensors >o 2>e || { cat o e >&2; fail "export: exit $?"; }
    # room for the model and the old config.json: a page short of the new config.json
    local kb=$((($(stat -c %s full/model.safetensors) + 4095) / 4096 * 4 + 4))
    mount -t tmpfs -o size=${kb}k tmpfs small 2>/dev/null || skip "cannot mount a tmpfs here"
    echo old >small/config.json
    "$WORKER" t.cfg export=small/model.safetensors >o 2>e
    local rc=$? left
    left=$(ls small)
    umount small
    expect_eq "$rc" 1 "exit status of an export that runs out of room"
    expect_grep e "small/config.json.*No space left on device"
    expect_eq "$left" "config.json" "what the folder holds after the failed export"
}

# tests/gpu/hf_weights_checks.sh without a GPU: every check skips (exit 77); without
# transformers (Debian's Python here has none, or it is hidden) every check fails by name
# rather than passing unseen.
t_weights_hf_gpu_checks_skip_without_a_gpu() {
    local checks=$MGPU_ROOT/tests/gpu/hf_weights_checks.sh
    MGPU_GPU_PRESENT=0 bash "$checks" o >out 2>&1
    expect_eq "$?" 77 "exit status without a GPU"
    expect_grep out '^skip - hf_init_fp32_exact$'
    expect_grep out '^skip - hf_init_padded$'
    expect_grep out '^skip - hf_export_loads_in_transformers$'
    MGPU_GPU_PRESENT=1 HF_PYTHON=/bin/false bash "$checks" o >out 2>&1
    expect_eq "$?" 1 "exit status without transformers"
    expect_grep out "^not ok - hf_export_loads_in_transformers: /bin/false cannot import torch, transformers and safetensors"
}
