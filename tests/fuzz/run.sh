#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS] - builds the fuzzers with clang's libFuzzer (ASan and UBSan on)
# and runs each for SECONDS (default 20) from a small seed corpus of valid inputs:
#   fuzz_store_frame  the store's frame decoder (bytes from any peer that reaches the port)
#   fuzz_launch_args  what users type to mgpu-launch: its command line and PET_* variables, a
#                     --hosts list or hostfile with --include/--exclude, CUDA_VISIBLE_DEVICES
#   fuzz_formats      the readers of the files users hand mgpu-worker: model.safetensors,
#                     tokenizer.json, llm.c token shards, .npy arrays, train.cfg, a GPT's
#                     weights (safetensors or llm.c's checkpoint)
# Exits non-zero when a build fails or a fuzzer finds a crash or a leak (the input is left in
# $MGPU_BUILD/fuzz/ as crash-* or leak-*).
set -euo pipefail
secs=${1:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${MGPU_BUILD:-$root/build}/fuzz
cc=${CLANG:-$(command -v clang || command -v clang-14 || true)}
[ -n "$cc" ] || { echo "fuzz: clang not found (apt-get install clang)" >&2; exit 2; }
mkdir -p "$out/corpus" "$out/corpus-formats" "$out/corpus-launch"
flags=(-g -O1 -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)

"$cc" "${flags[@]}" -I"$root/common" "$root/tests/fuzz/fuzz_store_frame.c" "$root/common/store_proto.c" \
    "$root/common/sha256.c" "$root/common/names.c" "$root/common/error.c" -o "$out/fuzz_store_frame"

# Seeds: byte 0 = mode (bit 0: response side, bit 1: small limits), byte 1 = chunking seed,
# then frames: "MG" op status id(4) len(4) payload. Written only where missing, so that the
# corpus the fuzzer grows between runs is kept.
seed() { [ -f "$out/corpus/$1" ] || printf '%b' "$2" > "$out/corpus/$1"; }
seed hello   '\x00\x07MG\x01\x00\x01\x00\x00\x00\x25\x00\x00\x00\x02\x20\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f'
seed auth    '\x00\x08MG\x0c\x00\x02\x00\x00\x00\x24\x00\x00\x00\x20\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f'
seed resphs  '\x01\x09MG\x81\x00\x01\x00\x00\x00\x25\x00\x00\x00\x02\x20\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1fMG\x8c\x00\x02\x00\x00\x00\x24\x00\x00\x00\x20\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f'
seed set     '\x00\x03MG\x02\x00\x02\x00\x00\x00\x0a\x00\x00\x00\x01\x00\x00\x00k\x01\x00\x00\x00v'
seed get     '\x02\x05MG\x03\x00\x03\x00\x00\x00\x09\x00\x00\x00\xe8\x03\x00\x00\x01\x00\x00\x00k'
seed add     '\x00\x09MG\x04\x00\x04\x00\x00\x00\x0d\x00\x00\x00\x01\x00\x00\x00k\x05\x00\x00\x00\x00\x00\x00\x00'
seed cas     '\x00\x0bMG\x05\x00\x05\x00\x00\x00\x0e\x00\x00\x00\x01\x00\x00\x00k\x00\x00\x00\x00\x01\x00\x00\x00d'
seed wait    '\x02\x0dMG\x06\x00\x06\x00\x00\x00\x12\x00\x00\x00\x64\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00a\x01\x00\x00\x00b'
seed check   '\x00\x0fMG\x07\x00\x07\x00\x00\x00\x09\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00a'
seed delnum  '\x00\x11MG\x08\x00\x08\x00\x00\x00\x05\x00\x00\x00\x01\x00\x00\x00kMG\x09\x00\x09\x00\x00\x00\x00\x00\x00\x00'
seed ping    '\x00\x13MG\x0a\x00\x0a\x00\x00\x00\x04\x00\x00\x00\xde\xad\xbe\xef'
seed resp    '\x01\x15MG\x83\x00\x03\x00\x00\x00\x05\x00\x00\x00\x01\x00\x00\x00vMG\x86\x01\x04\x00\x00\x00\x06\x00\x00\x00\x02\x00\x00\x00no'
seed respcas '\x01\x17MG\x85\x00\x05\x00\x00\x00\x06\x00\x00\x00\x01\x01\x00\x00\x00vMG\x84\x00\x01\x00\x00\x00\x08\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00'
seed onclose '\x00\x19MG\x0b\x00\x0b\x00\x00\x00\x0e\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00k\x01\x00\x00\x00v'
seed onidle  '\x00\x03MG\x0d\x00\x05\x00\x00\x00\x12\x00\x00\x00\x10\x27\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00k\x01\x00\x00\x00v'

l=$root/launcher
"$cc" "${flags[@]}" -I"$root/common" -I"$l" "$root/tests/fuzz/fuzz_launch_args.c" "$l/cli.c" \
    "$l/hosts.c" "$l/signames.c" "$l/output.c" "$l/numa.c" "$root/common/devices.c" \
    "$root/common/escape.c" "$root/common/text.c" "$root/common/fdio.c" "$root/common/error.c" \
    "$root/common/log.c" "$root/common/clock.c" "$root/common/names.c" -luv \
    -o "$out/fuzz_launch_args"
# Seeds of the launcher's inputs: byte 0 picks the parser (0 command line, 1 --hosts list, 2
# hostfile, 3 CUDA_VISIBLE_DEVICES), NULs split the strings.
lseed() { [ -f "$out/corpus-launch/$1" ] || printf '%b' "$2" > "$out/corpus-launch/$1"; }
lseed static '\x00--nproc_per_node=4\x00--nnodes=2\x00--node_rank=1\x00--master_addr=node0\x00--master_port=29500\x00train.cfg'
lseed torchrun '\x00--standalone\x00--nproc-per-node\x00gpu\x00--max-restarts=3\x00-m\x00pkg.mod\x00--lr\x001e-3'
lseed elastic '\x00--nnodes=1:4\x00--rdzv_backend=c10d\x00--rdzv_endpoint=[fd00::1]:29400\x00--rdzv_conf\x00join_timeout=60,last_call_timeout=5\x00--redirects=3\x00--tee\x001:2\x00--log_dir\x00/tmp/x\x00--signals_to_handle=SIGTERM,SIGUSR1\x00x.py'
lseed pet '\x00PET_NPROC_PER_NODE=2\x00PET_NNODES=2\x00--hosts\x00a:2,b:2\x00--include\x00a:0@b\x00--export=FOO,BAR\x00prog\x00--flag'
lseed output '\x00--local_ranks_filter=0,1\x00--numa_binding=node\x00--duplicate_stdout_filters=loss\x00--tty\x00--role\x00trainer\x00--grace_period=2.5\x00prog'
lseed list '\x01h1:4,h2,h3:2\x00h1:0,1@h3'
lseed file '\x02node1 slots=4\n# a comment\nnode2 slots=2 max_slots=4\n\nnode3\x00\x00node2:1'
lseed cvd '\x03 0, 2,GPU-00000003-0000-0000-0000-000000000000,5'
lseed cvd2 '\x031,1'

t=$root/worker/trainer
"$cc" "${flags[@]}" -I"$root/common" -I"$t" -I"$root/worker/runtime" -I"$root/kernels" \
    "$root/tests/fuzz/fuzz_formats.c" "$t/safetensors.c" "$t/bpe.c" "$t/ucd.c" "$t/shards.c" \
    "$t/data.c" "$t/rng.c" "$t/cfg.c" "$t/cfg_keys.c" "$t/tokens.c" "$t/weights.c" \
    "$root/worker/runtime/dtype.c" "$root/common/atomic_file.c" "$root/common/error.c" \
    "$root/common/path.c" "$root/common/fdio.c" "$root/common/text.c" -lcjson -lm \
    -o "$out/fuzz_formats"

# Seeds of the formats: byte 0 picks the reader (0 safetensors, 1 tokenizer.json, 2 shard),
# the file follows. A safetensors file of three tensors (F32, BF16, F16) with metadata; a
# byte-level BPE of the 256 bytes, three merges and an added token; an llm.c shard of each
# version, and raw uint16 ids.
"${PYTHON:-python3}" - "$out/corpus-formats" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
def seed(name, sel, body):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        with open(p, "wb") as f:
            f.write(bytes([sel]) + body)
tensors, data = {}, b""
for name, dt, shape, size in (("w", "F32", [2, 3], 4), ("b", "BF16", [3], 2), ("h", "F16", [], 2)):
    n = 1
    for x in shape:
        n *= x
    blob = bytes((7 * i + 1) % 251 for i in range(n * size))
    tensors[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
    data += blob
tensors["__metadata__"] = {"format": "pt"}
head = json.dumps(tensors).encode()
head += b" " * (-len(head) % 8)
seed("safetensors", 0, struct.pack("<Q", len(head)) + head + data)
def byte_char(b):
    n, c = 0, -1
    for x in range(b + 1):
        printable = 33 <= x <= 126 or 0xa1 <= x <= 0xac or x >= 0xae
        if printable:
            c = x
        else:
            c, n = 256 + n, n + 1
    return chr(c)
vocab = {byte_char(b): b for b in range(256)}
merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]
for r, (a, b) in enumerate(merges):
    vocab[a + b] = 256 + r
tok = {"version": "1.0",
       "added_tokens": [{"id": 259, "content": "<|endoftext|>", "special": True}],
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
       "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
seed("tokenizer", 1, json.dumps(tok, ensure_ascii=False).encode())
ids = [(37 * i + 11) % 50257 for i in range(100)]
seed("shard-u16", 2, struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack("<%dH" % len(ids), *ids))
seed("shard-u32", 2, struct.pack("<256i", 20240801, 7, len(ids), *([0] * 253)) + struct.pack("<%dI" % len(ids), *ids))
seed("raw-u16", 2, struct.pack("<%dH" % len(ids), *ids))
def npy(descr, shape, body):
    head = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    head += " " * (-(10 + len(head) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + body
seed("npy-f4", 3, npy("<f4", "(2, 3)", struct.pack("<6f", *range(6))))
seed("npy-f8", 3, npy("<f8", "(3,)", struct.pack("<3d", 1.5, -2, 1e300)))
seed("npy-i8", 4, npy("<i8", "(4,)", struct.pack("<4q", 1, -2, 2**31 - 1, 7)))
seed("npy-u1", 4, npy("|u1", "(2, 2)", bytes([1, 2, 3, 255])))
seed("cfg", 5, b"""# a train.cfg
model = gpt
n_layer = 2
n_embd = 32
n_head = 2
context = 16
batch_size = 8
lr = 3e-4
optimizer = adamw
data_tokens = tokens.bin
max_steps = 20
""")
# the GPT of the weights target: 2 layers, 2 heads, width 8, context 8, 64 tokens
L, C, T, V = 2, 8, 8, 64
def vals(n, k):
    return [((7 * i + k) % 19 - 9) / 16 for i in range(n)]
shapes = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
for i in range(L):
    h = "h.%d." % i
    shapes += [(h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]),
               (h + "attn.c_attn.weight", [C, 3 * C]), (h + "attn.c_attn.bias", [3 * C]),
               (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
               (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]),
               (h + "mlp.c_fc.weight", [C, 4 * C]), (h + "mlp.c_fc.bias", [4 * C]),
               (h + "mlp.c_proj.weight", [4 * C, C]), (h + "mlp.c_proj.bias", [C])]
shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
tensors, data = {}, b""
for k, (name, shape) in enumerate(shapes):
    n = 1
    for x in shape:
        n *= x
    blob = struct.pack("<%df" % n, *vals(n, k))
    tensors["transformer." + name] = {"dtype": "F32", "shape": shape,
                                      "data_offsets": [len(data), len(data) + len(blob)]}
    data += blob
head = json.dumps(tensors).encode()
head += b" " * (-len(head) % 8)
seed("weights-hf", 6, struct.pack("<Q", len(head)) + head + data)
sizes = [V * C, T * C] + [L * x for x in (C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C,
                                          4 * C, 4 * C * C, C)] + [C, C]
params = b"".join(struct.pack("<%df" % n, *vals(n, k)) for k, n in enumerate(sizes))
seed("weights-llmc", 6, struct.pack("<256i", 20240326, 3, T, V, L, 2, C, V, *([0] * 248)) + params)
PY

cd "$out"
echo "fuzz: running fuzz_store_frame for ${secs}s"
./fuzz_store_frame -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 corpus
echo "fuzz: running fuzz_launch_args for ${secs}s"
./fuzz_launch_args -max_total_time="$secs" -max_len=2048 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 corpus-launch
echo "fuzz: running fuzz_formats for ${secs}s"
./fuzz_formats -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 corpus-formats
