# tests/gpu/lib.sh - helpers of the GPU check scripts (sourced).
#   part NAME CMD...   runs CMD with its output in $out/NAME.txt; counts it in ok or bad and
#                      says "ok - NAME" or "not ok - NAME (exit N)" with the output's tail
#   json_last FILE KEY the value of KEY in the last JSON line of FILE that has it ("nan": none)
ok=0 bad=0
part() {
    local name=$1 rc
    shift
    "$@" >"$out/$name.txt" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        ok=$((ok + 1)); echo "ok - $name"
    else
        bad=$((bad + 1)); echo "not ok - $name (exit $rc)"; tail -n 15 "$out/$name.txt"
    fi
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
