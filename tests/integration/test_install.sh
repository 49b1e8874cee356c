# test_install.sh - `make install`, then C programs of the user's own built against libmgpu
# through pkg-config and run under the installed mgpu-launch; the installed man pages, and the
# programs' --help and --version they are made from.

# make install writes the man pages into the build folder, and checks the build the other tests
# run: two at once would write the same files.
# alone: t_install_and_link_with_pkg_config t_install_cpu_program_links_no_cuda
# alone: t_install_general_collectives_and_store t_install_man_pages
# alone: t_install_system_error_h_is_glibcs t_install_without_man_tools_fails_clearly

install_here() {
    command -v pkg-config >/dev/null || skip "no pkg-config"
    for t in help2man go-md2man; do
        command -v $t >/dev/null || skip "$t not installed (scripts/setup.sh installs it)"
    done
    # a sanitizer build's library needs the sanitizer's runtime in every program that links it
    nm "$MGPU_BUILD/lib/libmgpu.a" 2>/dev/null | grep -q __asan_ && skip "a sanitizer build (make asan)"
    make -s -C "$MGPU_ROOT" install BUILD="$MGPU_BUILD" PREFIX="$PWD/inst" >make.out 2>&1 ||
        { cat make.out >&2; fail "make install"; }
    export PKG_CONFIG_PATH=$PWD/inst/lib/pkgconfig
}

t_install_and_link_with_pkg_config() {
    install_here
    cat >mine.c <<'EOF2'
#include <stdio.h>
#include <mgpu/mgpu.h>
int main(void)
{
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err;
    float x[3] = {1, 2, 3};
    if (mgpu_init(NULL, &ctx, &err) < 0 || mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 30, &comm, &err) < 0 ||
        mgpu_allreduce_f32(comm, x, 3, MGPU_SUM, NULL, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("rank %d of %d: %g %g %g\n", mgpu_rank(ctx)->rank, mgpu_rank(ctx)->world_size, x[0], x[1], x[2]);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    return 0;
}
EOF2
    cc mine.c $(pkg-config --cflags --libs mgpu) -o mine 2>cc.err || { cat cc.err >&2; fail "cc"; }
    inst/bin/mgpu-launch --nproc_per_node=3 ./mine >out 2>err || { cat err >&2; fail "run"; }
    for r in 0 1 2; do expect_grep out "^\[rank$r\]:rank $r of 3: 3 6 9$"; done
}

# -I<prefix>/include/mgpu on the command line made a user's <error.h> mgpu's own.
t_install_system_error_h_is_glibcs() {
    install_here
    expect_eq "$(pkg-config --cflags mgpu | xargs)" "-I$PWD/inst/include" "pkg-config --cflags mgpu"
    cat >errs.c <<'EOF2'
#include <error.h>
#include <mgpu/mgpu.h>
int main(void)
{
    error(0, 0, "glibc's error()");
    return 0;
}
EOF2
    cc -Wall -Werror errs.c $(pkg-config --cflags --libs mgpu) -o errs 2>cc.err || { cat cc.err >&2; fail "cc"; }
    ./errs 2>err
    expect_grep err "glibc's error\(\)"
}

# A CPU-only program links no CUDA library; the NCCL build has a pkg-config file of its own.
t_install_cpu_program_links_no_cuda() {
    install_here
    expect_no_grep "$(pkg-config --libs mgpu)" "nccl|cudart|cuda"
    nm "$PWD/inst/lib/libmgpu.a" | grep -qE ' U (nccl|cuda)' && fail "libmgpu.a needs NCCL or CUDA symbols"
    if [ -f inst/lib/pkgconfig/mgpu-cuda.pc ]; then
        expect_grep "$(pkg-config --libs mgpu-cuda)" "-lnccl"
        expect_grep "$(pkg-config --libs mgpu-cuda)" "-lmgpu_cuda"
    fi
    return 0
}

# The general collectives and the store client through the installed headers: <mgpu/store.h>
# is installed with what it includes, and the store is the context's, given by mgpu-launch.
t_install_general_collectives_and_store() {
    install_here
    cat >gen.c <<'EOF2'
#include <stdio.h>
#include <stdlib.h>
#include <mgpu/mgpu.h>
#include <mgpu/store.h>
int main(void)
{
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err;
    int r, w;
    long long sum[2], got[6];
    int64_t n = 0;
    if (mgpu_init(NULL, &ctx, &err) < 0 || mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 30, &comm, &err) < 0)
        return fprintf(stderr, "%s\n", err.msg), 1;
    r = mgpu_rank(ctx)->rank;
    w = mgpu_rank(ctx)->world_size;
    sum[0] = sum[1] = r + 1;
    if (mgpu_allreduce(comm, sum, 2, MGPU_DTYPE_I64, MGPU_MAX, NULL, &err) < 0 ||
        mgpu_all_gather(comm, sum, got, 2, MGPU_DTYPE_I64, NULL, &err) < 0 ||
        mgpu_store_add(mgpu_ctx_store(ctx), "arrived", 1, &n, &err) < 0 ||
        mgpu_barrier(comm, &err) < 0 ||
        mgpu_store_add(mgpu_ctx_store(ctx), "arrived", 0, &n, &err) < 0)
        return fprintf(stderr, "%s\n", err.msg), 1;
    printf("rank %d: max %lld, gathered %lld..%lld, %lld arrived, nccl %p\n", r, sum[0], got[0],
           got[2 * w - 1], (long long)n, mgpu_comm_nccl(comm));
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    return 0;
}
EOF2
    cc -Wall -Werror gen.c $(pkg-config --cflags --libs mgpu) -o gen 2>cc.err || { cat cc.err >&2; fail "cc"; }
    for h in mgpu.h error.h store.h; do [ -f "inst/include/mgpu/$h" ] || fail "include/mgpu/$h not installed"; done
    inst/bin/mgpu-launch --nproc_per_node=3 ./gen >out 2>err || { cat err >&2; fail "run"; }
    for r in 0 1 2; do
        expect_grep out "^\[rank$r\]:rank $r: max 3, gathered 3\.\.3, 3 arrived, nccl \(nil\)$"
    done
}

# Man pages under share/man, rendered by man (or groff), with the options of each program and
# the keys of train.cfg; man finds them by name through MANPATH.
render() {
    if command -v man >/dev/null; then MANWIDTH=100 man -l "$1" 2>/dev/null
    else groff -man -Tutf8 "$1" 2>/dev/null; fi
}

t_install_man_pages() {
    install_here
    command -v man >/dev/null || command -v groff >/dev/null || skip "neither man nor groff installed"
    local m=inst/share/man
    for f in man1/mgpu-launch.1 man1/mgpu-worker.1 man5/train.cfg.5; do
        [ -s "$m/$f" ] || fail "$m/$f not installed"
    done
    render $m/man1/mgpu-launch.1 >launch.txt
    expect_grep launch.txt "^MGPU-LAUNCH\(1\)"
    for o in --nproc_per_node --nnodes --master_port --max_restarts --dry_run --version; do
        expect_grep launch.txt "^ +$o"
    done
    expect_grep launch.txt "mgpu-worker\(1\), train.cfg\(5\)"
    render $m/man1/mgpu-worker.1 >worker.txt
    expect_grep worker.txt "^MGPU-WORKER\(1\)"
    expect_grep worker.txt "^ +mgpu-worker --check TRAIN.CFG \[KEY=VALUE \.\.\.\]"
    for o in --check --help --version; do expect_grep worker.txt "^ +(-h, )?$o"; done
    expect_grep worker.txt "see train.cfg\(5\)"
    expect_grep worker.txt "mgpu-worker $("$MGPU_BUILD/bin/mgpu-worker" --version | cut -d' ' -f2)"
    render $m/man5/train.cfg.5 >cfg.txt
    expect_grep cfg.txt "^TRAIN.CFG\(5\)"
    for k in mode backend lr optimizer hidden data_x; do expect_grep cfg.txt "[│|]$k +[│|]"; done
    expect_no_grep cfg.txt "Files here"
    if command -v man >/dev/null; then
        MANPATH=$PWD/$m MANWIDTH=100 man 5 train.cfg 2>/dev/null >byname.txt
        expect_grep byname.txt "learning rate"
    fi
}

# Without the tools, make install stops and names the package (it does not skip the pages).
t_install_without_man_tools_fails_clearly() {
    command -v help2man >/dev/null || skip "help2man not installed"
    make -s -C "$MGPU_ROOT" install BUILD="$MGPU_BUILD" PREFIX="$PWD/inst" MAN_DIR="$PWD/man" \
        HELP2MAN=no-such-help2man >make.out 2>&1
    expect_eq "$?" 2 "make's exit status"
    expect_grep make.out "no-such-help2man not found: apt-get install help2man"
    make -s -C "$MGPU_ROOT" install BUILD="$MGPU_BUILD" PREFIX="$PWD/inst" MAN_DIR="$PWD/man" \
        GO_MD2MAN=no-such-md2man >make.out 2>&1
    expect_eq "$?" 2 "make's exit status"
    expect_grep make.out "no-such-md2man not found: apt-get install go-md2man"
    [ -e inst/share/man/man5/train.cfg.5 ] && fail "installed without its man page"
    return 0
}

# mgpu-worker --help (what mgpu-worker(1) is made from) and --version: stdout, exit 0, the
# same version as mgpu-launch's.
t_worker_help_and_version() {
    local w="$MGPU_BUILD/bin/mgpu-worker" v
    "$w" --help >out 2>err
    expect_eq "$?" 0 "--help exit status"
    expect_eq "$(wc -c <err)" 0 "bytes on stderr"
    expect_grep out "^Usage: mgpu-worker TRAIN.CFG \[KEY=VALUE \.\.\.\]$"
    expect_grep out "^ +--check "
    expect_grep out "^Exit status:$"
    expect_grep out "^  2  bad usage"
    expect_grep out "see train.cfg\(5\)"
    "$w" -h >out2 2>&1
    expect_eq "$(cmp -s out out2 && echo same)" same "-h and --help"
    "$w" --version >out 2>err
    expect_eq "$?" 0 "--version exit status"
    v=$("$LAUNCH" --version | cut -d' ' -f2)
    expect_eq "$(cat out)" "mgpu-worker $v" "--version"
    expect_grep "$MGPU_ROOT/common/version.h" "MGPU_VERSION \"$v\""
    "$w" >out 2>err
    expect_eq "$?" 2 "exit status without a cfg"
    expect_grep err "Try 'mgpu-worker --help'"
    # an option it does not know is named, escaped, with what was expected
    "$w" $'--bog\e[2Jus' >out 2>err
    expect_eq "$?" 2 "exit status of an unknown option"
    expect_grep err "^mgpu-worker: error: unknown option '--bog\\\\x1b\\[2Jus' \\(expected a TRAIN.CFG"
    "$w" --check --bogus x.cfg >out 2>err
    expect_eq "$?" 2 "exit status of --check with an unknown option"
    expect_grep err "unknown option '--bogus'"
}
