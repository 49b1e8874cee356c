#!/usr/bin/env bash
# tests/layers.sh [ROOT] - fails on an #include that crosses mgpu's layers (make check-layers).
#
#   common          sees common
#   launcher        sees launcher, common
#   worker/runtime  sees runtime, common
#   kernels         sees kernels, common
#   worker/trainer  sees trainer, runtime, kernels, common
#
# The Makefile gives each layer only these include paths, so most crossings fail to compile;
# this check also catches a relative path ("../trainer/cfg.h") and a header that happens to be
# reachable. common/ and launcher/ include no CUDA, NCCL or cuBLAS header: they build and run
# without a toolkit. Prints each violation as FILE:LINE: and exits 1 if there is any.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

allowed() { # layer folder -> the folders it may include from
    case $1 in
        common) echo "common" ;;
        launcher) echo "launcher common" ;;
        worker/runtime) echo "worker/runtime common" ;;
        kernels) echo "kernels common" ;;
        worker/trainer) echo "worker/trainer worker/runtime kernels common" ;;
    esac
}

bad=0 files=0
for layer in common launcher worker/runtime kernels worker/trainer; do
    [ -d "$layer" ] || { echo "layers: $root/$layer: missing" >&2; exit 2; }
    ok_dirs=$(allowed "$layer")
    while IFS= read -r -d '' f; do
        files=$((files + 1))
        dir=$(dirname "$f")
        while IFS=: read -r line text; do
            [ -n "$line" ] || continue
            if [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
                inc=${BASH_REMATCH[1]}
                # Where the compiler finds it: the including file's folder first, then the
                # layer's own paths; failing those, wherever else in the tree it exists.
                found=""
                for d in "$dir" $ok_dirs; do
                    if [ -f "$d/$inc" ]; then found=$(realpath -m --relative-to=. "$d/$inc"); break; fi
                done
                if [ -z "$found" ]; then
                    for d in common launcher worker/runtime worker/trainer kernels; do
                        [ -f "$d/$(basename "$inc")" ] && { found="$d/$(basename "$inc")"; break; }
                    done
                fi
                [ -n "$found" ] || continue # not mgpu's: the compiler's to judge
                ok=0
                for d in $ok_dirs; do [[ $found == "$d"/* ]] && ok=1; done
                if [ $ok -eq 0 ]; then
                    echo "$f:$line: includes $found; $layer may include only from: $ok_dirs"
                    bad=$((bad + 1))
                fi
            elif [[ $layer == common || $layer == launcher ]] &&
                [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\<(cuda[^\>]*|cublas[^\>]*|nccl[^\>]*|cudnn[^\>]*|curand[^\>]*|nvrtc[^\>]*|cupti[^\>]*)\> ]]; then
                echo "$f:$line: includes <${BASH_REMATCH[1]}>; $layer builds without the CUDA toolkit"
                bad=$((bad + 1))
            fi
        done < <(grep -n '^[[:space:]]*#[[:space:]]*include' "$f")
    done < <(find "$layer" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0)
done
if [ $bad -gt 0 ]; then
    echo "layers: $bad forbidden include(s) in $files files" >&2
    exit 1
fi
echo "layers: $files files, no include crosses a layer"
