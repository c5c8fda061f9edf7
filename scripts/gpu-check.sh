#!/usr/bin/env bash
# The CUDA backend on a real GPU, in one call (sized to finish in < 8 minutes on an H200; the
# whole script took 250 s on one on 2026-12-04, results/gpu/README.md):
#   1. device roofline (2 GiB device-to-device copy; the workbench's bf16 MMA GEMM);
#   2. harness check --device cuda for every family (f32/f16/bf16);
#   3. flash_vs_paged --device cuda at H200-sized shapes: decode (batch 8/32, GQA 32/8,
#      contexts 4k/16k; the plain and the pipelined (pipe=1) key loops, unsplit, auto-split and
#      at fixed partitions) and bf16 prefill (1k..8k), with PyTorch's scaled_dot_product_attention
#      as a peer (scripts/peers/torch_sdpa on cuda:0: the same inputs, checked against the
#      same f64 reference, CUDA events, in rounds alternating with ours);
#   4. quant_tradeoff --device cuda: the GEMV at 4096x4096 and 4096x11008, batch 1 and 8,
#      beside PyTorch's F.linear in bf16 (scripts/peers/torch_linear).
#   5. moe_capacity --device cuda: the experts as grouped GEMMs (cuda_grouped, bf16 and f16)
#      at 1024 tokens, 8 and 64 experts, top-2, capacity 1.25, rank-major with DeepSpeed's
#      weights, and expert choice.
#   6. compute-sanitizer, when it is on PATH or in /usr/local/cuda/bin ($COMPUTE_SANITIZER
#      names another): memcheck, then racecheck, then synccheck, each over
#      `harness check --device cuda --family F --cases 1` for every family (memcheck on f32
#      and bf16, the others on bf16), within 150 s of its own (GPU_CHECK_SANITIZER_S), each
#      run stopped after 45 s (GPU_CHECK_SANITIZER_RUN_S) or at what is left of the 150, the
#      rest skipped with a message once they are spent; the whole step skipped with a
#      message when compute-sanitizer is absent. A run's verdict: clean, stopped, or ERRORS
#      (exit 99) / check failed, which fail the step. Logs in $OUT/sanitizer/<tool>-<fam>.log.
# Timings are cold (L2 flushed before each repetition, ours and the torch peers' alike) in
# median_ms, hot beside them in hot_median_ms; a GB/s above the device's measured copy
# bandwidth is an error row, not a result.
# Time: the script keeps within GPU_CHECK_BUDGET_S (default 470 s, then the summary): each
# step's timeout is cut to what is left of it (less 60 s kept for the sanitizer when it will
# run), and a step with under 10 s left is skipped with a message.
# GPU_CHECK_STEPS="roofline check decode prefill quant moe sanitizer" (the default: all)
# picks steps. Exit status 1 when a step failed (they are listed last), else 0.
# The peers run under the machine's python3 (WORKBENCH_PEER_PYTHON), which holds PyTorch.
# Writes logs and CSV/JSON under $OUT (default ./gpu-out) and a short table last.
# Needs the harness binary: target/gpu/harness (scripts/gpu-prepare.sh) or $HARNESS, or
# cargo with the crates already present.
#
# Dry run (GPU_CHECK_DRY_RUN=1), what CI runs on the stand-in driver
# (harness/tests/gpu_check_dry_run.rs puts the fake libcuda on LD_LIBRARY_PATH, the emulator
# libraries in WORKBENCH_EMU_LIBS and shrinks the roofline with WORKBENCH_CUDA_ROOFLINE):
# every step, the same variants and peers (which answer `unavailable` without PyTorch), at
# tiny sizes — check with 1 case on f32 and bf16, 8 query heads of 64 at 128 tokens, 64x256
# GEMVs, a 40-token MoE layer of 8 experts, 2 repetitions; the sanitizer step as on a GPU
# (CI has no compute-sanitizer, so its skip message is what runs there; the same test then
# runs the sanitizer step alone with a stand-in compute-sanitizer over one family). Its
# times mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
DRY=${GPU_CHECK_DRY_RUN:-0}
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-470}
SANITIZER_S=${GPU_CHECK_SANITIZER_S:-150}
SANITIZER_RUN_S=${GPU_CHECK_SANITIZER_RUN_S:-45}
H=${HARNESS:-target/gpu/harness}
if [ ! -x "$H" ]; then
    echo "no harness binary at $H; building (needs the crates offline)" | tee -a "$OUT/log.txt"
    cargo build --release --offline -p harness && H=target/release/harness || exit 2
fi
# NVRTC 13 and the CUDA headers: LD_LIBRARY_PATH's, else the toolkit's, else a pip wheel's
# (PyTorch's venv has one).
nvrtc_on_path() {
    local d
    IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}"; do
        [ -n "$d" ] && [ -e "$d/libnvrtc.so.13" ] && return 0
    done
    ldconfig -p 2>/dev/null | grep -q 'libnvrtc.so.13'
}
if ! nvrtc_on_path; then
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
# The repository's commit, for the runs' provenance (gpu-prepare.sh): when HEAD is behind the
# bundle's commit and the working tree is exactly that commit, HEAD moves to it (the index
# follows; no file changes). Anywhere else (a checkout ahead of the bundle, edits) nothing moves.
if [ -f target/gpu/head.bundle ] && git rev-parse -q --verify HEAD >/dev/null 2>&1; then
    want=$(git bundle list-heads target/gpu/head.bundle 2>/dev/null | awk '$2 == "HEAD" {print $1}')
    if [ -n "$want" ] && [ "$(git rev-parse HEAD)" != "$want" ] &&
        git fetch -q target/gpu/head.bundle HEAD 2>/dev/null &&
        git merge-base --is-ancestor HEAD "$want" && git diff --quiet "$want" -- 2>/dev/null; then
        git reset -q "$want" && echo "repository: HEAD moved to the bundle's commit $want"
    fi
    echo "repository: $(git rev-parse HEAD)$(git diff --quiet HEAD -- || echo ' (dirty)')"
fi
export WORKBENCH_PEER_PYTHON="${WORKBENCH_PEER_PYTHON:-$(command -v python3)}"
RES="$OUT/results"
mkdir -p "$RES" "$OUT/sanitizer"
FAILED="$OUT/failed-steps.txt"
: >"$FAILED"

# What each step runs: H200 sizes, or tiny ones for the dry run.
if [ "$DRY" = 1 ]; then
    CHECK=(--cases 1 --dtype f32 --dtype bf16)
    ATT=(--set q_heads=8 --set heads=gqa --set head_dim=64 --set dtype=bf16)
    DECODE=(--reps 2 "${ATT[@]}" --set mode=decode --set batch=1 --set kv_len=128)
    PREFILL=(--reps 2 "${ATT[@]}" --set mode=prefill --set batch=1 --set kv_len=128)
    QUANT=(--reps 2 --set shape=64x256 --set batch=1)
    MOE=(--reps 2 --set experts=8 --set tokens=40 --set d_model=32 --set d_ff=40)
else
    CHECK=(--cases 3)
    DECODE=(--reps 20 --set mode=decode --set dtype=bf16 --set batch=8,32 --set heads=gqa
        --set kv_len=4096,16384)
    PREFILL=(--reps 10 --set mode=prefill --set dtype=bf16 --set batch=1 --set heads=gqa
        --set kv_len=1024,4096,8192)
    QUANT=(--reps 50 --set shape=4096x4096,4096x11008 --set batch=1,8)
    MOE=(--reps 20 --set experts=8,64 --set tokens=1024 --set d_model=512 --set d_ff=1024)
fi

# compute-sanitizer: $COMPUTE_SANITIZER, else PATH's, else the toolkit's; empty when absent.
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
[ -z "$CS" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && CS=/usr/local/cuda/bin/compute-sanitizer
[ -n "$CS" ] && [ ! -x "$CS" ] && CS=""
wanted() { [ -z "${GPU_CHECK_STEPS:-}" ] || [[ " $GPU_CHECK_STEPS " == *" $1 "* ]]; }
# The steps before the sanitizer leave it at least 60 s of the budget when it will run.
RESERVE=0
[ -n "$CS" ] && wanted sanitizer && RESERVE=60
left() { echo $((START + BUDGET - RESERVE - $(date +%s))); }
# step NAME LIMIT_S CMD...: CMD under `timeout`, LIMIT_S cut to what is left of the budget;
# a failure (or a timeout) goes to $FAILED.
step() {
    local name=$1 limit=$2
    shift 2
    wanted "$name" || return 0
    local l
    l=$(left)
    [ "$l" -lt "$limit" ] && limit=$l
    echo
    echo "=== $name ($(date -u +%T), at most ${limit} s)"
    if [ "$limit" -lt 10 ]; then
        echo "$name: skipped, the script's ${BUDGET} s are spent"
        return 0
    fi
    timeout -k 5 "$limit" "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        local why="exit $rc"
        [ "$rc" -eq 124 ] && why="timed out after ${limit} s"
        echo "$name: $why"
        echo "$name: $why" >>"$FAILED"
    fi
}
HX=("$H" --results-dir "$RES" --experiments-dir "$PWD/experiments")

# The sanitizer step: each tool over each family's check, within SANITIZER_S and what is left
# of the budget; memcheck first (every family), then racecheck, then synccheck.
sanitize() {
    wanted sanitizer || return 0
    echo
    echo "=== sanitizer ($(date -u +%T))"
    if [ -z "$CS" ]; then
        echo "compute-sanitizer not found (PATH, /usr/local/cuda/bin): sanitizer step skipped"
        return 0
    fi
    echo "$CS: $("$CS" --version 2>/dev/null | tail -1)"
    local until=$(($(date +%s) + SANITIZER_S)) end=$((START + BUDGET - 5))
    [ "$end" -lt "$until" ] && until=$end
    local tool fam l log rc verdict dtypes
    for tool in memcheck racecheck synccheck; do
        dtypes=(--dtype bf16)
        [ "$tool" = memcheck ] && dtypes=(--dtype f32 --dtype bf16)
        for fam in ${GPU_CHECK_SANITIZER_FAMILIES:-attention paged quant moe speculative}; do
            l=$((until - $(date +%s)))
            [ "$l" -gt "$SANITIZER_RUN_S" ] && l=$SANITIZER_RUN_S
            if [ "$l" -lt 5 ]; then
                printf '  %-9s %-10s skipped: no time left of its %s s\n' "$tool" "$fam" "$SANITIZER_S"
                continue
            fi
            log="$OUT/sanitizer/$tool-$fam.log"
            timeout -k 5 "$l" "$CS" --tool "$tool" --error-exitcode 99 \
                "$H" --results-dir "$RES/sanitizer" --experiments-dir "$PWD/experiments" \
                check --device cuda --family "$fam" --cases 1 "${dtypes[@]}" >"$log" 2>&1
            rc=$?
            case $rc in
            0) verdict="clean" ;;
            99) verdict="ERRORS" ;;
            124 | 137) verdict="stopped after ${l} s" ;;
            1) verdict="check failed" ;;
            *) verdict="exit $rc" ;;
            esac
            printf '  %-9s %-10s %-22s %s\n' "$tool" "$fam" "$verdict" \
                "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
            case $rc in
            0 | 124 | 137) ;;
            *) echo "sanitizer $tool $fam: $verdict ($log)" >>"$FAILED" ;;
            esac
        done
    done
}

{
    if [ "$DRY" = 1 ]; then
        echo "=== dry run (GPU_CHECK_DRY_RUN=1): tiny sizes, times meaningless"
    else
        echo "=== machine"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
    fi
    step roofline 120 "${HX[@]}" roofline --device cuda
    step check 240 "${HX[@]}" check --device cuda "${CHECK[@]}" --format table
    step decode 150 "${HX[@]}" exp flash_vs_paged --device cuda "${DECODE[@]}" \
        --variant cuda_paged:bs=16 --variant cuda_paged:bs=16,split=auto \
        --variant cuda_paged:bs=16,pipe=1 --variant cuda_paged:bs=16,split=auto,pipe=1 \
        --variant cuda_paged:bs=16,split=1024,pipe=1 --variant cuda_paged:bs=16,split=2048,pipe=1 \
        --variant cuda_paged:bs=128,split=auto,pipe=1 --variant cuda_flash2 \
        --peer torch_sdpa
    step prefill 150 "${HX[@]}" exp flash_vs_paged --device cuda "${PREFILL[@]}" \
        --variant cuda_flash2 --variant cuda_flash2:pipe=1 --variant cuda_naive --peer torch_sdpa
    step quant 150 "${HX[@]}" exp quant_tradeoff --device cuda "${QUANT[@]}" --set weights=gaussian \
        --set format=f16,q8_0,q4_0,sym4g32 --peer torch_linear:dtype=bf16
    step moe 120 "${HX[@]}" exp moe_capacity --device cuda "${MOE[@]}" --set top_k=2 --set skew=1.0 \
        --set capacity=1.25 --set policy=gshard --set norm=renormalize_kept \
        --set routing=token_choice,expert_choice \
        --variant cuda_grouped --variant cuda_grouped:dtype=f16
    sanitize
} 2>&1 | tee "$OUT/log.txt"
{
    echo
    echo "=== summary ($(($(date +%s) - START)) s in all)"
    python3 scripts/gpu_summary.py "$RES"
    if [ -s "$FAILED" ]; then
        echo
        echo "failed steps:"
        sed 's/^/  /' "$FAILED"
    fi
} 2>&1 | tee "$OUT/summary.txt" | tee -a "$OUT/log.txt"
[ ! -s "$FAILED" ]
