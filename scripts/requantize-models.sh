#!/usr/bin/env bash
# Writes the requantised SmolLM2 files the formats experiments compare with llama.cpp on its
# own best paths, with llama.cpp's llama-quantize (built by scripts/fetch-peers.sh), from the
# shipped Q4_1 file (scripts/fetch-models.sh) into the git-ignored models/cache/:
#   SmolLM2-135M-Instruct.Q4_0.gguf     Q4_0 (llama.cpp repacks it into 8x8 tiles on x86)
#   SmolLM2-135M-Instruct.Q4_K_M.gguf   Q4_K_M (Q4_K/Q6_K, with Q5_0/Q8_0 where a row of 576
#                                       is not a multiple of 256)
#   SmolLM2-135M-Instruct.Q5_K_M.gguf   Q5_K_M (Q5_K/Q6_K where a row is a multiple of 256:
#                                       ffn_down; Q5_1/Q8_0 elsewhere)
#   SmolLM2-135M-Instruct.IQ4_NL.gguf   IQ4_NL (Q5_K on ffn_down, Q8_0 embedding)
# Requantising goes through f32 (--allow-requantize): what llama-quantize quantises is the Q4_1
# file's dequantised weights. Idempotent. LLAMACPP_BUILD=native (default) picks the build.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="target/peers/llama.cpp/build-${LLAMACPP_BUILD:-native}/bin/llama-quantize"
src=models/cache/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -x "$bin" ]; then
    echo "error: $bin is absent (run scripts/fetch-peers.sh)" >&2
    exit 2
fi
if [ ! -s "$src" ]; then
    echo "error: $src is absent (run scripts/fetch-models.sh)" >&2
    exit 2
fi
for t in Q4_0 Q4_K_M Q5_K_M IQ4_NL; do
    out="models/cache/SmolLM2-135M-Instruct.$t.gguf"
    if [ -s "$out" ]; then
        echo "already present: $out"
        continue
    fi
    "$bin" --allow-requantize "$src" "$out.tmp" "$t" > "$out.tmp.log" 2>&1 || { tail -5 "$out.tmp.log" >&2; exit 1; }
    rm -f "$out.tmp.log"
    mv "$out.tmp" "$out"
    ls -l "$out"
done
