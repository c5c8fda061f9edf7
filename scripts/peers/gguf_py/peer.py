#!/usr/bin/env python3
"""Peer gguf_py for the workbench harness (protocol: harness/src/peer.rs; the quant family's
quantize points: harness/src/families/quant/peers.rs).

Reads the point's f32 weights `x` [rows, cols] and quantises them with the gguf package's
reference quantisers (gguf.quants.quantize: numpy ports of ggml's quantize_row_*_ref) into
the point's format (q8_0, q4_0, q4_1, q5_0, q5_1, bf16: every ggml type gguf.quants quantises; it
only dequantises the K-quants and IQ4_NL), written as u8 tensor `q` (the blocks, row after row,
as ggml stores them); times calls with time.perf_counter on request.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_lib"))
import peerio  # noqa: E402


def main():
    try:
        import importlib.metadata as md

        import numpy as np
        from gguf import GGMLQuantizationType as T
        from gguf.quants import quantize
    except Exception as e:  # noqa: BLE001 - any import failure means "not installed"
        peerio.unavailable_forever(f"gguf is not importable ({type(e).__name__}: {e})")
        return
    types = {
        "q8_0": T.Q8_0,
        "q4_0": T.Q4_0,
        "q4_1": T.Q4_1,
        "q5_0": T.Q5_0,
        "q5_1": T.Q5_1,
        "bf16": T.BF16,
    }
    state = {}

    def call():
        return quantize(state["x"], state["type"])

    def handle(op, req):
        if op == "hello":
            return {"version": f"gguf {md.version('gguf')} (numpy {np.__version__})"}
        if op == "load":
            p = req["point"]
            if p.get("op") != "quantize":
                raise peerio.Unsupported("gguf_py quantises only")
            if p["format"] not in types:
                raise peerio.Unsupported(f"gguf_py has no quantiser for {p['format']}")
            if req.get("device", "cpu") != "cpu":
                raise peerio.Unsupported("gguf_py runs on the CPU")
            tensors, _ = peerio.read_case(req["inputs"])
            dtype, shape, data = tensors["x"]
            if dtype != "F32":
                raise ValueError(f"weights are {dtype}, expected F32")
            state["x"] = np.frombuffer(data, dtype=np.float32).reshape(shape).copy()
            state["type"] = types[p["format"]]
            return {"threads": 1}  # numpy's element-wise quantiser runs on one thread
        if op == "run":
            q = np.ascontiguousarray(call(), dtype=np.uint8)
            peerio.write_case(req["out"], {"q": ("U8", [q.size], q.tobytes())})
            return {}
        if op == "time":
            times = []
            for _ in range(int(req.get("reps", 1))):
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
            return {"times_ms": times}
        raise ValueError(f"unknown op {op!r}")

    peerio.serve(handle)


if __name__ == "__main__":
    main()
