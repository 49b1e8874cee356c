#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS] - builds the store frame fuzzer with clang's libFuzzer (ASan and
# UBSan on) and runs it for SECONDS (default 20) from a small seed corpus of valid frames.
# Exits non-zero when the build fails or the fuzzer finds a crash (the crashing input is left
# in $MGPU_BUILD/fuzz/ as crash-*).
set -euo pipefail
secs=${1:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${MGPU_BUILD:-$root/build}/fuzz
cc=${CLANG:-$(command -v clang || command -v clang-14 || true)}
[ -n "$cc" ] || { echo "fuzz: clang not found (apt-get install clang)" >&2; exit 2; }
mkdir -p "$out/corpus"

"$cc" -g -O1 -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/common" "$root/tests/fuzz/fuzz_store_frame.c" "$root/common/store_proto.c" \
    "$root/common/error.c" -o "$out/fuzz_store_frame"

# Seeds: byte 0 = mode (bit 0: response side, bit 1: small limits), byte 1 = chunking seed,
# then frames: "MG" op status id(4) len(4) payload. Written only where missing, so that the
# corpus the fuzzer grows between runs is kept.
seed() { [ -f "$out/corpus/$1" ] || printf '%b' "$2" > "$out/corpus/$1"; }
seed hello   '\x00\x07MG\x01\x00\x01\x00\x00\x00\x09\x00\x00\x00\x01\x04\x00\x00\x00toke'
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

cd "$out"
echo "fuzz: running fuzz_store_frame for ${secs}s"
./fuzz_store_frame -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 corpus
