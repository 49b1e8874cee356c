#!/usr/bin/env bash
# tests/bench/allreduce_bench.sh [RANKS ...] - mgpu's CPU all-reduce against PyTorch gloo on
# this host, in one run: for each rank count (default: 2 4), REPEAT rounds (default 3) that
# run mgpu (build/tests/allreduce_bench) and gloo (tests/bench/gloo_allreduce.py under
# Debian's /usr/bin/python3) back to back, so both see the same machine; then per size the
# median over the rounds of each side's time, bandwidth (bytes / time), and the ratios.
# Both sides check their results; any wrong element fails the script.
#
# Environment: MGPU_BUILD (default build/), GLOO_PYTHON (default /usr/bin/python3),
#   MIN, MAX (default 4K, 64M), SECONDS_PER_SIZE (timed seconds per size, default 0.3),
#   REPEAT (default 3). Needs: make; apt-get install python3-torch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${MGPU_BUILD:-$root/build}
bin=$build/tests/allreduce_bench
py=${GLOO_PYTHON:-/usr/bin/python3}
min=${MIN:-4K}
max=${MAX:-64M}
secs=${SECONDS_PER_SIZE:-0.3}
repeat=${REPEAT:-3}
ranks=${*:-2 4}

[ -x "$bin" ] || { echo "allreduce_bench.sh: $bin missing: run make first" >&2; exit 2; }
"$py" -c 'import torch.distributed' 2>/dev/null ||
    { echo "allreduce_bench.sh: $py cannot import torch.distributed (apt-get install python3-torch)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); median of $repeat rounds; each round runs mgpu then gloo"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the host skews both sides)"
for n in $ranks; do
    for r in $(seq "$repeat"); do
        "$bin" -n "$n" --min "$min" --max "$max" --seconds "$secs" >"$tmp/mgpu.$n.$r"
        OMP_NUM_THREADS=1 "$py" "$here/gloo_allreduce.py" -n "$n" --min "$min" --max "$max" \
            --seconds "$secs" >"$tmp/gloo.$n.$r" 2>"$tmp/gloo.$n.$r.err" ||
            { cat "$tmp/gloo.$n.$r.err" >&2; exit 1; }
    done
    echo "# $n ranks done, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$py" - "$tmp" "$n" "$repeat" <<'EOF'
import statistics, sys
tmp, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(side):
    rows = {}
    for r in range(1, repeat + 1):
        for line in open(f"{tmp}/{side}.{n}.{r}"):
            f = line.split()
            if not f or f[0].startswith("#"):
                continue
            size, t, wrong = int(f[0]), float(f[2]), int(f[5])
            if wrong:
                sys.exit(f"{side}: {wrong} wrong elements at {size} bytes, {n} ranks")
            rows.setdefault(size, []).append(t)
    return {s: statistics.median(v) for s, v in rows.items()}
m, g = load("mgpu"), load("gloo")
print(f"\n== {n} ranks ==")
print("%10s | %12s %10s | %12s %10s | %9s %12s" % ("bytes", "mgpu us", "mgpu GB/s", "gloo us",
      "gloo GB/s", "bw x gloo", "lat / gloo"))
for s in sorted(m):
    mb, gb = s / m[s] / 1e3, s / g[s] / 1e3
    print("%10d | %12.1f %10.3f | %12.1f %10.3f | %8.1fx %11.3fx" % (s, m[s], mb, g[s], gb,
          mb / gb, m[s] / g[s]))
EOF
done
