# tests/gpu/lib.sh - helpers of the GPU check scripts (sourced; they set $out first).
#   gpu_present        0 when this machine has an NVIDIA GPU: nvidia-smi lists one, or the
#                      driver lists one under /proc/driver/nvidia/gpus (MGPU_GPU_PRESENT=0/1
#                      says it instead: tests/integration/test_gpu_checks.sh feeds it)
#   judge RC FILE GPU  the verdict on a check whose command exited RC with its output in FILE,
#                      on a machine with (GPU=1) or without (GPU=0) a GPU: prints "ok",
#                      "skip - REASON" or "fail - REASON"
#   part NAME CMD...   a check: runs CMD with its output in $out/NAME.txt, judges it, counts it
#                      in ok, bad or skipped and says "ok - NAME", "skip - NAME: why" or
#                      "not ok - NAME: why" with the output's tail
#   bench NAME CMD...  a benchmark: runs CMD (pipefail: no stage's failure is hidden) with its
#                      output in $out/NAME.txt; counted apart, in bench_ok or bench_bad
#   summary            the benchmarks' line, then "N passed, N failed[, N skipped]"; its status
#                      is non-zero when a check or a benchmark failed
#   json_last FILE KEY the value of KEY in the last JSON line of FILE that has it ("nan": none)
ok=0 bad=0 skipped=0 bench_ok=0 bench_bad=0

gpu_present() {
    case "${MGPU_GPU_PRESENT:-}" in
        1) return 0 ;;
        0) return 1 ;;
    esac
    nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && return 0
    [ -n "$(ls -A /proc/driver/nvidia/gpus 2>/dev/null)" ]
}

# On a machine with a GPU, a check passes only when it ran on the GPU: a skipped test, a
# simulated device or a CPU run there means the GPU path was never exercised. The one skip it
# allows is a test that needs more GPUs than the machine has (its reason says "fewer than N
# CUDA devices (M)" with M < N): that test belongs to a machine with more, and
# multi_gpu_checks.sh runs it there.
judge() {
    local rc=$1 file=$2 gpu=$3 n_ok n_skip n_more first
    n_ok=$(grep -cE '^ok - ' "$file")
    n_skip=$(grep -cE '^skip - |^ +skip: ' "$file")
    # each such skip prints its reason ("  skip: ...") and its result ("skip - name")
    n_more=$(grep -E '^ +skip: fewer than [0-9]+ CUDA devices \([0-9]+\)' "$file" |
        awk -F'[ ()]+' '{ for (i = 1; i < NF; i++) if ($i == "than") { need = $(i+1) }
                          have = $(NF-1); if (have + 0 < need + 0) n++ } END { print n + 0 }')
    n_skip=$((n_skip - 2 * n_more))
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
        echo "fail - exit $rc"; return
    fi
    if [ "$gpu" = 1 ]; then
        first=$(grep -E '^ +skip: ' "$file" | grep -m1 -vE 'skip: fewer than [0-9]+ CUDA devices')
        [ -n "$first" ] || first=$(grep -m1 -E '^skip - ' "$file")
        if [ "$rc" -eq 77 ] || [ "$n_skip" -gt 0 ]; then
            echo "fail - skipped on a machine with a GPU (${first:-exit 77})"; return
        fi
        # result lines name tests (a test of the simulated mode passes on a GPU machine too)
        # what mgpu prints of simulated GPUs (a test's own words about them, such as the
        # refusal it checks, are not a simulation)
        first=$(grep -vE '^(ok|not ok) - ' "$file" |
            grep -m1 -E '\[simulated\]|\(simulated: MGPU_SIM_GPUS\)|MGPU_SIM_GPUS=[1-9]|"simulated(_gpus)?": ?true')
        [ -n "$first" ] && { echo "fail - simulated GPUs on a machine with a GPU: $first"; return; }
        first=$(grep -vE '^(ok|not ok) - ' "$file" |
            grep -m1 -E '"backend": ?"cpu"|"device": ?"cpu"|\(0 GPU\(s\) visible\)|use 0 GPUs!')
        [ -n "$first" ] && { echo "fail - ran on the CPU on a machine with a GPU: $first"; return; }
        echo "ok"; return
    fi
    if [ "$rc" -eq 77 ] || { [ "$n_skip" -gt 0 ] && [ "$n_ok" -eq 0 ]; }; then
        echo "skip - no GPU here: every test skipped"; return
    fi
    echo "ok"
}

part() {
    local name=$1 rc verdict gpu=0
    shift
    gpu_present && gpu=1
    "$@" >"$out/$name.txt" 2>&1
    rc=$?
    verdict=$(judge "$rc" "$out/$name.txt" "$gpu")
    case "$verdict" in
        ok) ok=$((ok + 1)); echo "ok - $name" ;;
        skip*) skipped=$((skipped + 1)); echo "skip - $name: ${verdict#skip - }" ;;
        *) bad=$((bad + 1)); echo "not ok - $name: ${verdict#fail - }"; tail -n 15 "$out/$name.txt" ;;
    esac
}

bench() {
    local name=$1 rc
    shift
    ( set -o pipefail; "$@" ) >"$out/$name.txt" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        bench_ok=$((bench_ok + 1)); echo "bench - $name"; sed 's/^/    /' "$out/$name.txt" | tail -n 5
    else
        bench_bad=$((bench_bad + 1)); echo "bench not ok - $name (exit $rc)"; tail -n 15 "$out/$name.txt"
    fi
}

summary() {
    echo "benchmarks: $bench_ok ran, $bench_bad failed"
    if [ "$skipped" -gt 0 ]; then
        echo "$ok passed, $bad failed, $skipped skipped"
    else
        echo "$ok passed, $bad failed"
    fi
    [ "$bad" -eq 0 ] && [ "$bench_bad" -eq 0 ]
}

json_last() {
    "${PY:-python3}" -c 'import json,sys
v=None
for l in open(sys.argv[1]):
    try: o=json.loads(l)
    except Exception: continue
    if sys.argv[2] in o: v=o[sys.argv[2]]
print("nan" if v is None else v)' "$1" "$2"
}
