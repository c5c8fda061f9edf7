"""Writes the llama-quantize vectors replayed by kernels/quant/tests/llama_vectors.rs.

Third-party encoder: llama.cpp's `llama-quantize` (no importance matrix, so every tensor goes
through ggml-quants.c's `quantize_row_*_ref` / `quantize_iq4_nl`), requantising real files
to each type with --pure --allow-requantize: SmolLM2-135M-Instruct Q4_1 and Gemma-3-270M
Q4_K_M. SmolLM2's tensors whose rows are not a multiple of 256 (576 columns: all but
ffn_down's 1536; Gemma's 640) fall back to a 32-value type (Q2_K/Q3_K → Q4_0, Q4_K → Q5_0,
Q5_K → Q5_1, Q6_K → Q8_0), which gives those types from llama-quantize too. SmolLM2's
ffn_down rows are Q4_1 blocks dequantised, 16 levels per 32 values — an exact grid for Q4_K,
whose search then finds it at its first trial scale — so Gemma's Q6_K and Q4_K rows (other
grids, 16-value sub-blocks) are there to make every trial of the searches matter (a tensor
already of the target type is copied by llama-quantize, not requantised: skipped). Run from
the repository root, with the venv's gguf 0.19.0:

    python kernels/quant/tests/data/make_llama_vectors.py [LLAMA_QUANTIZE]

(default: target/peers/llama.cpp/build-native/bin/llama-quantize; the sources from
models/cache/). Writes llama_<format>.safetensors here: per source tensor `t` (named
`<model>/<tensor>`), `x:t` (f32 rows: the source rows dequantised, what llama-quantize
quantised), `q:t` (u8: the bytes llama-quantize wrote) and `out:t` (f32: gguf's
dequantisation of those bytes); metadata family=quant, format, generator, sources, rows.
"""
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
QUANTIZE = sys.argv[1] if len(sys.argv) > 1 else "target/peers/llama.cpp/build-native/bin/llama-quantize"
# llama-quantize's target types (Q3_K is its alias for Q3_K_M, which --pure makes all Q3_K).
TARGETS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "Q5_0", "Q5_1"]
# (label, file, tensors): per model a few tensors whose rows are a multiple of 256 (every
# type) and, for SmolLM2, 576-column ones (the 32-value types and the fallbacks).
SOURCES = [
    ("smollm2", "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
     ["blk.0.ffn_down.weight", "blk.29.ffn_down.weight", "blk.3.attn_q.weight",
      "blk.17.ffn_gate.weight"]),
    # blk.0.ffn_down is Q6_K in the source, blk.2.ffn_down and attn_output Q4_K.
    ("gemma3", "models/cache/gemma-3-270m-q4_k_m.gguf",
     ["blk.0.ffn_down.weight", "blk.2.ffn_down.weight", "blk.5.attn_output.weight"]),
]
ROWS = [0, 1, 2, 97, 300, 575]


def rows_of(reader, name):
    t = next(t for t in reader.tensors if t.name == name)
    return t.tensor_type, np.asarray(t.data)[ROWS]


def main():
    # The peer build keeps llama.cpp's VERSION three levels above build-native/bin/.
    stamp = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(QUANTIZE)))),
                         "VERSION")
    version = open(stamp).read().strip() if os.path.exists(stamp) else "llama.cpp"
    found = defaultdict(dict)
    with tempfile.TemporaryDirectory() as tmp:
        for label, file, tensors in SOURCES:
            source = GGUFReader(file)
            for target in TARGETS:
                path = os.path.join(tmp, f"{target}.gguf")
                subprocess.run([QUANTIZE, "--allow-requantize", "--pure", file, path, target, "2"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                out = GGUFReader(path)
                for name in tensors:
                    qtype, q = rows_of(out, name)
                    fmt, key = qtype.name.lower(), f"{label}/{name}"
                    stype, src = rows_of(source, name)
                    # llama-quantize copies a tensor already of the target type.
                    if key in found[fmt] or stype == qtype:
                        continue
                    x = dequantize(src, stype).astype(np.float32)
                    y = dequantize(q, qtype).astype(np.float32)
                    found[fmt][key] = (x, np.ascontiguousarray(q, dtype=np.uint8), y,
                                       f"{label} {stype.name} -> {target}")
                del out
                os.remove(path)
    for fmt, tensors in sorted(found.items()):
        if fmt in ("f16", "f32"):
            continue
        data, made_by = {}, set()
        for name, (x, q, y, how) in tensors.items():
            data[f"x:{name}"], data[f"q:{name}"], data[f"out:{name}"] = x, q, y
            made_by.add(how)
        save_file(data, os.path.join(HERE, f"llama_{fmt}.safetensors"), metadata={
            "family": "quant", "format": fmt,
            "generator": f"llama-quantize --pure --allow-requantize ({version}); "
                         + ", ".join(sorted(made_by)),
            "sources": ", ".join(os.path.basename(f) for _, f, _ in SOURCES),
            "rows": ",".join(map(str, ROWS)),
        })
        print(fmt, sorted(tensors))


if __name__ == "__main__":
    main()
