"""Writes e4m3_ml_dtypes.txt: f32 inputs and the float8_e4m3fn byte that ml_dtypes (an
implementation independent of ours and of PyTorch's c10 code) gives each after clipping to
±448, the saturating conversion the KV cache uses. One line per value: the f32 bits and the
byte, both in hex. Inputs: every finite E4M3 value, every midpoint between neighbours (the
ties, where round-to-nearest-even decides) and the f32 values just either side of each,
subnormal-range and random values at many scales, signed zeros, ±inf and values beyond ±448.

    python3 -m venv venv && venv/bin/pip install ml_dtypes numpy && venv/bin/python make_e4m3.py
"""
import ml_dtypes
import numpy as np

e4m3 = ml_dtypes.float8_e4m3fn
codes = np.arange(256, dtype=np.uint8)
values = codes.view(e4m3).astype(np.float32)
finite = np.sort(np.unique(values[np.isfinite(values)]))
mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
rng = np.random.default_rng(20)
xs = [
    finite,
    mids,
    np.nextafter(mids, np.float32(np.inf)),
    np.nextafter(mids, np.float32(-np.inf)),
    rng.standard_normal(600).astype(np.float32) * np.float32(2.0) ** rng.integers(-14, 10, 600).astype(np.float32),
    rng.uniform(-2.0**-6, 2.0**-6, 300).astype(np.float32),
    np.array([0.0, -0.0, np.inf, -np.inf, 448.0, 449.0, 463.9, 464.0, 465.0, 480.0, 1e6, -1e6, 2.0**-10, 2.0**-11, -(2.0**-10) * 1.5], dtype=np.float32),
]
x = np.concatenate(xs).astype(np.float32)
got = np.clip(x, -448.0, 448.0).astype(e4m3).view(np.uint8)
with open("e4m3_ml_dtypes.txt", "w") as f:
    f.write(f"# ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}: f32 bits, float8_e4m3fn byte of clip(x, -448, 448)\n")
    for xi, b in zip(x.view(np.uint32), got):
        f.write(f"{xi:08x} {b:02x}\n")
print(len(x), "values")
