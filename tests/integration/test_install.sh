# test_install.sh - `make install`, then a C program of the user's own built against libmgpu
# through pkg-config and run under the installed mgpu-launch.

t_install_and_link_with_pkg_config() {
    command -v pkg-config >/dev/null || skip "no pkg-config"
    # a sanitizer build's library needs the sanitizer's runtime in every program that links it
    nm "$MGPU_BUILD/lib/libmgpu.a" 2>/dev/null | grep -q __asan_ && skip "a sanitizer build (make asan)"
    make -s -C "$MGPU_ROOT" install BUILD="$MGPU_BUILD" PREFIX="$PWD/inst" >make.out 2>&1 ||
        { cat make.out >&2; fail "make install"; }
    cat >mine.c <<'EOF2'
#include <stdio.h>
#include "mgpu.h"
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
    export PKG_CONFIG_PATH=$PWD/inst/lib/pkgconfig
    cc mine.c $(pkg-config --cflags --libs mgpu) -o mine 2>cc.err || { cat cc.err >&2; fail "cc"; }
    inst/bin/mgpu-launch --nproc_per_node=3 ./mine >out 2>err || { cat err >&2; fail "run"; }
    for r in 0 1 2; do expect_grep out "^\[rank$r\]:rank $r of 3: 3 6 9$"; done
}
