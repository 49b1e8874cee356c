# test_repo.sh - the repository's own rules: sources stay under 1,000 lines, and nothing in it
# speaks of anything but the project (no tracker numbers, no files that are not in it).

t_repo_no_source_over_1000_lines() {
    cd "$MGPU_ROOT" || fail "cd"
    local big
    big=$(find common launcher worker kernels -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) \
        -exec wc -l {} + | awk '$2 != "total" && $1 > 1000 {print $2 " (" $1 " lines)"}')
    [ -z "$big" ] || fail "over 1,000 lines: $big"
}

t_repo_speaks_of_the_project_alone() {
    cd "$MGPU_ROOT" || fail "cd"
    command -v git >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1 || skip "not a git checkout"
    # Issue-tracker numbers, notes files that are not in the repository, history of work, the
    # machines it was made on.
    local pat='issue [0-9]|issues? #[0-9]|(NOTES|TORCHRUN|DESIGN|STYLE|KINDS|DEVELOPERS)\.md|sessions? [0-9]|rounds? [0-9]|borrowed (gpu|machine)|device[ ]budget'
    local hits
    hits=$(git grep -nIiE "$pat" -- . ':!tests/integration/test_repo.sh' || true)
    [ -z "$hits" ] || fail "words about something other than the project:
$hits"
}

t_repo_readme_stays_a_short_map() {
    # the top README is a first screen and a map: under 250 lines, the two commands first, one
    # section for several hosts; the details live in the folders' READMEs
    local f="$MGPU_ROOT/README.md" n
    n=$(wc -l <"$f")
    [ "$n" -lt 250 ] || fail "README.md has $n lines: keep it under 250 (details go to the folders' READMEs)"
    head -6 "$f" | grep -q '^make test$' || fail "README.md's first screen lacks the two commands"
    expect_eq "$(grep -c '^## Several hosts$' "$f")" 1 "sections 'Several hosts' in README.md"
    local way
    for way in 'mgpu-launch --hostfile' 'srun ' 'mpirun ' 'command: \["mgpu-launch"'; do
        sed -n '/^## Several hosts$/,/^## /p' "$f" | grep -q "$way" || fail "the Several hosts section lacks '$way'"
    done
}
