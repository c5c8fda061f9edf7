#!/usr/bin/env python3
"""Peer torch_linear for the workbench harness (protocol: harness/src/peer.rs; the quant
family's matmul points: harness/src/families/quant/peers.rs).

Reads the point's f32 weights `x` [rows, cols] (the case file named by `inputs`, kept while
the path stays the same) and activations `act` [batch, cols] (the file named by `act`), casts
both to the dtype of its `dtype` option (f32 or bf16), and computes
torch.nn.functional.linear(act, weights) -> [batch, rows] on the point's device, written as
f32 tensor `out`; times calls on request as the harness times its own kernels
(../_lib/torch_timing.py: on CUDA one warm-up call, then CUDA events with L2 flushed before
each repetition unless the request asks for hot times; on the CPU time.perf_counter).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_lib"))
import peerio  # noqa: E402
import torch_timing  # noqa: E402


def main():
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means "not installed"
        peerio.unavailable_forever(f"torch is not importable ({type(e).__name__}: {e})")
        return
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    timer = torch_timing.Timer(torch)
    state = {"dtype": torch.float32, "weights_path": None}

    def call():
        return F.linear(state["act"], state["w"])

    def handle(op, req):
        if op == "hello":
            state["dtype"] = dtypes[req.get("options", {}).get("dtype", "f32")]
            return {"version": f"torch {torch.__version__}"}
        if op == "load":
            p = req["point"]
            if p.get("op") != "matmul":
                raise peerio.Unsupported("torch_linear multiplies only")
            dev = torch.device(req.get("device", "cpu"))
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise peerio.Unsupported("torch sees no CUDA device")
            torch.set_num_threads(int(req.get("threads", 1)))
            if state["weights_path"] != (req["inputs"], str(dev)):
                tensors, _ = peerio.read_case(req["inputs"])
                w = peerio.torch_tensor(tensors["x"], torch)
                state["w"] = w.to(dev, state["dtype"]).contiguous()
                state["weights_path"] = (req["inputs"], str(dev))
            tensors, _ = peerio.read_case(req["act"])
            state["act"] = peerio.torch_tensor(tensors["act"], torch).to(dev, state["dtype"])
            state["device"] = dev
            return {}
        if op == "run":
            with torch.inference_mode():
                peerio.write_torch_out(req["out"], call())
            return {}
        if op == "time":
            with torch.inference_mode():
                return timer.time(call, state["device"], req)
        raise ValueError(f"unknown op {op!r}")

    peerio.serve(handle)


if __name__ == "__main__":
    main()
