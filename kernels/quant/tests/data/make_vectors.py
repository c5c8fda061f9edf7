"""Writes the ggml test vectors replayed by kernels/quant/tests/ggml_vectors.rs.

Third-party encoder: the `gguf` package (llama.cpp's Python port of ggml-quants.c,
`gguf.quants.quantize` / `dequantize`). Run once with gguf==0.19.0, numpy, safetensors:

    python make_vectors.py

Each file is a safetensors case (the schema `harness replay` reads): tensors `x` (f32 rows),
`q` (u8, the packed blocks gguf wrote) and `out` (f32, gguf's dequantisation of `q`);
metadata family=quant, format, generator. gguf quantises Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and
BF16 (the K-quants and IQ4_NL it only dequantises: their vectors come from llama-quantize,
make_llama_vectors.py). The three first files predate the others and stay byte-identical:
a rerun writes the same tensors, though safetensors may order the metadata keys otherwise.
"""
import numpy as np
import gguf
from importlib.metadata import version
from gguf.quants import quantize, dequantize
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

rng = np.random.default_rng(20261129)
rows, cols = 8, 256
x = rng.standard_normal((rows, cols)).astype(np.float32)
x[1, 7] = 40.0                  # a single huge outlier in a block
x[2, 32:64] = 0.0               # an all-zero block
x[3, 64:96] = 1.25              # a constant block
x[4, 96:128] = -0.75            # a negative constant block
x[5, :] *= 1e-3                 # tiny values (f16 subnormal scales)
x[6, 3::17] *= 25.0             # outlier channels
x[7, 0:32] = np.linspace(-1, 1, 32, dtype=np.float32)  # exact ties at .5 steps

for name, qt in [("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_1", T.Q4_1),
                 ("q5_0", T.Q5_0), ("q5_1", T.Q5_1), ("bf16", T.BF16)]:
    q = quantize(x, qt)
    out = dequantize(q, qt).astype(np.float32)
    save_file(
        {"x": x, "q": np.ascontiguousarray(q, dtype=np.uint8), "out": out},
        f"gguf_{name}.safetensors",
        metadata={"family": "quant", "format": name,
                  "generator": f"gguf {version('gguf')} gguf.quants.quantize"},
    )
    print(name, q.shape, q.dtype)
