#!/usr/bin/env python3
"""Peer torch_sdpa for the workbench harness (protocol: harness/src/peer.rs).

Reads the point's q, k, v from the harness's case file (safetensors, storage dtype), runs
torch.nn.functional.scaled_dot_product_attention in that dtype with the point's scale, GQA
through enable_gqa, and a causal mask aligned bottom-right (query i of q_len sees keys up to
kv_len - q_len + i, the workbench's convention; is_causal=True when q_len == kv_len), writes
the output as f32 tensor `out`, and times calls with time.perf_counter on request.
"""
import json
import struct
import sys
import time


def reply(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def read_safetensors(path, torch):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        buf = bytearray(data[start:end])
        out[name] = torch.frombuffer(buf, dtype=dtypes[t["dtype"]]).reshape(t["shape"]).clone()
    return out


def write_out(path, tensor):
    body = tensor.detach().to("cpu").float().contiguous().numpy().tobytes()
    header = json.dumps(
        {"out": {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [0, len(body)]}}
    ).encode()
    header += b" " * ((8 - len(header) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + body)


def main():
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means "not installed"
        for line in sys.stdin:
            reply(ok=False, unavailable=f"torch is not importable ({type(e).__name__}: {e})")
        return
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

    for line in sys.stdin:
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "hello":
                reply(ok=True, version=f"torch {torch.__version__}")
            elif op == "load":
                p = req["point"]
                torch.set_num_threads(int(req.get("threads", 1)))
                t = read_safetensors(req["inputs"], torch)
                state.update(point=p, q=t["q"], k=t["k"], v=t["v"])
                lq, lk = p["q_len"], p["kv_len"]
                if p["causal"] and 1 < lq < lk:
                    i = torch.arange(lq).unsqueeze(1)
                    j = torch.arange(lk).unsqueeze(0)
                    state["mask"] = j <= (lk - lq) + i
                reply(ok=True)
            elif op == "run":
                with torch.inference_mode():
                    write_out(req["out"], call())
                reply(ok=True)
            elif op == "time":
                times = []
                with torch.inference_mode():
                    for _ in range(int(req.get("reps", 1))):
                        t0 = time.perf_counter()
                        call()
                        times.append((time.perf_counter() - t0) * 1e3)
                reply(ok=True, times_ms=times)
            else:
                reply(ok=False, error=f"unknown op {op!r}")
        except Exception as e:  # noqa: BLE001 - reported to the harness, which goes on
            reply(ok=False, error=f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
