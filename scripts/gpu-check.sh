#!/usr/bin/env bash
# The CUDA backend on a real GPU, in one call (sized to finish in < 8 minutes on an H200; not
# yet run on one: no GPU has been lent to this project so far):
#   1. device roofline (2 GiB device-to-device copy; the workbench's bf16 MMA GEMM);
#   2. harness check --device cuda for every family (f32/f16/bf16);
#   3. flash_vs_paged --device cuda at H200-sized shapes: decode (batch 8/32, GQA 32/8,
#      contexts 4k/16k) and bf16 prefill (1k..8k), with PyTorch's scaled_dot_product_attention
#      as a peer (scripts/peers/torch_sdpa on cuda:0: the same inputs, checked against the
#      same f64 reference, CUDA events, in rounds alternating with ours);
#   4. quant_tradeoff --device cuda: the GEMV at 4096x4096 and 4096x11008, batch 1 and 8,
#      beside PyTorch's F.linear in bf16 (scripts/peers/torch_linear).
#   5. moe_capacity --device cuda: the experts as grouped GEMMs (cuda_grouped, bf16 and f16)
#      at 1024 tokens, 8 and 64 experts, top-2, capacity 1.25, rank-major with DeepSpeed's
#      weights, and expert choice.
# The peers run under the machine's python3 (WORKBENCH_PEER_PYTHON), which holds PyTorch.
# Writes logs and CSV/JSON under $OUT (default ./gpu-out) and a short table last.
# Needs the harness binary: target/gpu/harness (scripts/gpu-prepare.sh) or $HARNESS, or
# cargo with the crates already present.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
H=${HARNESS:-target/gpu/harness}
if [ ! -x "$H" ]; then
    echo "no harness binary at $H; building (needs the crates offline)" | tee -a "$OUT/log.txt"
    cargo build --release --offline -p harness && H=target/release/harness || exit 2
fi
# NVRTC 13 and the CUDA headers: the toolkit's, else a pip wheel's (PyTorch's venv has one).
if ! ldconfig -p | grep -q 'libnvrtc.so.13'; then
    found=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -e "$d/libnvrtc.so.13" ] && found="$d" && break
    done
    if [ -z "$found" ]; then
        lib=$(find / -xdev -name 'libnvrtc.so.13' -path '*cu13*' 2>/dev/null | head -1)
        [ -n "$lib" ] && found=$(dirname "$lib")
    fi
    [ -n "$found" ] && export LD_LIBRARY_PATH="$found:${LD_LIBRARY_PATH:-}"
fi
if [ -z "${CUDA_INCLUDE_DIR:-}" ]; then
    for d in /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include; do
        [ -e "$d/cuda_fp16.h" ] && export CUDA_INCLUDE_DIR="$d" && break
    done
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} CUDA_INCLUDE_DIR=${CUDA_INCLUDE_DIR:-}" 
export WORKBENCH_PEER_PYTHON="${WORKBENCH_PEER_PYTHON:-$(command -v python3)}"
RES="$OUT/results"
mkdir -p "$RES"
step() { echo; echo "=== $* ($(date -u +%T))"; }
{
    step "machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
    step "roofline"
    timeout 120 "$H" --results-dir "$RES" --experiments-dir "$PWD/experiments" roofline --device cuda
    step "check (every family)"
    timeout 240 "$H" --results-dir "$RES" --experiments-dir "$PWD/experiments" check --device cuda --cases 3 --format table
    step "flash_vs_paged decode"
    timeout 150 "$H" --results-dir "$RES" --experiments-dir "$PWD/experiments" exp flash_vs_paged --device cuda --reps 20 \
        --set mode=decode --set dtype=bf16 --set batch=8,32 --set heads=gqa --set kv_len=4096,16384 \
        --variant cuda_paged:bs=16 --variant cuda_paged:bs=16,unroll=2 \
        --variant cuda_paged:bs=16,split=auto --variant cuda_paged:bs=16,split=auto,unroll=2 \
        --variant cuda_paged:bs=16,split=4096 --variant cuda_paged:bs=128,split=auto --variant cuda_flash2 \
        --peer torch_sdpa
    step "flash_vs_paged prefill"
    timeout 150 "$H" --results-dir "$RES" --experiments-dir "$PWD/experiments" exp flash_vs_paged --device cuda --reps 10 \
        --set mode=prefill --set dtype=bf16 --set batch=1 --set heads=gqa --set kv_len=1024,4096,8192 \
        --variant cuda_flash2 --variant cuda_flash2:pipe=1 --variant cuda_naive --peer torch_sdpa
    step "quant GEMV"
    timeout 150 "$H" --results-dir "$RES" --experiments-dir "$PWD/experiments" exp quant_tradeoff --device cuda --reps 50 \
        --set shape=4096x4096,4096x11008 --set batch=1,8 --set weights=gaussian \
        --set format=f16,q8_0,q4_0,sym4g32 --peer torch_linear:dtype=bf16
    step "moe grouped expert GEMMs"
    timeout 120 "$H" --results-dir "$RES" --experiments-dir "$PWD/experiments" exp moe_capacity --device cuda --reps 20 \
        --set experts=8,64 --set top_k=2 --set skew=1.0 --set capacity=1.25 --set policy=gshard \
        --set norm=renormalize_kept --set routing=token_choice,expert_choice \
        --variant cuda_grouped --variant cuda_grouped:dtype=f16
} 2>&1 | tee "$OUT/log.txt"
step "summary" | tee -a "$OUT/log.txt"
python3 scripts/gpu_summary.py "$RES" 2>&1 | tee "$OUT/summary.txt"
