#!/usr/bin/env bash
# tests/bench/store_bench.sh [SECONDS [CLIENTS [RDZV [REPS]]]] - mgpu's store against
# PyTorch's TCPStore, in the same run and on the same CPUs: get and set round trips per second
# with 1 and CLIENTS (default 64) client processes, and a rendezvous of RDZV (default 1024)
# processes timed end to end; each figure is the median of REPS (default 3) measurements
# (of SECONDS, default 1, for throughput). Prints both programs' lines, then a table.
#   CPUS=0,1 (default)  the CPUs both runs are pinned to (taskset); CPUS= for no pinning
#   PYTHON=/usr/bin/python3  the interpreter that has torch (Debian's python3-torch)
# Benchmarks print figures; they assert nothing but the "#wrong" column (checked results).
set -euo pipefail
secs=${1:-1} clients=${2:-64} rdzv=${3:-1024} reps=${4:-3}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${MGPU_BUILD:-$root/build}/bench
py=${PYTHON:-/usr/bin/python3}
cpus=${CPUS-0,1}
cc=${CC:-cc}
libuv=
for f in /usr/lib/"$($cc -dumpmachine)"/libuv_a.a /usr/lib/libuv_a.a /usr/local/lib/libuv_a.a; do
    [ -f "$f" ] && { libuv=$f; break; }
done
[ -n "$libuv" ] || { echo "store_bench: libuv_a.a not found (apt-get install libuv1-dev)" >&2; exit 2; }
mkdir -p "$out"

# Built here, with the sources it needs, so it does not depend on the rest of the tree.
"$cc" -O2 -g -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
    -I"$root/common" -I"$root/launcher" "$root/tests/bench/store_bench.c" \
    "$root"/common/{store,store_proto,error,log}.c "$root/launcher/store_server.c" \
    "$libuv" -lpthread -ldl -lm -o "$out/store_bench"

pin=()
if [ -n "$cpus" ] && command -v taskset >/dev/null; then pin=(taskset -c "$cpus"); fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

echo "# store_bench.sh $secs $clients $rdzv $reps on $(nproc) CPUs${cpus:+, pinned to $cpus}; $(uname -r)"
echo "# mgpu store"
"${pin[@]}" "$out/store_bench" "$secs" "$clients" "$rdzv" "$reps" | tee "$out/mgpu.txt"
echo "# torch $("$py" -c 'import torch; print(torch.__version__)') TCPStore"
"${pin[@]}" "$py" "$root/tests/bench/tcpstore_bench.py" "$secs" "$clients" "$rdzv" "$reps" | tee "$out/torch.txt"

echo
awk -v secs="$secs" '
    /^#/ { next }
    FNR == NR { m[$1 " " $2] = $3; mw[$1 " " $2] = $4; order[++n] = $1 " " $2; next }
    { t[$1 " " $2] = $3; tw[$1 " " $2] = $4 }
    END {
        printf "%-28s %12s %12s %8s %s\n", "", "mgpu", "TCPStore", "ratio", "#wrong (mgpu/torch)"
        for (i = 1; i <= n; i++) {
            k = order[i]; split(k, f, " ")
            if (f[1] == "rdzv") {
                printf "%-28s %11.3fs %11.3fs %7.2fx %d/%d\n", "rendezvous of " f[2] " (time)",
                    m[k], t[k], (m[k] > 0 ? t[k] / m[k] : 0), mw[k], tw[k]
            } else {
                printf "%-28s %12d %12d %7.2fx %d/%d\n", f[1] ", " f[2] " client" (f[2] > 1 ? "s" : "") " (ops/s)",
                    m[k], t[k], (t[k] > 0 ? m[k] / t[k] : 0), mw[k], tw[k]
            }
        }
        print "figures: the median of the measurements listed on the \"# \" lines above"
        print "ratio: mgpu ops/s over TCPStore ops/s; for the rendezvous, TCPStore time over mgpu time"
        print "note: TCPStore 1.13 set sends and returns without a reply (no round trip); mgpu set"
        print "      waits for the server to acknowledge it. TCPStore get is two round trips (WAIT, GET)."
    }' "$out/mgpu.txt" "$out/torch.txt"
