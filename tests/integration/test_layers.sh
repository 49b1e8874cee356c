# test_layers.sh - tests/layers.sh (make check-layers) passes on the tree and fails, naming the
# file and line, on an include planted across each boundary.

copy_tree() {
    mkdir -p tree
    cp -r "$MGPU_ROOT"/common "$MGPU_ROOT"/launcher "$MGPU_ROOT"/kernels tree/
    mkdir -p tree/worker && cp -r "$MGPU_ROOT"/worker/runtime "$MGPU_ROOT"/worker/trainer tree/worker/
}

t_layers_tree_passes() {
    bash "$MGPU_ROOT/tests/layers.sh" "$MGPU_ROOT" >out 2>&1 || { cat out >&2; fail "layers.sh on the tree"; }
    expect_grep out "no include crosses a layer"
}

t_layers_planted_includes_fail() {
    copy_tree
    local plant
    # file to plant in | include line | what must be named
    while IFS='|' read -r file inc; do
        rm -rf tree && copy_tree
        printf '%s\n' "$inc" >>"tree/$file"
        if bash "$MGPU_ROOT/tests/layers.sh" "$PWD/tree" >out 2>&1; then
            cat out >&2; fail "layers.sh passed with '$inc' planted in $file"
        fi
        expect_grep out "^$file:[0-9]+: "
    done <<'LIST'
launcher/plan.c|#include "cfg.h"
launcher/plan.h|#include "../worker/trainer/model.h"
common/log.c|#include "plan.h"
common/sock.h|#include <cuda_runtime_api.h>
launcher/output.c|#include <nccl.h>
worker/runtime/mgpu.c|#include "kernels.h"
worker/runtime/shm.c|#include "ddp.h"
kernels/kernels.c|#include "mgpu.h"
kernels/kernels.c|#include "train.h"
LIST
}
