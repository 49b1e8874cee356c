# test_data.sh - a GPT's data at scale and its text, through the real binaries: llm.c shards
# written here in llm.c's format (uint16 and uint32), raw .bin files, lists and globs, held-out
# shards, exact resume over shards, each bad file named, the resident memory of 4 ranks over a
# 1 GB token set, and --encode / tokenizer = against Hugging Face's tokenizers on a tokenizer
# trained here (skipped where /usr/bin/python3 lacks the tokenizers package).

for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES
export MGPU_SIM_GPUS=0
export OMP_NUM_THREADS=1

NPY=/usr/bin/python3 # Debian's numpy

need_numpy() { "$NPY" -c 'import numpy' 2>/dev/null || skip "$NPY has no numpy"; }
need_tokenizers() {
    "$NPY" -c 'import tokenizers' 2>/dev/null ||
        skip "$NPY has no tokenizers (scripts/setup.sh installs it)"
}

# shard.py OUT VERSION FIRST COUNT [raw]: tokens (FIRST + i * 7 + i // 13) % 50 for i < COUNT,
# as llm.c's data_common.py writes them (version 1: magic 20240520, uint16; version 7: magic
# 20240801, uint32), or raw uint16 with no header.
write_shard_py() {
    cat >shard.py <<'EOF'
import sys
import numpy as np
out, version, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
i = np.arange(first, first + count, dtype=np.int64)
toks = (i * 7 + i // 13) % 50
if len(sys.argv) > 5:
    toks.astype("<u2").tofile(out)
    sys.exit(0)
header = np.zeros(256, dtype=np.int32)
header[0] = 20240520 if version == 1 else 20240801
header[1] = version
header[2] = count
with open(out, "wb") as f:
    f.write(header.tobytes())
    f.write(toks.astype("<u2" if version == 1 else "<u4").tobytes())
EOF
}

gpt_cfg() {
    cat >g.cfg <<'EOF'
model = gpt
dataset = tokens
vocab = 50
n_layer = 1
n_head = 2
n_embd = 16
context = 16
batch_size = 4
max_steps = 6
log_interval = 1
backend = cpu
seed = 3
EOF
}

# the step losses of a metrics file, one "step loss" a line
losses() { "$NPY" -c '
import json, sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if "loss" in o and "step" in o and not o.get("final"):
        print(o["step"], repr(o["loss"]))' "$1"; }

t_data_shards_globs_lists_and_raw_files_agree() {
    need_numpy
    write_shard_py
    # three shards of 1000, 777 and 1500 tokens: 62 + 48 + 93 windows of 17, none across two
    "$NPY" shard.py tr_000001.bin 1 0 1000 && "$NPY" shard.py tr_000002.bin 1 1000 777 &&
        "$NPY" shard.py tr_000003.bin 1 1777 1500 && "$NPY" shard.py val_000000.bin 1 5000 340 ||
        fail "shard.py"
    # the same tokens as a uint32 shard and a raw uint16 file
    "$NPY" shard.py wide.bin 7 1000 777 && "$NPY" shard.py raw.bin 1 1777 1500 raw || fail "raw"
    gpt_cfg
    echo 'data_tokens = tr_*.bin' >>g.cfg
    echo 'data_val_tokens = val_*.bin' >>g.cfg
    "$WORKER" --check g.cfg >out 2>err || { cat err >&2; fail "--check: exit $?"; }
    "$WORKER" g.cfg metrics_file=glob.jsonl >out 2>err || { cat out err >&2; fail "glob: exit $?"; }
    expect_grep out '; 203 training windows, 21 held out;'
    expect_grep out '^eval epoch 1 step 6: loss [0-9.]+ perplexity [0-9.]+ on 21 windows'
    "$WORKER" g.cfg metrics_file=list.jsonl 'data_tokens=tr_000001.bin, wide.bin,raw.bin' \
        >out2 2>err2 || { cat out2 err2 >&2; fail "list: exit $?"; }
    losses glob.jsonl >a
    losses list.jsonl >b
    [ "$(wc -l <a)" -eq 6 ] || fail "$(cat a) is not 6 steps"
    cmp -s a b || fail "the list of uint16, uint32 and raw files trains otherwise: $(paste a b)"
    # the launcher's --check and two ranks: 203 windows shared out, same data on each
    "$LAUNCH" --nproc_per_node=2 g.cfg >out3 2>err3 || { cat out3 err3 >&2; fail "2 ranks: exit $?"; }
    expect_grep out3 '203 training windows, 21 held out; 6 steps of 2 x 4 x 1 windows'
}

t_data_resume_over_shards_is_exact() {
    need_numpy
    write_shard_py
    "$NPY" shard.py s_1.bin 1 0 900 && "$NPY" shard.py s_2.bin 7 900 700 || fail "shard.py"
    gpt_cfg
    printf 'data_tokens = s_*.bin\neval_fraction = 0.1\ncheckpoint_interval = 1\n' >>g.cfg
    # 2 ranks, 4 steps then 4 more from the checkpoint, against 8 steps at once: the sampler's
    # position over the shards comes back exactly, so every loss is the same number
    "$LAUNCH" --nproc_per_node=2 g.cfg max_steps=4 checkpoint=a.ckpt metrics_file=a0.jsonl \
        >out0 2>err0 || { cat out0 err0 >&2; fail "first half: exit $?"; }
    "$LAUNCH" --nproc_per_node=2 g.cfg max_steps=8 checkpoint=a.ckpt metrics_file=a1.jsonl \
        >out1 2>err1 || { cat out1 err1 >&2; fail "second half: exit $?"; }
    expect_grep out1 'resumed from a.ckpt at epoch 1, step 4'
    "$LAUNCH" --nproc_per_node=2 g.cfg max_steps=8 checkpoint=b.ckpt metrics_file=b.jsonl \
        >out2 2>err2 || { cat out2 err2 >&2; fail "whole run: exit $?"; }
    cat a0.jsonl a1.jsonl >a.jsonl
    losses a.jsonl >a
    losses b.jsonl >b
    [ "$(wc -l <b)" -eq 8 ] || fail "$(cat b) is not 8 steps"
    cmp -s a b || fail "resumed losses differ: $(paste a b)"
}

t_data_bad_files_are_named() {
    need_numpy
    write_shard_py
    "$NPY" shard.py ok.bin 1 0 1000 || fail "shard.py"
    gpt_cfg
    echo 'data_tokens = ok.bin' >>g.cfg
    "$NPY" -c '
import numpy as np
h = np.zeros(256, dtype=np.int32); h[:3] = [20240520, 2, 10]
open("v2.bin", "wb").write(h.tobytes() + bytes(20))
h[1] = 1; h[2] = 11
open("count.bin", "wb").write(h.tobytes() + bytes(20))
h[2] = 1000
t = np.ones(1000, dtype="<u2"); t[901] = 60
open("id.bin", "wb").write(h.tobytes() + t.tobytes())'
    for bad in 'v2.bin:llm.c header version 2 at byte 4 with magic 20240520, expected 1' \
        'count.bin:llm.c header says 11 tokens at byte 8 \(1046 bytes with the header\), the file has 1044' \
        'none_*.bin:no file matches the pattern'; do
        "$WORKER" --check g.cfg "data_tokens=ok.bin,${bad%%:*}" >out 2>err
        expect_eq "$?" 2 "--check of ${bad%%:*}"
        expect_grep err "command line: data_tokens: .*${bad#*:}"
    done
    "$LAUNCH" --nproc_per_node=2 g.cfg data_tokens=count.bin >out 2>err
    expect_eq "$?" 2 "the launcher over count.bin"
    expect_grep err 'count.bin: llm.c header says 11 tokens'
    # an id past vocab: found as its window is read, named by file and position
    "$WORKER" g.cfg data_tokens=id.bin max_steps=0 epochs=1 eval_fraction=0 >out 2>err
    expect_eq "$?" 2 "a run over an id past vocab"
    expect_grep err 'id.bin: token 60 at position 901 \(byte offset 2826\), expected below vocab = 50'
    "$WORKER" --check g.cfg data_val_tokens=ok.bin eval_fraction=0.1 >out 2>err
    expect_eq "$?" 2 "data_val_tokens with eval_fraction"
    expect_grep err 'data_val_tokens holds the evaluation.s tokens: eval_fraction = 0.1'
    # evaluation files that hold nothing to evaluate are refused, not taken as no evaluation
    "$NPY" -c '
import struct
open("none.bin", "wb").write(struct.pack("<3i", 20240520, 1, 0) + bytes(1012))'
    : >zero.bin
    for f in none.bin zero.bin; do
        "$WORKER" --check g.cfg data_tokens=ok.bin data_val_tokens=$f >out 2>err
        expect_eq "$?" 2 "--check with data_val_tokens = $f"
        expect_grep err "the 0 held-out tokens of $f hold no run of context"
    done
}

t_data_file_cut_short_during_a_run_is_named() {
    need_numpy
    write_shard_py
    "$NPY" shard.py big.bin 1 0 2000000 || fail "shard.py"
    gpt_cfg
    echo 'data_tokens = big.bin' >>g.cfg
    # the file truncated under a running worker: its next window past the new end is a SIGBUS
    # of the mapping, which must end the run with the file named, not a bare "Bus error"
    "$WORKER" g.cfg max_steps=100000000 >out 2>err &
    local pid=$! i
    for i in $(seq 300); do
        grep -qs 'step 2/' out && break
        sleep 0.1
    done
    grep -q 'step 2/' out || { kill "$pid"; fail "no step logged: $(cat out err)"; }
    truncate -s 3000 big.bin
    for i in $(seq 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; fail "the worker ran on over a cut file"; }
    wait "$pid"
    expect_eq "$?" 2 "the worker over a file cut short"
    expect_grep err 'big.bin: the file is shorter than the 4001024 bytes it had when it was opened \(token [0-9]+ at byte offset [0-9]+ cannot be read\)'
}

t_data_four_ranks_map_a_1gb_set_in_little_memory() {
    # 512 Mi uint16 tokens (1 GiB) behind an llm.c header, sparse: its tokens are 0
    "$NPY" -c '
import struct
n = 512 * 1024 * 1024
with open("big.bin", "wb") as f:
    f.write(struct.pack("<3i", 20240520, 1, n) + bytes(1012))
    f.truncate(1024 + 2 * n)'
    gpt_cfg
    echo 'data_tokens = big.bin' >>g.cfg
    # each rank's peak resident set (ru_maxrss, file pages included) from GNU time
    "$LAUNCH" --nproc_per_node=4 -- /usr/bin/time -f 'peak_rss_kb %M' "$WORKER" g.cfg \
        batch_size=8 max_steps=40 >out 2>err || { cat out err >&2; fail "4 ranks: exit $?"; }
    # 33.5 M windows: neither the tokens nor a list of the windows may live in a rank
    expect_grep out '33554431 training windows'
    grep -ho 'peak_rss_kb [0-9]*' out err | awk '{print $2}' >rss
    [ "$(wc -l <rss)" -eq 4 ] || { cat out err >&2; fail "expected 4 peak figures: $(cat rss)"; }
    echo "peak resident set per rank (kB): $(tr '\n' ' ' <rss)"
    while read -r kb; do
        [ "$kb" -lt 204800 ] || fail "a rank peaked at $kb kB over a 1 GiB token set"
    done <rss
}

# a text in several scripts, and the tokenizer trained on it by Hugging Face's tokenizers
train_tokenizer() {
    cp /usr/share/common-licenses/GPL-3 corpus.txt 2>/dev/null || : >corpus.txt
    cat >>corpus.txt <<'EOF'
It's the fox's den; we'll see what they've done, I'm sure you'd agree — don't you?
naïve café résumé Grüße Straße Ελληνικά Русский текст 日本語のテキスト 한국어 عربي ٣٤٥ ½ ² Ⅻ
tabs	and		spaces    here   trailing   
   leading, 12345 67.89 🙂🚀 “quotes” https://example.com/a?b=1&c=2
EOF
    "$NPY" -c '
from tokenizers import ByteLevelBPETokenizer
t = ByteLevelBPETokenizer()
t.train(["corpus.txt"], vocab_size=700, min_frequency=2, special_tokens=["<|endoftext|>"],
        show_progress=False)
t.save("tokenizer.json")' || fail "training the tokenizer"
}

t_data_encode_gives_hugging_faces_ids() {
    need_tokenizers
    train_tokenizer
    # text it was not trained on, special token included
    cat >in.txt <<'EOF'
The fox's tail<|endoftext|>A new document: ΑΒΓ αβγ, Ꙁ ꙁ, ١٢٣ 4.5e6 —   spaces	tab
Ünïcödé wörds 'quoted' they'RE I'M x²+y² … ✓

EOF
    "$WORKER" --encode tokenizer.json in.txt in.bin >out 2>err ||
        { cat out err >&2; fail "--encode: exit $?"; }
    expect_grep out '^encode: [0-9]+ bytes of in.txt into [0-9]+ tokens, in.bin \(llm.c shard version 1\)'
    "$NPY" -c '
import sys
import numpy as np
from tokenizers import Tokenizer
want = Tokenizer.from_file("tokenizer.json").encode(open("in.txt", encoding="utf-8").read()).ids
h = np.fromfile("in.bin", dtype="<i4", count=256)
got = np.fromfile("in.bin", dtype="<u2", offset=1024).tolist()
assert list(h[:3]) == [20240520, 1, len(got)], h[:3]
if got != want:
    i = next(i for i, (a, b) in enumerate(zip(got + [None], want + [None])) if a != b)
    sys.exit("ids differ at %d: %s vs %s" % (i, got[i:i + 8], want[i:i + 8]))
print(len(got), "ids as tokenizers gives them")' || fail "the ids differ from tokenizers'"
    # the tokenizer's folder, as from_pretrained takes it: the same ids
    mkdir tk && cp tokenizer.json tk/
    "$WORKER" --encode tk in.txt in2.bin >out 2>err || { cat err >&2; fail "folder: exit $?"; }
    cmp -s in.bin in2.bin || fail "the folder's tokenizer.json gave other ids"
    # the shard trains, and a prompt goes through the tokenizer and back
    "$WORKER" --encode tokenizer.json corpus.txt train.bin >out 2>err || fail "corpus: exit $?"
    gpt_cfg
    sed -i 's/^vocab = .*/vocab = 704/' g.cfg
    printf 'data_tokens = train.bin\ntokenizer = tokenizer.json\n' >>g.cfg
    printf 'generate = 5\nprompt = Grüße vom Fuchs\n' >>g.cfg
    "$WORKER" g.cfg >out 2>err || { cat out err >&2; fail "training with the tokenizer: exit $?"; }
    expect_grep out '^generate: 5 tokens after a prompt of [0-9]+ '
    sed -n '/^generate:/{n;p;q}' out >line
    grep -q '^Grüße vom Fuchs' line || fail "the prompt decoded as $(cat -v line)"
    # a vocabulary padded far past the tokenizer's (as GPT-2's 50257 to 50304): only ids the
    # tokenizer spells are drawn, though the padding rows are most of a barely trained model's
    "$WORKER" g.cfg vocab=4096 max_steps=1 generate=60 >out 2>err ||
        { cat out err >&2; fail "generating past the tokenizer's ids: exit $?"; }
    expect_grep out '^generate: 60 tokens after a prompt of [0-9]+ '
    "$WORKER" --check g.cfg vocab=600 >out 2>err
    expect_eq "$?" 2 "a tokenizer past vocab"
    expect_grep err 'tokenizer.json has ids up to [0-9]+, expected below vocab = 600'
}

t_data_encode_of_a_text_cut_short_is_named() {
    need_tokenizers
    train_tokenizer
    # about 40 MB of text (seconds of encoding), truncated once the worker has mapped it
    for _ in $(seq 1100); do cat corpus.txt; done >big.txt
    "$WORKER" --encode tokenizer.json big.txt big.bin >out 2>err &
    local pid=$! i
    for i in $(seq 200); do
        grep -qs 'big.txt' "/proc/$pid/maps" && break
        sleep 0.05
    done
    truncate -s 0 big.txt
    wait "$pid"
    expect_eq "$?" 2 "--encode of a text cut short"
    expect_grep err 'big.txt: the file is shorter than the [0-9]+ bytes it had when it was opened: a data file must not change while a run reads it'
    [ ! -e big.bin ] || fail "big.bin written from a text cut short"
}

t_data_encode_refuses_bad_input() {
    printf '{"model": {"type": "WordPiece"}, "pre_tokenizer": {"type": "ByteLevel"}}' >wp.json
    echo hi >in.txt
    "$WORKER" --encode wp.json in.txt o.bin >out 2>err
    expect_eq "$?" 2 "--encode with a WordPiece model"
    expect_grep err 'wp.json: model.type is not "BPE"'
    [ ! -e o.bin ] || fail "o.bin written after a refusal"
    "$WORKER" --encode wp.json >out 2>err
    expect_eq "$?" 2 "--encode with too few arguments"
    expect_grep err 'encode takes TOKENIZER.JSON TEXT OUT.bin'
    # a folder stands for its tokenizer.json, as for from_pretrained; without one it is named
    mkdir slow none
    echo '{}' >slow/vocab.json
    "$WORKER" --encode slow in.txt o.bin >out 2>err
    expect_eq "$?" 2 "--encode with a folder of vocab.json"
    expect_grep err 'tokenizer slow: a folder with vocab.json .* and no tokenizer.json'
    "$WORKER" --encode none in.txt o.bin >out 2>err
    expect_eq "$?" 2 "--encode with an empty folder"
    expect_grep err 'tokenizer none: a folder with no tokenizer.json'
    [ ! -e o.bin ] || fail "o.bin written after a refusal"
}
