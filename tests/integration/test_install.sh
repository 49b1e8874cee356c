# test_install.sh - `make install`, then C programs of the user's own built against libmgpu
# through pkg-config and run under the installed mgpu-launch.

install_here() {
    command -v pkg-config >/dev/null || skip "no pkg-config"
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
