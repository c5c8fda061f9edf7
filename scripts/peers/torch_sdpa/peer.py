#!/usr/bin/env python3
"""Peer torch_sdpa for the workbench harness (protocol: harness/src/peer.rs).

Reads the point's q, k, v from the harness's case file (safetensors, storage dtype), runs
torch.nn.functional.scaled_dot_product_attention in that dtype on the point's device (cpu,
or cuda:N beside our CUDA variants) with the point's scale, GQA through enable_gqa, and a
causal mask aligned bottom-right (query i of q_len sees keys up to kv_len - q_len + i, the
workbench's convention; is_causal=True when q_len == kv_len), writes the output as f32 tensor
`out`, and times calls on request as the harness times its own kernels
(../_lib/torch_timing.py: on CUDA one warm-up call, then CUDA events with L2 flushed before
each repetition unless the request asks for hot times; on the CPU time.perf_counter).
Option cpu_capability (native, avx512, avx2, default): torch's CPU kernels at that tier
(ATEN_CPU_CAPABILITY, set before torch is imported), to compare with `harness --isa`.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_lib"))
import peerio  # noqa: E402
import torch_timing  # noqa: E402


def main():
    # torch is imported at `hello`: its CPU dispatch reads ATEN_CPU_CAPABILITY once, at import.
    torch = F = timer = None
    state = {}

    def call():
        p = state["point"]
        q, k, v = state["q"], state["k"], state["v"]
        lq, lk = p["q_len"], p["kv_len"]
        kw = {"scale": p["scale"], "enable_gqa": p["q_heads"] != p["kv_heads"]}
        if p["causal"] and lq == lk:
            kw["is_causal"] = True
        elif p["causal"] and lq > 1:
            kw["attn_mask"] = state["mask"]
        return F.scaled_dot_product_attention(q, k, v, **kw)

    def handle(op, req):
        nonlocal torch, F, timer
        if op == "hello":
            cap = req.get("options", {}).get("cpu_capability", "native")
            if cap != "native":
                os.environ["ATEN_CPU_CAPABILITY"] = cap
            try:
                import torch
                import torch.nn.functional as F
            except Exception as e:  # noqa: BLE001 - any import failure means "not installed"
                raise peerio.Unavailable(f"torch is not importable ({type(e).__name__}: {e})")
            timer = torch_timing.Timer(torch)
            got = torch.backends.cpu.get_cpu_capability()
            if cap != "native" and got.lower() != cap:
                raise peerio.Unsupported(f"torch runs {got} here, not the asked {cap}")
            return {"version": f"torch {torch.__version__}, CPU {got}"}
        if op == "load":
            p = req["point"]
            dev = torch.device(req.get("device", "cpu"))
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise peerio.Unsupported("torch sees no CUDA device")
            torch.set_num_threads(int(req.get("threads", 1)))
            t, _ = peerio.read_case(req["inputs"])
            q, k, v = (peerio.torch_tensor(t[n], torch).to(dev) for n in ("q", "k", "v"))
            state.update(point=p, q=q, k=k, v=v, device=dev)
            lq, lk = p["q_len"], p["kv_len"]
            if p["causal"] and 1 < lq < lk:
                i = torch.arange(lq, device=dev).unsqueeze(1)
                j = torch.arange(lk, device=dev).unsqueeze(0)
                state["mask"] = j <= (lk - lq) + i
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
