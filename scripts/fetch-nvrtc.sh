#!/usr/bin/env bash
# Installs NVRTC 13.0 and the CUDA headers from PyPI wheels (no toolkit, no GPU, no driver)
# into the git-ignored target/nvrtc, for the CUDA compile check (tests/tests/cuda_compile.rs).
# Then: export LD_LIBRARY_PATH="$PWD/target/nvrtc/nvidia/cu13/lib:$LD_LIBRARY_PATH"
# (source this script to get that export). One pip call: a second --target install into the
# same folder silently skips files; --no-deps because the nvcc wheel's deps are unpinned.
# Pinned to 13.0: the H200 machines have CUDA 13.0, whose ptxas rejects newer PTX.
set -euo pipefail
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_dir="$_root/target/nvrtc"
if [ ! -e "$_dir/nvidia/cu13/lib/libnvrtc.so.13" ] || [ ! -e "$_dir/nvidia/cu13/include/cuda_fp16.h" ]; then
    rm -rf "$_dir"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$_dir" \
        nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.88 nvidia-cuda-nvcc==13.0.88
fi
export LD_LIBRARY_PATH="$_dir/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "NVRTC 13.0 in $_dir/nvidia/cu13 (LD_LIBRARY_PATH set)"
