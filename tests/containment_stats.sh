#!/usr/bin/env bash
# tests/containment_stats.sh [RUNS] [MODES] [EVENTS] - how many processes outlive a job.
#
# RUNS (default 100) randomized runs of each event and mode of tests/integration/
# test_containment.sh: 2 or 3 workers start a random mix of grandchildren (in the worker's
# group ignoring SIGTERM, setsid, daemon by double fork, own process group, ignoring SIGTERM,
# environment cleared), then the launcher gets SIGKILL (kill9), its whole process group does
# (kill9pg), or a worker fails (fail). Modes: cgroup (a cgroup of the job's own; as root or with
# a delegated group) and fallback (MGPU_CGROUP=0). Prints, per mode and event, the runs that
# left processes behind and how many processes, CONTAIN_WAIT (default 3) s after the launcher
# ended; leftovers are then killed. Exits 1 when any run left a process behind (.ci/run runs
# it with 100 runs of each).
#   MGPU_BUILD=build dir (default: build next to tests/)
set -u
here=$(cd "$(dirname "$0")" && pwd)
export MGPU_BUILD=${MGPU_BUILD:-$here/../build}
RUNS=${1:-100}
export CONTAIN_WAIT=${CONTAIN_WAIT:-3}
MODES=${2:-cgroup fallback}
EVENTS=${3:-kill9 kill9pg fail}

source "$here/integration/lib.sh"
source "$here/integration/test_containment.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 2
write_worker

echo "containment: $(uname -n), $(uname -r), $(date -u '+%Y-%m-%d %H:%M UTC'), $RUNS runs each"
echo "  $("$LAUNCH" --version), load average at start: $(cut -d' ' -f1 /proc/loadavg)"
total_left=0
for mode in $MODES; do
    if [ "$mode" = cgroup ]; then
        MGPU_CGROUP= "$LAUNCH" -v --nproc_per_node=1 /bin/true >out 2>err
        grep -q 'containment: cgroup /' err ||
            { echo "  cgroup: skipped ($(sed -n 's/.*containment: //p' err))"; continue; }
    fi
    for event in $EVENTS; do
        runs_left=0 procs_left=0
        for i in $(seq 1 "$RUNS"); do
            one_run "$mode" "$event" "$i"
            if [ -n "$LEFT" ]; then
                runs_left=$((runs_left + 1))
                procs_left=$((procs_left + $(wc -w <<<"$LEFT")))
                total_left=$((total_left + $(wc -w <<<"$LEFT")))
                kill -9 $LEFT 2>/dev/null
            fi
        done
        printf '  %-8s %-8s %4d runs: %3d left processes behind, %4d processes in all\n' \
            "$mode" "$event" "$RUNS" "$runs_left" "$procs_left"
    done
done
[ "$total_left" -eq 0 ]
