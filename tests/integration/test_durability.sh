# test_durability.sh - a checkpoint survives a crash at any moment: through the real launcher and
# worker, with tests/shim/io_trace.c preloaded to log the file calls in order, every checkpoint
# must be written to a temporary file whose data is fsync'd before the rename that makes it the
# checkpoint, and the directory must be fsync'd after that rename (the new name lives there).
# What is checked is the order of the calls, whatever function of the code makes them.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES
export MGPU_SIM_GPUS=0
export OMP_NUM_THREADS=1

IO_TRACE="$MGPU_BUILD/lib/libmgpu_io_trace.so"

# check_order LOG TARGET: prints what is wrong with the writes of TARGET in LOG (nothing: all
# good), and how many times TARGET was replaced, as "replaced N"
check_order() {
    awk -v target="$2" '
        function dirname(p) { sub(/\/[^\/]*$/, "", p); return p == "" ? "/" : p }
        $2 == "write" { wrote[$1, $3] = NR; synced[$1, $3] = 0 }
        $2 == "fsync" { if (($1, $3) in wrote) synced[$1, $3] = NR
                        if (pending[$1] != "" && $3 == pending[$1]) pending[$1] = "" }
        $2 == "rename" && $4 == target {
            n++
            if (pending[$1] != "") print "replacement " n - 1 ": directory " pending[$1] " not fsynced after its rename"
            if (!(($1, $3) in wrote)) print "replacement " n ": no write to " $3 " seen before its rename"
            else if (!synced[$1, $3]) print "replacement " n ": " $3 " renamed over " target " without an fsync of its data after the last write"
            pending[$1] = dirname(target)
        }
        END {
            for (p in pending) if (pending[p] != "") print "replacement " n ": directory " pending[p] " not fsynced after its rename"
            print "replaced " n + 0
        }' "$1"
}

t_checkpoint_fsynced_before_rename_and_directory_after() {
    [ -f "$IO_TRACE" ] || fail "$IO_TRACE not built (make builds it)"
    mkdir ck
    printf '%s\n' 'dataset = synthetic' 'samples = 200' 'features = 4' 'classes = 2' \
        'model = linear' 'loss = cross_entropy' 'batch_size = 50' 'epochs = 3' 'log_interval = 0' \
        >d.cfg
    # an ASan build wants its runtime first in the library list: the shim comes before it here
    LD_PRELOAD=$IO_TRACE MGPU_IO_TRACE=$TEST_TMP/io.log \
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
        "$LAUNCH" --nproc_per_node=2 d.cfg checkpoint="$TEST_TMP/ck/c.ckpt" >out 2>err ||
        { rc=$?; cat out err >&2; fail "the run: exit $rc"; }
    [ -s io.log ] || fail "the shim logged nothing (LD_PRELOAD=$IO_TRACE)"
    check_order io.log "$TEST_TMP/ck/c.ckpt" >order
    # one checkpoint an epoch
    expect_grep order '^replaced 3$'
    expect_no_grep order '^replacement'
}

t_check_order_catches_each_missing_fsync() {
    # the checker itself, on logs with one fsync left out or moved
    local t=/d/c.ckpt
    printf '%s\n' "1 open /d/c.ckpt.tmp" "1 write /d/c.ckpt.tmp" "1 fsync /d/c.ckpt.tmp" \
        "1 rename /d/c.ckpt.tmp $t" "1 open /d" "1 fsync /d" >good.log
    check_order good.log $t >o; expect_eq "$(cat o)" "replaced 1" "good log"
    grep -v 'fsync /d/c' good.log >nofile.log
    check_order nofile.log $t >o; expect_grep o 'without an fsync of its data'
    grep -v 'fsync /d$' good.log >nodir.log
    check_order nodir.log $t >o; expect_grep o 'directory /d not fsynced'
    # the file's fsync after the rename shows the new name: the temporary file was never synced
    printf '%s\n' "1 write /d/c.ckpt.tmp" "1 rename /d/c.ckpt.tmp $t" "1 fsync $t" "1 fsync /d" >late.log
    check_order late.log $t >o; expect_grep o 'without an fsync of its data'
    # the directory's fsync before the rename does not count
    printf '%s\n' "1 write /d/c.ckpt.tmp" "1 fsync /d/c.ckpt.tmp" "1 fsync /d" "1 rename /d/c.ckpt.tmp $t" >early.log
    check_order early.log $t >o; expect_grep o 'directory /d not fsynced'
}
