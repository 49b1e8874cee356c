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
