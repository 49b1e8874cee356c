# test_cfg_errors.sh - damaged train.cfgs and data files, made by mutating configs/train.cfg
# and a small .npy data set in many ways (bit flips, truncation, binary junk, huge lines,
# duplicated keys, keys that contradict each other, FIFOs, links to devices, directories,
# damaged .npy files). For every mutant: `mgpu-worker --check` and a short run exit 0 or 2
# (never 1, a signal or a hang); a refusal names file:line, or the file and why it is not a
# regular file; and mgpu-launch refuses the same mutant with the same message, exit 2, before
# any worker starts. Also: stale checkpoint temp files of dead writers are removed at start.
#
# The mutants are drawn from a seeded generator: MGPU_FUZZ_SEED=N picks another set (the
# seed is printed with any failure, so a failing mutant can be made again).

FUZZ_SEED=${MGPU_FUZZ_SEED:-1}
CHECKED=0

# A worker that trains on the CPU, as on a machine without a GPU: worker SECONDS CMD...
worker() { MGPU_SIM_GPUS=0 CUDA_VISIBLE_DEVICES= timeout -k 2 "$@"; }

# npy FILE DESCR SHAPE PAYLOAD: a .npy v1.0 file with numpy's header layout; PAYLOAD is a
# python expression for the data bytes.
npy() {
    python3 - "$@" <<'PY'
import struct, sys
path, descr, shape, payload = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
hlen = (10 + len(d) + 1 + 63) // 64 * 64 - 10
d = d + ' ' * (hlen - len(d) - 1) + '\n'
open(path, 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', hlen) + d.encode() + payload)
PY
}

# A small data set next to a cfg that trains on it (40 samples, 3 features, 2 classes).
make_npy_set() {
    npy x.npy '<f4' '(40, 3)' "b''.join(struct.pack('<f', (i % 7) / 7.0) for i in range(120))"
    npy y.npy '<i8' '(40,)' "b''.join(struct.pack('<q', i % 2) for i in range(40))"
    cat >npy.cfg <<'EOF'
dataset = npy
data_x = x.npy
data_y = y.npy
loss = cross_entropy
model = mlp
hidden = 8
batch_size = 8
epochs = 1
log_interval = 0
EOF
}

# check_mutant FILE [HOW]: the contract for one mutant (HOW says how it was made).
check_mutant() {
    local m=$1 how=${2:-} rc msg
    local ctx="mutant $m${how:+ ($how)}, seed $FUZZ_SEED"
    CHECKED=$((CHECKED + 1))
    worker 20 "$WORKER" --check "$m" >w.out 2>w.err
    rc=$?
    [ $rc -eq 0 ] || [ $rc -eq 2 ] || { head -c 2000 w.err >&2; fail "$ctx: --check exited $rc"; }
    if [ $rc -eq 0 ]; then
        # Accepted: a short run of it must not fail either, but for a bad cfg (2); on fewer
        # samples where the cfg allows it, so that "features = 20000" stays quick.
        local small=samples=256
        worker 20 "$WORKER" --check "$m" $small >/dev/null 2>&1 || small=
        worker 60 "$WORKER" "$m" epochs=1 max_steps=2 log_interval=0 metrics_file= $small \
            >w.out 2>w.err
        rc=$?
        [ $rc -eq 0 ] || [ $rc -eq 2 ] || { tail -c 2000 w.err >&2; fail "$ctx: the run exited $rc"; }
        [ $rc -eq 0 ] || grep -q "^mgpu-worker: error: $m:[0-9]*: " w.err ||
            { head -c 2000 w.err >&2; fail "$ctx: the run exited 2 without $m:LINE"; }
        return 0
    fi
    [ "$(wc -l <w.err)" -eq 1 ] || { head -c 2000 w.err >&2; fail "$ctx: more than one line"; }
    msg=$(sed -n 's/^mgpu-worker: error: //p' w.err)
    [ -n "$msg" ] || { head -c 2000 w.err >&2; fail "$ctx: no 'mgpu-worker: error:' line"; }
    case "$msg" in
    "$m":[0-9]*": "*) ;;
    "$m"*": is a "*", not a regular file"*) ;;
    *) fail "$ctx: the message names neither $m:LINE nor why $m is no regular file: $msg" ;;
    esac
    # The launcher refuses it before it starts anything, with the same words.
    timeout -k 2 30 "$LAUNCH" --nproc_per_node=2 "$m" >l.out 2>l.err
    rc=$?
    [ $rc -eq 2 ] || { head -c 2000 l.err >&2; fail "$ctx: mgpu-launch exited $rc, expected 2"; }
    [ ! -s l.out ] || { head -c 2000 l.out >&2; fail "$ctx: mgpu-launch's workers wrote output"; }
    [ "$(wc -l <l.err)" -eq 1 ] || { head -c 2000 l.err >&2; fail "$ctx: mgpu-launch: not one line"; }
    ! grep -q '\[rank' l.err || fail "$ctx: a worker started"
    if [ -d "$m" ]; then # refused by the launcher itself, before it asks the worker
        grep -q "^mgpu-launch: error: training config '$m': is a directory" l.err ||
            { cat l.err >&2; fail "$ctx: mgpu-launch's message"; }
    else
        [ "$(cat l.err)" == "mgpu-launch: error: $msg" ] ||
            { cat l.err >&2; fail "$ctx: mgpu-launch's message differs from the worker's: $msg"; }
    fi
}

# mutate KIND N: N mutants of configs/train.cfg named mKIND_I.cfg; prints "name<TAB>how" each.
mutate() {
    python3 - "$MGPU_ROOT/configs/train.cfg" "$1" "$2" "$FUZZ_SEED" <<'PY'
import random, sys
src, kind, n, seed = open(sys.argv[1], 'rb').read(), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed * 1000 + sum(map(ord, kind)))
lines = src.split(b'\n')
for i in range(n):
    name = 'm%s_%d.cfg' % (kind, i)
    if kind == 'flip':  # one to three bits anywhere
        b = bytearray(src)
        for _ in range(rng.randint(1, 3)):
            p = rng.randrange(len(b)); b[p] ^= 1 << rng.randrange(8)
        out, how = bytes(b), 'bit flips'
    elif kind == 'trunc':
        p = rng.randrange(len(src)); out, how = src[:p], 'cut at byte %d' % p
    elif kind == 'junk':  # random bytes inserted
        p = rng.randrange(len(src)); junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        out, how = src[:p] + junk + src[p:], '%d junk bytes at %d' % (len(junk), p)
    elif kind == 'dup':  # a line written twice
        j = rng.randrange(len(lines)); k = rng.randrange(len(lines))
        l2 = lines[:k] + [lines[j]] + lines[k:]
        out, how = b'\n'.join(l2), 'line %d again at %d' % (j + 1, k + 1)
    elif kind == 'swap':  # a value replaced by another key's value
        keyed = [j for j, l in enumerate(lines) if b'=' in l and not l.startswith(b'#')]
        j, k = rng.choice(keyed), rng.choice(keyed)
        l2 = list(lines)
        l2[j] = lines[j].split(b'=')[0] + b'=' + lines[k].split(b'=', 1)[1]
        out, how = b'\n'.join(l2), 'value of line %d on line %d' % (k + 1, j + 1)
    open(name, 'wb').write(out)
    print('%s\t%s' % (name, how))
PY
}

check_all() { # check_all KIND N
    local name how
    mutate "$1" "$2" >list || fail "the mutator failed"
    while IFS=$'\t' read -r name how; do check_mutant "$name" "$how"; done <list
}

t_mutants_bit_flips_and_truncation() {
    check_all flip 40
    check_all trunc 12
    echo "$CHECKED mutants"
}

t_mutants_junk_duplicates_and_swaps() {
    check_all junk 14
    check_all dup 12
    check_all swap 12
    echo "$CHECKED mutants"
}

t_mutants_long_lines_and_conflicts() {
    local cfg="$MGPU_ROOT/configs/train.cfg"
    { cat "$cfg"; head -c 10485760 /dev/zero | tr '\0' x; echo; } >long10m.cfg
    check_mutant long10m.cfg "a 10 MB line"
    grep -q "long10m.cfg:$(($(wc -l <"$cfg") + 1)): line longer than the limit of 4095 bytes" w.err ||
        fail "10 MB line"
    { printf '# '; head -c 2097152 /dev/zero | tr '\0' c; echo; cat "$cfg"; } >comment.cfg
    check_mutant comment.cfg "a 2 MB comment"
    grep -q 'comment.cfg:1: line longer than the limit' w.err || fail "2 MB comment"
    { cat "$cfg"; for i in $(seq 80000); do echo "# comment line $i"; done; } >many.cfg
    check_mutant many.cfg "over 1 MiB of short lines"
    grep -qE 'many.cfg:[0-9]+: the cfg goes on past 1048576 bytes' w.err || fail "1 MiB"
    { cat "$cfg"; printf 'lr = %04000d\n' 1; } >longval.cfg
    check_mutant longval.cfg "a 4000-byte value"
    { cat "$cfg"; printf 'k%03000d = 1\n' 1; } >longkey.cfg
    check_mutant longkey.cfg "a 3000-byte key"
    { head -n 3 "$cfg"; printf 'seed = 1\0\0\0\n'; tail -n +4 "$cfg"; } >nul.cfg
    check_mutant nul.cfg "NUL bytes"
    grep -q 'nul.cfg:4: not a text file: a NUL byte at column 9' w.err || fail "NUL"
    head -c 4096 /dev/urandom >random.cfg
    check_mutant random.cfg "random bytes"
    # Keys that contradict each other (and other edits that may or may not be errors).
    local i=0 edit
    for edit in 's/^loss.*/loss = mse/' 's/^dataset.*/dataset = random/' \
        's/^model.*/model = linear/' 's/^optimizer.*/optimizer = sgd/' \
        's/^lr.*/&\nmomentum = 0.9/' 's/^seed.*/&\ndp_devices = 2/' \
        's/^seed.*/&\ncheckpoint_interval = 5/' 's/^model.*/model = linear\nactivation = relu/' \
        's/^epochs.*/&\nmode = dp\ncheckpoint = c.ck/' 's/^samples.*/samples = 1000000000000000/' \
        's/^features.*/features = 16777216/' 's/^eval_fraction.*/eval_fraction = 0.99/' \
        's/^samples.*/samples = 2/' 's/^metrics_file.*/metrics_file = \//'; do
        sed "$edit" "$cfg" >cross$i.cfg
        check_mutant cross$i.cfg "sed '$edit'"
        i=$((i + 1))
    done
    # The message names the line of the key written last and the other's line.
    sed 's/^dataset.*/dataset = random/' "$cfg" >cross.cfg
    "$WORKER" --check cross.cfg 2>err
    expect_grep err 'cross.cfg:11: clusters_per_class, class_sep and cluster_std need dataset = synthetic \(dataset at line 7\)'
    "$WORKER" --check "$cfg" loss=mse 2>err
    expect_grep err 'error: command line: dataset = synthetic has labels only.*\(dataset at line 7\)'
    echo "$CHECKED mutants"
}

t_special_files_are_refused_without_blocking() {
    mkfifo fifo.cfg
    check_mutant fifo.cfg "a FIFO"
    grep -q 'fifo.cfg: is a FIFO, not a regular file' w.err || fail "FIFO"
    ln -s /dev/zero zero.cfg
    check_mutant zero.cfg "a link to /dev/zero"
    grep -q 'zero.cfg -> /dev/zero: is a character device, not a regular file' w.err || fail "zero"
    ln -s /dev/null null.cfg
    check_mutant null.cfg "a link to /dev/null"
    mkdir dir.cfg
    check_mutant dir.cfg "a directory"
    grep -q 'dir.cfg: is a directory, not a regular file' w.err || fail "directory"
    : >empty.cfg # a regular empty file is the defaults
    check_mutant empty.cfg "empty"
    worker 20 "$WORKER" --check empty.cfg || fail "an empty cfg exited $?"
    echo "$CHECKED mutants"
}

t_data_file_mutants() {
    make_npy_set
    check_mutant npy.cfg "the valid data set"
    worker 20 "$WORKER" --check npy.cfg || fail "the valid npy cfg"
    mkdir sub
    mkfifo fifo.npy
    ln -s /dev/zero zero.npy
    : >empty.npy
    echo '1,2,3' >text.npy
    head -c 200 x.npy >trunc.npy
    npy huge.npy '<f4' '(4611686018427387904, 4)' "b'\\0' * 64"
    npy huge2.npy '<f4' '(18446744073709551615,)' "b'\\0' * 64"
    npy neg.npy '<f4' '(-1, 3)' "b'\\0' * 64"
    npy yshort.npy '<i8' '(39,)' "b'\\0' * 312"
    npy yfloat.npy '<f4' '(40,)' "b'\\0' * 160"
    npy ybig.npy '<i8' '(40,)' "(2**40).to_bytes(8, 'little') * 40"
    npy yneg.npy '<i8' '(40,)' "(-1).to_bytes(8, 'little', signed=True) * 40"
    npy ysame.npy '<i8' '(40,)' "b'\\0' * 320"
    python3 -c "import sys; sys.stdout.buffer.write(b'\x93NUMPY\x02\x00\xff\xff\xff\x7f' + b'{' * 64)" >hdr.npy
    python3 -c "import sys; sys.stdout.buffer.write(b'\x93NUMPY\x01\x00\x00\x00')" >hdr0.npy
    local v i=0
    for v in . sub fifo.npy zero.npy empty.npy text.npy trunc.npy huge.npy huge2.npy neg.npy \
        hdr.npy hdr0.npy missing.npy; do
        sed "s|^data_x.*|data_x = $v|" npy.cfg >dx$i.cfg
        check_mutant dx$i.cfg "data_x = $v"
        grep -q "^mgpu-worker: error: dx$i.cfg:2: data_x" w.err ||
            { cat w.err >&2; fail "data_x = $v: no error at dx$i.cfg:2"; }
        i=$((i + 1))
    done
    for v in . yshort.npy yfloat.npy ybig.npy yneg.npy ysame.npy x.npy; do
        sed "s|^data_y.*|data_y = $v|" npy.cfg >dy$i.cfg
        check_mutant dy$i.cfg "data_y = $v"
        grep -q "^mgpu-worker: error: dy$i.cfg:3: data_y" w.err ||
            { cat w.err >&2; fail "data_y = $v: no error at dy$i.cfg:3"; }
        i=$((i + 1))
    done
    printf 'classes = 2\n' >>npy.cfg # labels 0..1: fine; a label 5 is not
    npy y5.npy '<i8' '(40,)' "(5).to_bytes(8, 'little') * 40"
    sed 's|^data_y.*|data_y = y5.npy|' npy.cfg >cls.cfg
    check_mutant cls.cfg "a label past classes"
    grep -q 'cls.cfg:3: data_y: .*y5.npy: label 5 at sample 0, expected 0..1' w.err || fail "classes"
    # Bit flips in the data files themselves, mostly in the header (the first 128 bytes),
    # where a flip changes what the file says it holds.
    python3 - "$FUZZ_SEED" <<'PY'
import random, sys
rng = random.Random(int(sys.argv[1]))
for f in ('x', 'y'):
    src = open(f + '.npy', 'rb').read()
    for i in range(12):
        b = bytearray(src)
        p = rng.randrange(128) if rng.random() < 0.8 else rng.randrange(len(b))
        b[p] ^= 1 << rng.randrange(8)
        open('f%s%d.npy' % (f, i), 'wb').write(bytes(b))
PY
    for i in $(seq 0 11); do
        sed "s|^data_x.*|data_x = fx$i.npy|" npy.cfg >fx$i.cfg
        check_mutant fx$i.cfg "bit flips in x.npy"
        sed "s|^data_y.*|data_y = fy$i.npy|" npy.cfg >fy$i.cfg
        check_mutant fy$i.cfg "bit flips in y.npy"
    done
    echo "$CHECKED mutants"
}

# A worker killed while it writes the checkpoint leaves "<checkpoint>.tmp.<pid>": the next run
# removes those whose pid is dead, and nothing else.
t_stale_checkpoint_temp_files_go() {
    mkdir run
    cat >ck.cfg <<'EOF'
samples = 200
batch_size = 10
epochs = 1
log_interval = 0
checkpoint = run/ck
EOF
    local dead dead2 dead3 live f
    sh -c 'exit 0' &
    dead=$!
    sh -c 'exit 0' &
    dead2=$!
    sh -c 'exit 0' &
    dead3=$!
    wait
    sleep 60 &
    live=$!
    head -c 4096 /dev/zero >run/ck.tmp.$dead # stale: its writer is gone
    head -c 4096 /dev/zero >run/ck.tmp.$live # a live writer's
    local keep=("ck.tmp.${dead}x" "ck.tmp.0$dead" "ck.tmp.$dead.bak" "ckx.tmp.$dead"
        "other.tmp.$dead" "ck.tmp." "ck.tmp.-$dead" "ck.tmp.$live")
    for f in "${keep[@]}"; do [ -e "run/$f" ] || echo x >"run/$f"; done
    mkdir "run/ck.tmp.$dead2" # the name, but not a regular file
    ln -s ../ck.cfg "run/ck.tmp.$dead3"
    "$LAUNCH" --nproc_per_node=2 ck.cfg >out 2>err || { cat err >&2; kill $live; fail "run exited"; }
    kill $live
    [ -e run/ck ] || fail "no checkpoint written"
    [ ! -e run/ck.tmp.$dead ] || fail "the stale temp file of dead pid $dead is still there"
    for f in "${keep[@]}" "ck.tmp.$dead2" "ck.tmp.$dead3"; do
        [ -e "run/$f" ] || [ -L "run/$f" ] || fail "run/$f was removed"
    done
    expect_eq "$(ls run | wc -l)" $((${#keep[@]} + 3)) "files left in run/"
    # A checkpoint named without a directory: its temp files are in the working directory.
    head -c 4096 /dev/zero >ck2.tmp.$dead
    sed 's|^checkpoint.*|checkpoint = ck2|' ck.cfg >ck2.cfg
    "$LAUNCH" --nproc_per_node=1 ck2.cfg >out 2>err || { cat err >&2; fail "run 2 exited"; }
    [ ! -e ck2.tmp.$dead ] || fail "ck2.tmp.$dead is still there"
    # A checkpoint through a link: written beside the link's target, its temp files too; the
    # link stays a link.
    mkdir store && ln -s store/real.ck linked
    head -c 4096 /dev/zero >store/real.ck.tmp.$dead
    sed 's|^checkpoint.*|checkpoint = linked|' ck.cfg >ck3.cfg
    "$LAUNCH" --nproc_per_node=1 ck3.cfg >out 2>err || { cat err >&2; fail "run 3 exited"; }
    [ ! -e store/real.ck.tmp.$dead ] || fail "store/real.ck.tmp.$dead is still there"
    [ -L linked ] || fail "the link to the checkpoint was replaced by a file"
    [ -s store/real.ck ] || fail "no checkpoint written through the link"
}
