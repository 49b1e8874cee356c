#!/usr/bin/env bash
# Installs what mgpu needs on Debian/Ubuntu: the build (gcc, make, libuv, cJSON; help2man and
# go-md2man for the man pages) and the tests' real clients (Debian's PyTorch 1.13 with gloo,
# scikit-learn, clang for the fuzzer) and the tools that show every rank's stack (gdb and
# eu-stack from Debian, py-spy from PyPI). The CUDA toolkit is optional: without nvcc the CUDA
# parts are not built and workers run on the CPU. openssh-server: the ssh launch's tests start
# its sshd themselves (the package's own service is not needed).
set -euo pipefail
pkgs=(build-essential libuv1-dev libcjson-dev python3 python3-numpy python3-torch python3-sklearn
      clang libclang-rt-14-dev procps iproute2 nftables time gnuplot-nox jq slurm-wlm munge openmpi-bin
      pkg-config help2man go-md2man man-db gdb elfutils python3-pip openssh-server strace)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# py-spy (Python frames in the launcher's stack reports) is on PyPI only. Its wheel is one
# self-contained program and no Python module, so installing it next to Debian's packages
# (pip refuses by default on Debian 12, PEP 668) cannot break any of them; it lands in
# /usr/local/bin, on every user's PATH.
if ! command -v py-spy >/dev/null 2>&1; then
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "setup: installing py-spy (pip)"
    $SUDO /usr/bin/python3 -m pip install --quiet --no-cache-dir --root-user-action=ignore --break-system-packages py-spy
fi
# Hugging Face's tokenizers (PyPI only, a binary wheel) is what the tokenizer tests compare
# mgpu's byte-level BPE with; the tests alone import it, never mgpu's programs.
if ! /usr/bin/python3 -c 'import tokenizers' >/dev/null 2>&1; then
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "setup: installing tokenizers (pip)"
    $SUDO /usr/bin/python3 -m pip install --quiet --no-cache-dir --root-user-action=ignore --break-system-packages tokenizers
fi
# safetensors (Hugging Face's reader and writer of model.safetensors) is on PyPI only: the
# weights tests write and read GPT-2 files with it beside Debian's PyTorch.
if ! /usr/bin/python3 -c 'import safetensors.torch' >/dev/null 2>&1; then
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "setup: installing safetensors (pip)"
    $SUDO /usr/bin/python3 -m pip install --quiet --no-cache-dir --root-user-action=ignore --break-system-packages safetensors
fi
echo "setup: dependencies present"
