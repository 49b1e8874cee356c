# test_numeric.sh - the real binaries agree with themselves in numbers: mgpu-launch with 4 CPU
# workers of batch 64 (no shuffling) computes what one worker of batch 256 computes, step by
# step. DistributedSampler gives rank r the samples r, r+4, r+8, ... so each step's global batch
# is the same 256 samples in both runs; the averaged gradient, so the parameters, the logged
# training loss (each rank's mean, averaged over ranks) and the held-out loss must all match to
# 1e-5 relative. An accuracy threshold cannot tell a cross-rank average from a sum; this can.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES
export MGPU_SIM_GPUS=0
export OMP_NUM_THREADS=1

# 1280 samples, 20% held out: 1024 to train on, 4 steps of 256 an epoch, no padding
numeric_cfg() {
    cat >n.cfg <<'EOF'
dataset = synthetic
samples = 1280
features = 8
classes = 3
data_seed = 3
eval_fraction = 0.2
model = mlp
hidden = 16
activation = tanh
loss = cross_entropy
optimizer = sgd
lr = 0.1
momentum = 0.9
epochs = 3
shuffle = false
seed = 7
log_interval = 1
backend = cpu
EOF
}

# compare.py A.jsonl A.ckpt B.jsonl B.ckpt: every logged loss and the final eval_loss (each to
# 1e-5 of itself) and every parameter (to 1e-5 of the largest one) of the checkpoints (a 128-byte header, n_params at byte 24, the writer's world size
# at byte 76, then the floats) agree
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
    if data[:8] != b"MGPUCKPT":
        sys.exit("%s: not a checkpoint" % path)
    (n,) = struct.unpack_from("<Q", data, 24)
    (world,) = struct.unpack_from("<I", data, 76)
    (header,) = struct.unpack_from("<I", data, 12)
    return world, struct.unpack_from("<%df" % n, data, header)

def close(a, b):
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-30)

bad = []
sa, fa = metrics(sys.argv[1])
sb, fb = metrics(sys.argv[3])
if sorted(sa) != sorted(sb) or len(sa) < 2:
    bad.append("logged steps differ: %s vs %s" % (sorted(sa), sorted(sb)))
for s in sorted(set(sa) & set(sb)):
    if not close(sa[s], sb[s]):
        bad.append("step %d loss %.9g vs %.9g" % (s, sa[s], sb[s]))
if fa is None or fb is None or "eval_loss" not in fa or "eval_loss" not in fb:
    bad.append("no final eval_loss: %s vs %s" % (fa, fb))
else:
    for key in ("eval_loss", "loss"):
        if not close(fa[key], fb[key]):
            bad.append("final %s %.9g vs %.9g" % (key, fa[key], fb[key]))
(wa, pa), (wb, pb) = params(sys.argv[2]), params(sys.argv[4])
if (wa, wb) != (4, 1):
    bad.append("checkpoints written by world sizes %d and %d, expected 4 and 1" % (wa, wb))
if len(pa) != len(pb):
    bad.append("parameter counts %d vs %d" % (len(pa), len(pb)))
else:
    # relative to the largest parameter: a weight near 0 carries the sums' rounding alone
    scale = max(max(abs(x) for x in pa), max(abs(x) for x in pb))
    i = max(range(len(pa)), key=lambda j: abs(pa[j] - pb[j]))
    if abs(pa[i] - pb[i]) > 1e-5 * scale:
        bad.append("parameter [%d] of %d: %.9g vs %.9g (largest |parameter| %.6g)"
                   % (i, len(pa), pa[i], pb[i], scale))
print("\n".join(bad) if bad else "same: %d steps, eval_loss %.9g, %d parameters"
      % (len(sa), fa["eval_loss"], len(pa)))
sys.exit(1 if bad else 0)
EOF
}

t_four_ranks_match_one_rank_with_the_global_batch() {
    numeric_cfg
    compare_py
    "$LAUNCH" --nproc_per_node=4 n.cfg batch_size=64 metrics_file=m4.jsonl checkpoint=c4.ckpt \
        >out4 2>err4 || { rc=$?; cat out4 err4 >&2; fail "4 ranks: exit $rc"; }
    "$LAUNCH" --nproc_per_node=1 n.cfg batch_size=256 metrics_file=m1.jsonl checkpoint=c1.ckpt \
        >out1 2>err1 || { rc=$?; cat out1 err1 >&2; fail "1 rank: exit $rc"; }
    python3 compare.py m4.jsonl c4.ckpt m1.jsonl c1.ckpt >cmp 2>&1 || { cat cmp >&2; fail "4 ranks x 64 differ from 1 rank x 256"; }
    cat cmp
}
