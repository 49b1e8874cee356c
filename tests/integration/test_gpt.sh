# test_gpt.sh - model = gpt through the real binaries: the trainer's GPT against PyTorch
# (gradients and 20 optimizer steps), W ranks x batch B against 1 rank x batch W*B, gradient
# accumulation against a larger batch, a byte-level model trained by 4 CPU workers against
# PyTorch trained with the same settings, generation, resume, and refused cfgs. Debian's
# python3-torch is importable from /usr/bin/python3 only (the python3 first on PATH is a
# separate build); the tests that need torch skip without it.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES
export MGPU_SIM_GPUS=0
export OMP_NUM_THREADS=1

TEXT=/usr/share/common-licenses/GPL-3

need_text() { [ -r "$TEXT" ] || skip "$TEXT not found (Debian's base-files has it)"; }

# A small byte-level model on the licence text (the settings of configs/gpt_text.cfg, made
# small enough for CI), with its own copy of the text beside it.
small_cfg() {
    cp "$TEXT" text.txt
    cat >g.cfg <<'EOF'
model = gpt
dataset = text
data_text = text.txt
eval_fraction = 0.1
n_layer = 2
n_head = 2
n_embd = 32
context = 32
batch_size = 4
max_steps = 8
lr = 0.003
lr_min = 0.0003
warmup_steps = 2
grad_clip = 1.0
weight_decay = 0.1
betas = 0.9, 0.95
seed = 5
log_interval = 1
eval_interval = 0
backend = cpu
EOF
}

# compare.py A.jsonl A.ckpt B.jsonl B.ckpt: every logged loss and the final eval_loss (to 1e-5
# of itself) and every parameter (to 1e-5 of the largest) of the two runs agree. A checkpoint
# is a 128-byte header (n_params at byte 24) and the floats.
compare_py() {
    cat >compare.py <<'EOF'
import json, struct, sys

def metrics(path):
    steps, final = {}, None
    for line in open(path):
        o = json.loads(line)
        if o.get("final"):
            final = o
        elif "step" in o and "loss" in o:
            steps[o["step"]] = o["loss"]
    return steps, final

def params(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 24)
    (header,) = struct.unpack_from("<I", data, 12)
    return struct.unpack_from("<%df" % n, data, header)

close = lambda a, b: abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-30)
bad = []
sa, fa = metrics(sys.argv[1])
sb, fb = metrics(sys.argv[3])
if sorted(sa) != sorted(sb) or len(sa) < 2:
    bad.append("logged steps differ: %s vs %s" % (sorted(sa), sorted(sb)))
for s in sorted(set(sa) & set(sb)):
    if not close(sa[s], sb[s]):
        bad.append("step %d loss %.9g vs %.9g" % (s, sa[s], sb[s]))
if not close(fa["eval_loss"], fb["eval_loss"]):
    bad.append("eval_loss %.9g vs %.9g" % (fa["eval_loss"], fb["eval_loss"]))
pa, pb = params(sys.argv[2]), params(sys.argv[4])
scale = max(abs(x) for x in pa)
i = max(range(len(pa)), key=lambda j: abs(pa[j] - pb[j]))
if len(pa) != len(pb) or abs(pa[i] - pb[i]) > 1e-5 * scale:
    bad.append("parameter [%d]: %.9g vs %.9g" % (i, pa[i], pb[i]))
print("\n".join(bad) if bad else "same: %d steps, eval_loss %.6f, %d parameters"
      % (len(sa), fa["eval_loss"], len(pa)))
sys.exit(1 if bad else 0)
EOF
}

t_gpt_matches_torch_gradients_and_steps() {
    need_torch 'import torch'
    "$MGPU_BUILD/tests/test_model_gpt" --dump run.bin >out 2>err
    expect_eq "$?" 0 "exit status of test_model_gpt --dump ($(cat err))"
    "$PY" "$MGPU_ROOT/tests/unit/gpt_torch_ref.py" run.bin >cmp 2>&1
    local rc=$?
    cat cmp
    expect_eq "$rc" 0 "exit status of gpt_torch_ref.py"
    expect_grep cmp '^dh1\.fcproj\.w '
    expect_grep cmp '^step 20 loss '
    expect_grep cmp 'steps clipped'
}

t_gpt_two_ranks_match_one_rank_with_the_global_batch() {
    small_cfg
    compare_py
    "$LAUNCH" --nproc_per_node=2 g.cfg batch_size=2 metrics_file=m2.jsonl checkpoint=c2.ckpt \
        >out2 2>err2 || { rc=$?; cat out2 err2 >&2; fail "2 ranks: exit $rc"; }
    "$LAUNCH" --nproc_per_node=1 g.cfg batch_size=4 metrics_file=m1.jsonl checkpoint=c1.ckpt \
        >out1 2>err1 || { rc=$?; cat out1 err1 >&2; fail "1 rank: exit $rc"; }
    python3 compare.py m2.jsonl c2.ckpt m1.jsonl c1.ckpt >cmp 2>&1 ||
        { cat cmp >&2; fail "2 ranks x 2 differ from 1 rank x 4"; }
    cat cmp
    expect_grep out2 'step 8/8 loss [0-9.]+ lr [0-9.e-]+ tokens/s [0-9]+'
}

t_gpt_grad_accum_matches_a_larger_batch() {
    small_cfg
    compare_py
    "$WORKER" g.cfg batch_size=1 grad_accum=4 metrics_file=ma.jsonl checkpoint=ca.ckpt \
        >outa 2>erra || { rc=$?; cat outa erra >&2; fail "grad_accum = 4: exit $rc"; }
    "$WORKER" g.cfg batch_size=4 metrics_file=mb.jsonl checkpoint=cb.ckpt >outb 2>errb ||
        { rc=$?; cat outb errb >&2; fail "batch 4: exit $rc"; }
    python3 compare.py ma.jsonl ca.ckpt mb.jsonl cb.ckpt >cmp 2>&1 ||
        { cat cmp >&2; fail "batch 1 x grad_accum 4 differs from batch 4"; }
    cat cmp
}

t_gpt_times_steps_after_timing_warmup() {
    small_cfg
    "$WORKER" g.cfg timing_warmup=3 metrics_file=m.jsonl >out 2>err ||
        { cat out err >&2; fail "exit $?"; }
    expect_grep out '^step time: [0-9.]+ us per step over 5 steps \(host clock after a sync, cpu\), [0-9]+ tokens/s$'
    expect_grep m.jsonl '"final":true.*"step_us":[0-9.e+]+,"timed_steps":5'
}

# 4 CPU workers, gpt_text.cfg's settings made small, against PyTorch with the same settings
# and steps: the held-out loss may be worse by 0.05 at most (the two inits differ in their
# random numbers, not in their distributions).
t_gpt_text_four_workers_reach_torchs_loss() {
    skip_under_sanitizers "a loss against PyTorch's; the other GPT tests run the same code on ranks"
    need_torch 'import torch'
    need_text
    local steps=200 mine theirs
    "$LAUNCH" --nproc_per_node=4 "$MGPU_ROOT/configs/gpt_text.cfg" data_text="$TEXT" n_layer=2 \
        n_head=4 n_embd=64 context=32 batch_size=4 max_steps=$steps warmup_steps=30 \
        log_interval=50 eval_interval=0 generate=0 backend=cpu metrics_file=m.jsonl >out 2>err ||
        { rc=$?; cat out err >&2; fail "mgpu-launch: exit $rc"; }
    cat out
    mine=$(python3 -c 'import json,sys; print([json.loads(l) for l in open("m.jsonl")][-1]["eval_loss"])')
    "$PY" "$MGPU_ROOT/tests/unit/gpt_torch_train.py" "$TEXT" eval_fraction=0.1 n_layer=2 \
        n_head=4 n_embd=64 context=32 batch=16 steps=$steps lr=0.003 lr_min=0.0003 warmup=30 \
        grad_clip=1.0 weight_decay=0.1 seed=1 >torch.out 2>&1 ||
        { cat torch.out >&2; fail "gpt_torch_train.py failed"; }
    cat torch.out
    theirs=$(sed -n 's/^eval_loss //p' torch.out)
    echo "held-out loss: mgpu $mine, torch $theirs"
    python3 -c "import sys; sys.exit(0 if $mine <= $theirs + 0.05 else 1)" ||
        fail "held-out loss $mine is worse than torch's $theirs + 0.05"
}

t_gpt_generate_prints_reproducible_samples() {
    small_cfg
    "$WORKER" g.cfg generate=40 'prompt=GNU\n' temperature=0.9 top_k=20 >out1 2>err ||
        { cat out1 err >&2; fail "generate: exit $?"; }
    "$WORKER" g.cfg generate=40 'prompt=GNU\n' temperature=0.9 top_k=20 >out2 2>err
    expect_grep out1 '^generate: 40 tokens after a prompt of 4 \(temperature 0.9, top_k 20, seed 5\):'
    # the sample goes on from the prompt, printed first
    expect_eq "$(sed -n '/^generate:/{n;p;q}' out1)" GNU "the line after the header"
    sed -n '/^generate:/,$p' out1 >s1
    sed -n '/^generate:/,$p' out2 >s2
    cmp -s s1 s2 || fail "two runs with one seed sampled differently: $(cat s1 s2)"
    # raw control bytes never reach the terminal
    ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' s1 || fail "unescaped control bytes: $(cat -v s1)"
    "$WORKER" g.cfg generate=40 'prompt=GNU\q' >out3 2>err3
    expect_eq "$?" 2 "exit status of a bad prompt"
    expect_grep err3 'unknown escape'
    # well-formed UTF-8 is printed as it is; a lone byte, a C1 control and ESC are escaped
    "$WORKER" g.cfg generate=1 'prompt=Grüße € \xff\xc2\x85\x1b' >out4 2>err4 ||
        { cat out4 err4 >&2; fail "UTF-8 prompt: exit $?"; }
    sed -n '/^generate:/{n;p;q}' out4 >line4
    grep -qF 'Grüße € \xff\xc2\x85\x1b' line4 || fail "the prompt printed as $(cat -v line4)"
    ! LC_ALL=C grep -q $'[\xff\x1b\x85]' line4 || fail "raw bytes: $(cat -v line4)"
}

t_gpt_tokens_file_trains_and_samples_ids() {
    python3 -c '
import struct
ids = [(i * 7 + i // 13) % 50 for i in range(3000)]
open("t.bin", "wb").write(struct.pack("<%dH" % len(ids), *ids))'
    cat >t.cfg <<'EOF'
model = gpt
dataset = tokens
data_tokens = t.bin
vocab = 50
eval_fraction = 0.1
n_layer = 1
n_head = 2
n_embd = 16
context = 16
batch_size = 4
max_steps = 5
log_interval = 1
generate = 6
prompt = 1 2 3
backend = cpu
EOF
    "$WORKER" t.cfg >out 2>err || { cat out err >&2; fail "tokens: exit $?"; }
    expect_grep out 'vocab 50\); 168 training windows, 18 held out'
    expect_grep out '^eval epoch 1 step 5: loss [0-9.]+ perplexity [0-9.]+ on 18 windows'
    expect_grep out '^generate: 6 tokens after a prompt of 3 '
    expect_grep out '^1 2 3( [0-9]+){6}$'
    # max_steps sets the length: progress counts the epochs the run reaches, not a bound
    expect_grep out '^epoch 1/1 step 5/5 loss '
    "$WORKER" t.cfg batch_size=100 max_steps=3 log_interval=1 generate=0 >out2 2>err2 ||
        { cat out2 err2 >&2; fail "tokens, two epochs: exit $?"; }
    expect_grep out2 '^epoch 1/2 step 2/3 loss '
    expect_grep out2 '^epoch 2/2 step 3/3 loss '
    # the final evaluation names the last step's epoch, also where max_steps ends one
    "$WORKER" t.cfg batch_size=100 max_steps=4 eval_interval=3 generate=0 >out3 2>err3 ||
        { cat out3 err3 >&2; fail "tokens, two whole epochs: exit $?"; }
    expect_grep out3 '^eval epoch 2 step 4:'
}

t_gpt_resume_at_another_world_counts_its_epochs() {
    # 6 steps of 2 ranks (5 batches an epoch each), resumed by 1 rank (9 an epoch) at epoch 2,
    # batch 2, to step 16: the run reaches epoch 3, and its progress says so
    python3 -c '
import struct
ids = [(i * 7 + i // 13) % 50 for i in range(3000)]
open("t.bin", "wb").write(struct.pack("<%dH" % len(ids), *ids))'
    printf '%s\n' 'data_tokens = t.bin' 'vocab = 50' 'eval_fraction = 0.1' 'n_layer = 1' 'n_head = 2' \
        'n_embd = 16' 'context = 16' 'batch_size = 20' 'backend = cpu' 'checkpoint = r.ckpt' >t.cfg
    "$LAUNCH" --nproc_per_node=2 t.cfg max_steps=6 >out 2>err || { cat out err >&2; fail "exit $?"; }
    "$WORKER" t.cfg max_steps=16 log_interval=1 >out2 2>err2 || { cat out2 err2 >&2; fail "resume: exit $?"; }
    expect_grep out2 'epoch 2 goes on from batch 2 of 9'
    expect_grep out2 '^epoch 2/3 step 7/16 loss '
    expect_grep out2 '^epoch 3/3 step 16/16 loss '
    expect_no_grep out2 '^epoch [0-9]+/2 '
}

t_gpt_resume_continues_and_refuses_another_shape() {
    small_cfg
    compare_py
    # lr_min = lr: after the warm-up the rate does not depend on max_steps, which differs
    sed -i 's/^lr_min = .*/lr_min = 0.003/' g.cfg
    "$WORKER" g.cfg max_steps=4 checkpoint=a.ckpt metrics_file=ma0.jsonl >out0 2>err0 ||
        { cat out0 err0 >&2; fail "first half: exit $?"; }
    "$WORKER" g.cfg max_steps=8 checkpoint=a.ckpt metrics_file=ma.jsonl >out1 2>err1 ||
        { cat out1 err1 >&2; fail "second half: exit $?"; }
    expect_grep out1 '^resumed from a.ckpt at epoch 1, step 4'
    # checkpoint_interval's checkpoints end with the run's last step, off the interval too
    "$WORKER" g.cfg max_steps=8 checkpoint=i.ckpt checkpoint_interval=3 >out_i 2>&1 ||
        { cat out_i >&2; fail "checkpoint_interval = 3: exit $?"; }
    "$WORKER" g.cfg max_steps=8 checkpoint=i.ckpt >out_i2 2>&1 || { cat out_i2 >&2; fail "resume"; }
    expect_grep out_i2 '^resumed from i.ckpt at epoch 1, step 8$'
    # and an override turns checkpoints off for a cfg that sets checkpoint_interval
    printf 'checkpoint = i.ckpt\ncheckpoint_interval = 3\n' >>g.cfg
    "$WORKER" --check g.cfg checkpoint= checkpoint_interval=0 >out_c 2>&1 ||
        { cat out_c >&2; fail "checkpoint= checkpoint_interval=0 refused"; }
    sed -i '/^checkpoint/d' g.cfg
    # a resumed run's metrics file holds each step once: what a killed run logged after its
    # last checkpoint (steps 5 and 6 here, and a final record) goes, the steps run again
    "$WORKER" g.cfg max_steps=4 checkpoint=k.ckpt metrics_file=mk.jsonl >out_k 2>&1 ||
        { cat out_k >&2; fail "4 steps: exit $?"; }
    printf '{"epoch":1,"step":5,"loss":9}\n{"epoch":1,"step":6,"loss":9}\n{"final":true,"loss":9}\n' >>mk.jsonl
    "$WORKER" g.cfg max_steps=6 checkpoint=k.ckpt metrics_file=mk.jsonl >out_k2 2>&1 ||
        { cat out_k2 >&2; fail "resumed to 6: exit $?"; }
    python3 - mk.jsonl <<'PY' || fail "the resumed metrics file: $(cat mk.jsonl)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows if "loss" in r and "step" in r and not r.get("final")]
finals = [r for r in rows if r.get("final")]
assert steps == [1, 2, 3, 4, 5, 6], steps
assert len(finals) == 1 and finals[0]["steps"] == 6 and finals[0]["loss"] != 9, finals
PY
    # resumed with no step left (a restart after the training ended): no loss that no step had
    "$WORKER" g.cfg max_steps=8 checkpoint=a.ckpt metrics_file=ma_end.jsonl >out_end 2>&1 ||
        { cat out_end >&2; fail "resume at the end: exit $?"; }
    python3 -c 'import json, sys; f = [json.loads(l) for l in open(sys.argv[1])][-1]; sys.exit(not f["final"] or "loss" in f or f["steps"] != 8)' ma_end.jsonl ||
        fail "the final metrics of a run with no step left: $(tail -1 ma_end.jsonl)"
    "$WORKER" g.cfg max_steps=8 checkpoint=b.ckpt metrics_file=mb.jsonl >out2 2>err2 ||
        { cat out2 err2 >&2; fail "whole run: exit $?"; }
    # the resumed run logs steps 5..8: compare them with the whole run's
    grep -v '"step":[1-4],' mb.jsonl >mb_tail.jsonl
    python3 compare.py ma.jsonl a.ckpt mb_tail.jsonl b.ckpt >cmp 2>&1 ||
        { cat cmp >&2; fail "4 + 4 resumed steps differ from 8 steps"; }
    cat cmp
    # another world size goes on from as many windows as were seen (2 ranks x 4 steps: 8 of 1)
    "$LAUNCH" --nproc_per_node=2 "$MGPU_ROOT/configs/gpt_text.cfg" data_text=text.txt n_layer=2 \
        n_head=2 n_embd=32 context=32 batch_size=4 seed=5 max_steps=12 checkpoint=w2.ckpt \
        checkpoint_interval=4 generate=0 backend=cpu >/dev/null 2>&1
    cp w2.ckpt w3.ckpt
    cp w2.ckpt w4.ckpt
    "$WORKER" g.cfg max_steps=13 checkpoint=w2.ckpt >out4 2>err4 ||
        { cat out4 err4 >&2; fail "resume on another world size: exit $?"; }
    expect_grep out4 'written by 2 ranks, this run has 1: epoch 1 goes on from batch 24 of'
    # another batch size, or grad_accum, too: 12 steps of 2 ranks x 4 windows are 96 windows,
    # 32 batches of 3 or 8 of 4 x 3
    "$WORKER" g.cfg batch_size=3 max_steps=13 checkpoint=w3.ckpt >out5 2>err5 ||
        { cat out5 err5 >&2; fail "resume with another batch size: exit $?"; }
    expect_grep out5 'written by 2 ranks of 4 samples a batch, this run has 1 of 3: epoch 1 goes on from batch 32 of'
    "$WORKER" g.cfg batch_size=4 grad_accum=3 max_steps=13 checkpoint=w4.ckpt >out6 2>err6 ||
        { cat out6 err6 >&2; fail "resume with grad_accum: exit $?"; }
    expect_grep out6 'written by 2 ranks of 4 samples a batch, this run has 1 of 12: epoch 1 goes on from batch 8 of'
    "$WORKER" g.cfg max_steps=10 n_embd=48 checkpoint=a.ckpt >out3 2>err3
    expect_eq "$?" 2 "exit status of a resume into another shape"
    expect_grep err3 'checkpoint a.ckpt holds another model .* n_layer = 2, n_head = 2, n_embd = 48, context = 32, vocab = 256'
}

# check_refused EXPECTED_MESSAGE KEY=VALUE...: --check of $CFG (default g.cfg) with the
# overrides exits 2 with a message that names the problem.
check_refused() {
    local want=$1
    shift
    "$WORKER" --check "${CFG:-g.cfg}" "$@" >out 2>err
    expect_eq "$?" 2 "exit status of --check with $*"
    expect_grep err "$want"
}

# SIGUSR1 to the launcher (Slurm's --signal=USR1@60 before a time limit) reaches the workers,
# which write a checkpoint after the step in progress and go on; a later run resumes there.
t_gpt_sigusr1_writes_a_checkpoint_and_goes_on() {
    small_cfg
    "$LAUNCH" --nproc_per_node=2 g.cfg max_steps=100000000 log_interval=1 checkpoint=u.ckpt \
        checkpoint_interval=100000000 >o 2>e &
    local pid=$! step
    wait_until 60 grep -q 'step 3/' o || { kill -9 $pid; cat o e >&2; fail "no third step"; }
    kill -USR1 $pid
    wait_until 60 grep -q 'SIGUSR1 after step' o || { kill -9 $pid; cat o e >&2; fail "no SIGUSR1 line"; }
    wait_until 60 grep -q "step $(($(grep -o 'SIGUSR1 after step [0-9]*' o | grep -o '[0-9]*$') + 2))/" o ||
        { kill -9 $pid; cat o e >&2; fail "the run did not go on"; }
    kill -TERM $pid
    wait $pid
    step=$(grep -o 'SIGUSR1 after step [0-9]*: checkpoint u.ckpt; the run goes on' o | grep -o 'step [0-9]*' | grep -o '[0-9]*')
    [ -n "$step" ] || { cat o >&2; fail "no checkpoint line"; }
    expect_eq "$(grep -c 'SIGUSR1 after step' o)" 1 "SIGUSR1 lines (rank 0's)"
    "$WORKER" g.cfg max_steps=$((step + 1)) checkpoint=u.ckpt >o2 2>e2 ||
        { cat o2 e2 >&2; fail "resume: exit $?"; }
    expect_grep o2 "^resumed from u.ckpt at epoch [0-9]+, step $step\$"
}

# MGPU_GPT_REUSE_GRADS (the bf16 GPT's activations in the gradients' memory): 0 and 1 train,
# another value is refused by name before anything is made.
t_gpt_reuse_grads_variable_is_checked() {
    small_cfg
    for v in 0 1; do
        MGPU_GPT_REUSE_GRADS=$v "$WORKER" g.cfg max_steps=2 >out 2>err ||
            { cat out err >&2; fail "MGPU_GPT_REUSE_GRADS=$v: exit $?"; }
    done
    if MGPU_GPT_REUSE_GRADS=yes "$WORKER" g.cfg max_steps=2 >out 2>err; then
        fail "MGPU_GPT_REUSE_GRADS=yes was accepted"
    fi
    expect_grep err 'MGPU_GPT_REUSE_GRADS=yes: expected 1 or 0'
}

t_gpt_cfg_errors_are_refused_by_name() {
    small_cfg
    "$WORKER" --check g.cfg >out 2>err || { cat err >&2; fail "the small cfg is refused"; }
    check_refused 'n_embd = 30 is not a multiple of n_head = 4' n_embd=30 n_head=4
    check_refused "override 'context=0': context = '0': expected an integer in \[1, 65536\]" context=0
    check_refused 'model = gpt needs dataset = text or tokens \(dataset is synthetic\)' \
        dataset=synthetic
    check_refused 'vocab = 300 with dataset = text, whose tokens are bytes: expected 256' vocab=300
    printf 'model = mlp\nhidden = 8\n' >mlp.cfg
    CFG=mlp.cfg check_refused 'command line: n_layer needs model = gpt \(model is mlp\)' n_layer=2
    CFG=mlp.cfg check_refused 'dataset = text needs model = gpt \(model is mlp\)' dataset=text
    check_refused 'model = gpt trains with optimizer = adamw' optimizer=sgd
    check_refused 'model = gpt trains with mode = ddp only' mode=dp
    check_refused 'lr_min = 0.01 is above lr = 0.003' lr_min=0.01
    check_refused "grad_accum = '0': expected an integer in \[1, " grad_accum=0
    check_refused "temperature = '0': expected a number in" temperature=0
    head -c 20 text.txt >short.txt
    check_refused 'short.txt has 20 tokens, 18 of them for training: no run of context \+ 1 = 33' \
        data_text=short.txt
    check_refused 'the 4 held-out tokens of .*short.txt hold no run of context \+ 1 = 9' \
        data_text=short.txt context=8 eval_fraction=0.2
    python3 -c '
import struct
open("bad.bin", "wb").write(struct.pack("<2000H", *[300 if i == 2 else 1 for i in range(2000)]))
open("ok.bin", "wb").write(struct.pack("<2000H", *[i % 256 for i in range(2000)]))'
    printf 'abc' >odd.bin
    grep -v '^data_text\|^dataset' g.cfg >tk.cfg
    printf 'dataset = tokens\ndata_tokens = ok.bin\n' >>tk.cfg
    CFG=tk.cfg check_refused 'tk.cfg:[0-9]+: dataset = tokens needs vocab'
    echo 'vocab = 256' >>tk.cfg
    "$WORKER" --check tk.cfg >out 2>err || { cat err >&2; fail "the tokens cfg is refused"; }
    # ids are checked as windows are read: the first epoch reads window 0
    "$WORKER" tk.cfg data_tokens=bad.bin max_steps=0 epochs=1 >out 2>err
    expect_eq "$?" 2 "exit status of a run over an id past vocab"
    expect_grep err 'bad.bin: token 300 at position 2 \(byte offset 4\), expected below vocab = 256'
    CFG=tk.cfg check_refused 'odd.bin: 3 bytes and no llm.c header .*, expected whole little-endian' \
        data_tokens=odd.bin
    CFG=tk.cfg check_refused 'data_text needs dataset = text' data_text=text.txt
    # an override replaces a file of the cfg's that does not exist (the file is checked once,
    # after the overrides), in the worker and through the launcher
    sed 's/^data_tokens = .*/data_tokens = missing.bin/' tk.cfg >mk.cfg
    CFG=mk.cfg check_refused 'mk.cfg:[0-9]+: data_tokens: .*missing.bin: cannot open data_tokens'
    "$WORKER" --check mk.cfg data_tokens=ok.bin >out 2>err ||
        { cat err >&2; fail "an override of a missing data file is refused"; }
    "$LAUNCH" --dry-run --nproc_per_node=2 mk.cfg data_tokens=ok.bin >out 2>err ||
        { cat err >&2; fail "mgpu-launch refuses an override of a missing data file"; }
    # the launcher checks the cfg before it starts anything
    "$LAUNCH" --nproc_per_node=2 g.cfg n_embd=30 n_head=4 >out 2>err
    expect_eq "$?" 2 "exit status of mgpu-launch with a bad gpt cfg"
    expect_grep err 'n_embd = 30 is not a multiple of n_head = 4'
}
