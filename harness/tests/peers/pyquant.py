#!/usr/bin/env python3
"""A test peer for harness/tests/peers_families.rs: the quant family's two peer kinds in plain
Python (tiny shapes), speaking the harness's peer protocol (harness/src/peer.rs).
--op matmul: y = act . x^T in f64 (written as f32); --op quantize: ggml's Q8_0 reference
quantiser (quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d), d stored as f16), with
every f32 operation rounded to f32 as ggml does it, so its bytes equal ggml's.
--behave wrong adds 0.5 to every output (matmul) or flips one bit of the first block
(quantize). --log PATH appends "<name> <op>" per request.
"""
import argparse
import json
import math
import struct
import sys
import time


def reply(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def read_case(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", "this test peer reads f32 only"
        s, e = t["data_offsets"]
        out[name] = (t["shape"], list(struct.unpack(f"<{(e - s) // 4}f", data[s:e])))
    return out


def write(path, name, dtype, shape, body):
    header = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, len(body)]}}).encode()
    header += b" " * ((8 - len(header) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(header)) + header + body)


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def roundf(v):
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def q8_0(x, rows, cols):
    out = bytearray()
    for r in range(rows):
        for b in range(0, cols, 32):
            block = x[r * cols + b : r * cols + b + 32]
            amax = max(abs(v) for v in block)
            d = f32(amax / 127.0)
            inv = f32(1.0 / d) if d else 0.0
            out += struct.pack("<e", d)
            out += bytes(int(roundf(f32(v * inv))) & 0xFF for v in block)
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="pyquant")
    ap.add_argument("--op", choices=["matmul", "quantize"], required=True)
    ap.add_argument("--behave", default="ok")
    ap.add_argument("--log")
    args = ap.parse_args()
    state = {}

    def compute():
        p = state["point"]
        rows, cols = p["rows"], p["cols"]
        if args.op == "quantize":
            q = bytearray(q8_0(state["x"], rows, cols))
            if args.behave == "wrong":
                q[2] ^= 1
            return bytes(q)
        batch = p["batch"]
        x, a = state["x"], state["act"]
        shift = 0.5 if args.behave == "wrong" else 0.0
        return [sum(a[b * cols + c] * x[r * cols + c] for c in range(cols)) + shift
                for b in range(batch) for r in range(rows)]

    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"{args.name} {op}\n")
        if op == "hello":
            reply(ok=True, version=f"pyquant 1.0 ({json.dumps(req.get('options', {}), sort_keys=True)})")
        elif op == "load":
            p = req["point"]
            if p["op"] != args.op:
                reply(ok=False, unsupported=f"pyquant --op {args.op} only")
                continue
            state["point"] = p
            state["x"] = read_case(req["inputs"])["x"][1]
            if args.op == "matmul":
                state["act"] = read_case(req["act"])["act"][1]
            reply(ok=True)
        elif op == "run":
            out = compute()
            if args.op == "quantize":
                write(req["out"], "q", "U8", [len(out)], out)
            else:
                p = state["point"]
                write(req["out"], "out", "F32", [p["batch"], p["rows"]], struct.pack(f"<{len(out)}f", *out))
            reply(ok=True)
        elif op == "time":
            times = []
            for _ in range(int(req.get("reps", 1))):
                t0 = time.perf_counter()
                compute()
                times.append((time.perf_counter() - t0) * 1e3)
            reply(ok=True, times_ms=times)
        else:
            reply(ok=False, error=f"unknown op {op}")


if __name__ == "__main__":
    main()
