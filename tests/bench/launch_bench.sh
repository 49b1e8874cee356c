#!/usr/bin/env bash
# tests/bench/launch_bench.sh - how fast and small mgpu-launch is, next to torchrun.
#
#   0. start-to-exit of `mgpu-launch --nproc_per_node=N /bin/true` for 1, 8 and 64 workers,
#      with the launcher's output on a pipe and on a terminal (`script`, so that it gives each
#      worker pseudo-terminals, as at a console), beside `sh` starting as many /bin/true in the
#      same run: rounds of RUNS/10 launches, then as many of sh, so that both see the same load
#      on a busy machine; the ratio of the medians (targets: 8 workers <= 1.5x sh, 64 <= 2x);
#      then where the launcher's time goes: the median of each phase of MGPU_LAUNCH_TRACE over
#      RUNS/2 runs (8 workers, on a pipe, then on a terminal) and RUNS/8 (64, on a pipe), with
#      the exec and loading before main and the exit after it (timeit's stamps), and
#      `strace -f -c` of one run of 8;
#   1. start-to-exit of `mgpu-launch --nproc_per_node=8 -- /bin/true` (many runs: median, p90)
#      against Debian's torchrun 1.13 in the same run (fewer runs: each takes seconds):
#      /usr/bin/python3 -m torch.distributed.run --nproc_per_node=8 --tee 1 --redirects 2
#        --log_dir DIR --monitor_interval 0.1 --no_python /bin/true
#      (1.13 crashes on Python 3.11 without --tee/--redirects/--log_dir; --monitor_interval 0.1
#      so that its 5 s default poll is not what is measured), and the ratio of the medians;
#   2. the launcher's peak RSS (/usr/bin/time -f %M, and VmHWM from /proc while it runs);
#   3. how long a worker's death takes to reach the other workers' SIGTERM: rank 0 records
#      CLOCK_MONOTONIC just before _exit(1), the others in their SIGTERM handler.
# Targets: 8 workers within 1.5x sh's time and 64 within 2x; median < 20 ms on a 2-core
# machine, RSS < 8 MB, death->SIGTERM < 5 ms.
#
# usage: tests/bench/launch_bench.sh [RUNS] [TORCHRUN_RUNS] [DEATH_RUNS]   (default 200 5 30)
#   MGPU_BUILD=build dir (default: build next to tests/), TORCHRUN_PYTHON=/usr/bin/python3,
#   PARTS="0 1 2 3" (the parts to run)
set -u
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${MGPU_BUILD:-$here/../../build}
LAUNCH=$BUILD/bin/mgpu-launch
TW=$BUILD/tests/testworker
RUNS=${1:-200}
TR_RUNS=${2:-5}
DEATH_RUNS=${3:-30}
PY=${TORCHRUN_PYTHON:-/usr/bin/python3}
PARTS=" ${PARTS:-0 1 2 3} "
part() { [[ "$PARTS" == *" $1 "* ]]; }

[ -x "$LAUNCH" ] || { echo "no $LAUNCH: run make first" >&2; exit 2; }
[ -x "$TW" ] || { echo "no $TW (the test helper): run make first" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# CPU workers (a GPU machine would refuse 8 workers on fewer GPUs), no OMP banner to print
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES
export OMP_NUM_THREADS=1

# stats FILE COLUMN: "median p90 min max" of a column of numbers (ns) in ms
stats() {
    awk -v c="${2:-1}" '{print $c}' "$1" | sort -n | awk '
        { v[NR] = $1 }
        END {
            if (NR == 0) { print "nan nan nan nan"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            i = int(0.9 * NR + 0.999999); if (i < 1) i = 1; if (i > NR) i = NR
            printf "%.3f %.3f %.3f %.3f\n", m / 1e6, v[i] / 1e6, v[1] / 1e6, v[NR] / 1e6
        }'
}
# verdict VALUE TARGET: "ok" when VALUE < TARGET
verdict() { awk -v v="$1" -v t="$2" 'BEGIN { print (v + 0 < t + 0) ? "ok" : "MISSED" }'; }
failures() { awk '$2 != 0' "$1" | wc -l; }

echo "mgpu-launch benchmark: $(uname -n), $(getconf _NPROCESSORS_ONLN) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "  $("$LAUNCH" --version)  ($LAUNCH)"
load=$(cut -d' ' -f1 /proc/loadavg)
echo "  load average at start: $load$(awk -v l="$load" 'BEGIN { if (l > 0.5) print "  (a busy machine: timings are inflated; run again when idle)" }')"
echo

# --- 0. beside sh, and where the time goes -------------------------------------------------
# the shell's loop: N x /bin/true in the background, waited for
sh_loop() { echo "i=0; while [ \$i -lt $1 ]; do /bin/true & i=\$((i + 1)); done; wait"; }
# timeit_tty TTY N OUT CMD...: testworker timeit, under a terminal when TTY is "tty"
timeit_tty() {
    local tty=$1; shift
    if [ "$tty" = tty ]; then
        script -qefc "$(printf '%q ' "$TW" timeit "$@")" /dev/null >/dev/null 2>&1 </dev/null
    else
        "$TW" timeit "$@" >/dev/null 2>&1 </dev/null
    fi
}
# versus N TTY RUNS: "median_mgpu median_sh" (ms) over interleaved rounds
versus() {
    local n=$1 tty=$2 runs=$3 per r
    per=$(((runs + 9) / 10))
    : >"$work/vs_m"
    : >"$work/vs_s"
    for r in $(seq 1 10); do
        timeit_tty "$tty" "$per" "$work/vs1" "$LAUNCH" --nproc_per_node="$n" /bin/true
        cat "$work/vs1" >>"$work/vs_m"
        timeit_tty "$tty" "$per" "$work/vs1" /bin/sh -c "$(sh_loop "$n")"
        cat "$work/vs1" >>"$work/vs_s"
    done
    [ "$(failures "$work/vs_m")" -eq 0 ] || echo "   WARNING: $(failures "$work/vs_m") mgpu-launch runs did not exit 0" >&2
    echo "$(stats "$work/vs_m" | cut -d' ' -f1) $(stats "$work/vs_s" | cut -d' ' -f1)"
}
# phases TIMEIT TRACE: the median of each phase over the runs, and its share of the median
# start to exit; before main (exec, loading) and after the last mark (exit, reaping) from
# timeit's CLOCK_MONOTONIC stamps
phases() {
    awk '
    function med(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j > 0 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    FNR == NR { nt++; t0[nt] = $3; t1[nt] = $4; next }
    /^mgpu-launch trace:/ { run++; next }
    /^  phase / { next }
    /^  / {
        name = substr($0, 3, 20); sub(/ +$/, "", name); n = split(substr($0, 23), f, " ")
        if (f[1] == "(start)") { main0[run] = f[3]; next }
        if (f[1] == "(point)") { if (!(name in pseen)) { pseen[name] = 1; porder[++np] = name }; pt[name, run] = f[3]; next }
        if (!(name in seen)) { seen[name] = 1; order[++no] = name }
        v[name, run] += f[1]; last[run] = f[4]
    }
    END {
        n = run < nt ? run : nt
        for (r = 1; r <= n; r++) a[r] = (t1[r] - t0[r]) / 1e6; T = med(a, n)
        for (r = 1; r <= n; r++) a[r] = (main0[r] - t0[r]) / 1e6; m = med(a, n)
        printf "     %-26s %8.3f ms %5.1f%%\n", "exec, loading (before main)", m, 100 * m / T
        for (i = 1; i <= no; i++) { k = order[i]; for (r = 1; r <= n; r++) a[r] = v[k, r] + 0; m = med(a, n)
            printf "     %-26s %8.3f ms %5.1f%%\n", k, m, 100 * m / T }
        for (r = 1; r <= n; r++) a[r] = (t1[r] - last[r]) / 1e6; m = med(a, n)
        printf "     %-26s %8.3f ms %5.1f%%\n", "exit, reaping (after main)", m, 100 * m / T
        printf "     %-26s %8.3f ms  (median of %d runs; the medians need not add up to it)\n", "start to exit", T, n
        for (i = 1; i <= np; i++) { k = porder[i]; for (r = 1; r <= n; r++) a[r] = (pt[k, r] - t0[r]) / 1e6
            printf "     %-26s %8.3f ms after the start\n", k, med(a, n) }
    }' "$1" "$2"
}

if part 0; then
echo "0. start to exit beside sh in the same run (ratio of the medians; $RUNS runs of each, 64 workers: $((RUNS / 4)))"
printf '   %-8s %-9s %12s %12s %8s   %s\n' workers output mgpu-launch sh ratio target
for n in 1 8 64; do
    runs=$RUNS
    [ "$n" -ge 64 ] && runs=$((RUNS / 4))
    for tty in pipe tty; do
        read -r vm vs < <(versus "$n" "$tty" "$runs")
        ratio=$(awk -v a="$vm" -v b="$vs" 'BEGIN { printf "%.2f", a / b }')
        case $n in 8) target=1.5 ;; 64) target=2 ;; *) target="" ;; esac
        printf '   %-8s %-9s %9.2f ms %9.2f ms %7sx   %s\n' "$n" "$tty" "$vm" "$vs" "$ratio" \
            "${target:+<= ${target}x: $(awk -v r="$ratio" -v t="$target" 'BEGIN { print (r <= t) ? "ok" : "MISSED" }')}"
    done
done
for spec in "8 pipe" "8 tty" "64 pipe"; do
    read -r n tty <<<"$spec"
    runs=$((RUNS / 2))
    [ "$n" -ge 64 ] && runs=$((RUNS / 8))
    rm -f "$work/trace"
    MGPU_LAUNCH_TRACE=$work/trace timeit_tty "$tty" "$runs" "$work/traced" "$LAUNCH" --nproc_per_node="$n" /bin/true
    echo "   where the time goes, $n workers of /bin/true, output on $([ "$tty" = tty ] && echo "a terminal" || echo "a pipe") (MGPU_LAUNCH_TRACE):"
    phases "$work/traced" "$work/trace"
done
if command -v strace >/dev/null 2>&1 &&
    strace -f -c -o "$work/strace" "$LAUNCH" --nproc_per_node=8 /bin/true >/dev/null 2>&1; then
    echo "   strace -f -c, one run of 8 workers: the calls that took the most time, waits left out"
    echo "   (epoll_wait, poll, wait4, futex, read); the launcher and its children, each call slowed by strace:"
    awk 'NR <= 2 || /^-/ || $1 == "total" || NF < 5 { next }
        $NF ~ /^(epoll_wait|poll|wait4|futex|read)$/ { next } { print }' "$work/strace" | head -n 8 | sed 's/^/     /'
fi
echo
fi

# --- 1. start to exit -----------------------------------------------------------------------
if part 1; then
"$TW" timeit 10 "$work/warm" "$LAUNCH" --nproc_per_node=8 -- /bin/true >/dev/null 2>&1
"$TW" timeit "$RUNS" "$work/mgpu" "$LAUNCH" --nproc_per_node=8 -- /bin/true >/dev/null 2>&1
read -r m_med m_p90 m_min m_max < <(stats "$work/mgpu")
echo "1. start to exit, 8 workers of /bin/true"
printf '   mgpu-launch   %4d runs: median %8.2f ms  p90 %8.2f ms  min %8.2f  max %8.2f   target median < 20 ms: %s\n' \
    "$RUNS" "$m_med" "$m_p90" "$m_min" "$m_max" "$(verdict "$m_med" 20)"
[ "$(failures "$work/mgpu")" -eq 0 ] || echo "   WARNING: $(failures "$work/mgpu") mgpu-launch runs did not exit 0"

# the floor: 8 fork+exec of /bin/true by a shell, waited for
"$TW" timeit "$RUNS" "$work/floor" /bin/sh -c '/bin/true & /bin/true & /bin/true & /bin/true & /bin/true & /bin/true & /bin/true & /bin/true & wait' >/dev/null 2>&1
read -r f_med f_p90 _ _ < <(stats "$work/floor")
printf '   (sh starting 8 x /bin/true itself: median %.2f ms, p90 %.2f ms)\n' "$f_med" "$f_p90"

if [ -x "$PY" ] && "$PY" -c 'import torch.distributed.run' >/dev/null 2>&1; then
    tr_ver=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
    : >"$work/torchrun"
    for i in $(seq 1 "$TR_RUNS"); do
        rm -rf "$work/trlogs"
        "$TW" timeit 1 "$work/tr1" "$PY" -m torch.distributed.run --nproc_per_node=8 --tee 1 --redirects 2 \
            --log_dir "$work/trlogs" --monitor_interval 0.1 --no_python /bin/true >/dev/null 2>&1
        cat "$work/tr1" >>"$work/torchrun"
    done
    read -r t_med t_p90 t_min t_max < <(stats "$work/torchrun")
    printf '   torchrun %-6s%4d runs: median %8.2f ms  p90 %8.2f ms  min %8.2f  max %8.2f\n' \
        "$tr_ver" "$TR_RUNS" "$t_med" "$t_p90" "$t_min" "$t_max"
    [ "$(failures "$work/torchrun")" -eq 0 ] || echo "   WARNING: $(failures "$work/torchrun") torchrun runs did not exit 0"
    printf '   ratio torchrun / mgpu-launch (medians): %.0fx\n' "$(awk -v a="$t_med" -v b="$m_med" 'BEGIN { print a / b }')"
else
    echo "   torchrun: skipped ($PY cannot import torch.distributed.run; apt-get install python3-torch)"
fi
echo

fi

# --- 2. memory ------------------------------------------------------------------------------
if part 2; then
echo "2. the launcher's peak resident memory"
if [ -x /usr/bin/time ]; then
    /usr/bin/time -f %M -o "$work/rss" "$LAUNCH" --nproc_per_node=8 -- /bin/true >/dev/null 2>&1
    rss_kb=$(tail -n 1 "$work/rss")
    printf '   /usr/bin/time -f %%M, 8 x /bin/true:           %6d KB = %5.2f MB   target < 8 MB: %s\n' \
        "$rss_kb" "$(awk -v k="$rss_kb" 'BEGIN { print k / 1024 }')" "$(verdict "$rss_kb" 8192)"
    echo "   (the largest of the launcher and the processes it reaped, which are smaller here)"
else
    echo "   /usr/bin/time not installed (apt-get install time): using /proc only"
fi
# VmHWM of the launcher itself, read from /proc once all 8 workers are done with ACTIONS
# hwm LABEL ACTIONS...
hwm() {
    local label=$1; shift
    rm -f "$work"/done.* "$work/go"
    "$LAUNCH" --nproc_per_node=8 "$TW" "$@" touch "$work/done.%l" waitfile "$work/go" >/dev/null 2>&1 &
    local lp=$! n kb
    for _ in $(seq 1 2000); do
        n=$(find "$work" -maxdepth 1 -name "done.*" | wc -l)
        [ "$n" -ge 8 ] && break
        sleep 0.01
    done
    kb=$(awk '/^VmHWM:/ { print $2 }' "/proc/$lp/status" 2>/dev/null)
    touch "$work/go"
    wait $lp
    printf '   VmHWM, %-42s %6s KB = %5.2f MB   target < 8 MB: %s\n' "$label" \
        "${kb:-?}" "$(awk -v k="${kb:-0}" 'BEGIN { print k / 1024 }')" "$(verdict "${kb:-999999}" 8192)"
}
hwm "8 idle workers:" sleep 0
hwm "8 workers x 2 x 20,000 lines of 0-120 B:" output_short 20000 7
hwm "8 workers x 2 x 3,000 lines of 0-100 KB:" output 3000 7
echo

fi

# --- 3. death -> SIGTERM --------------------------------------------------------------------
if part 3; then
echo "3. a worker's death reaching the other workers' SIGTERM (4 workers, $DEATH_RUNS runs)"
: >"$work/delays"
: >"$work/delays_all"
bad=0
for i in $(seq 1 "$DEATH_RUNS"); do
    d="$work/death$i"
    mkdir -p "$d"
    "$LAUNCH" --nproc_per_node=4 --grace_period=10 "$TW" trap "$d/term.%l" TERM touch "$d/ready.%l" \
        only 0 waitall "$d/ready." 4 only 0 stamp_exit "$d/died" 1 pause >/dev/null 2>&1
    rc=$?
    if [ "$rc" -ne 1 ] || [ ! -s "$d/died" ]; then bad=$((bad + 1)); continue; fi
    died=$(cat "$d/died")
    worst=0
    for k in 1 2 3; do
        t=$(awk '$1 == "TERM" { print $2; exit }' "$d/term.$k" 2>/dev/null)
        [ -n "$t" ] || { bad=$((bad + 1)); continue 2; }
        echo $((t - died)) >>"$work/delays_all"
        [ $((t - died)) -gt "$worst" ] && worst=$((t - died))
    done
    echo "$worst" >>"$work/delays"
    rm -rf "$d"
done
read -r d_med d_p90 _ d_max < <(stats "$work/delays")
read -r a_med _ _ _ < <(stats "$work/delays_all")
printf '   last of the 3 others to get SIGTERM: median %.3f ms  p90 %.3f ms  max %.3f ms   target < 5 ms: %s\n' \
    "$d_med" "$d_p90" "$d_max" "$(verdict "$d_med" 5)"
printf '   every other worker:                  median %.3f ms\n' "$a_med"
[ "$bad" -eq 0 ] || echo "   WARNING: $bad runs gave no measurement"
fi
