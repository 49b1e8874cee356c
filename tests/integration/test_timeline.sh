# test_timeline.sh - the workers' startup timeline: published to the store under
# "<run_id>/<attempt>/timeline/<rank>" (libmgpu does it), printed and summarised by the launcher.

SC="$MGPU_BUILD/tests/store_cli"

t_timeline_printed_and_in_summary() {
    "$LAUNCH" --nproc_per_node=3 --summary s.json -- bash -c \
        "$SC set timeline/\$RANK \"exec=\$(date +%s.%N);device=\$(date +%s.%N);first_step=\$(date +%s.%N)\"" \
        >out 2>err || fail "launcher exit $?"
    expect_grep err 'startup timeline \(ms after mgpu-launch spawned each worker\)'
    expect_grep err 'rank +exec +device +first_step'
    for r in 0 1 2; do expect_grep err "^ +$r +[0-9.]+ +[0-9.]+ +[0-9.]+$"; done
    python3 - <<'PY' || fail "summary timeline"
import json
w = json.load(open("s.json"))["workers"]
# the launcher adds spawn (before fork) and exec (the child's execve) itself
assert all(set(x["timeline"]) == {"spawn", "exec", "device", "first_step"} for x in w), w
assert all(x["timeline"]["spawn"] <= x["timeline"]["exec"] <= x["timeline"]["first_step"]
           for x in w), w
PY
}

t_timeline_of_the_last_attempt_only() {
    # attempt 0 publishes and fails; attempt 1 publishes "second=": only that is shown
    "$LAUNCH" --nproc_per_node=1 --max_restarts=1 -- bash -c \
        "if [ \$TORCHELASTIC_RESTART_COUNT = 0 ]; then $SC set timeline/0 first=\$(date +%s.%N); exit 3; fi; $SC set timeline/0 second=\$(date +%s.%N)" \
        >out 2>err || fail "launcher exit $?"
    expect_grep err 'rank +exec +second$'
    expect_no_grep err 'first'
}

t_no_timeline_no_table() {
    "$LAUNCH" --nproc_per_node=2 -- true >out 2>err || fail "launcher exit $?"
    expect_no_grep err 'startup timeline'
}
