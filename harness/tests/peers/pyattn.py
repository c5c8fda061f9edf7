#!/usr/bin/env python3
"""A test peer for harness/tests/peers.rs: attention in plain Python (f32 case files, tiny
shapes), speaking the harness's peer protocol (harness/src/peer.rs). --behave picks what it
does: ok, wrong (adds 0.5 to every output), crash (exits on load), hang (never answers run),
garbage (prints a non-JSON line on run). --log PATH appends one line per request
("<name> <op>", "<name> device <device>" on load, "<name> time hot" when asked for hot
times) so a test can see the order of the rounds and the device the peer was told, and
keeps a copy of the last case file it was given at PATH.case, so the test can compare its
bytes with the seeded inputs.
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
    return out, raw


def attention(p, q, k, v, shift):
    b_, hq, lq, d = p["batch"], p["q_heads"], p["q_len"], p["head_dim"]
    hk, lk = p["kv_heads"], p["kv_len"]
    group = hq // hk
    out = []
    for b in range(b_):
        for h in range(hq):
            kh = h // group
            for i in range(lq):
                qi = q[((b * hq + h) * lq + i) * d :][:d]
                last = lk - lq + i if p["causal"] else lk - 1
                scores = []
                for j in range(last + 1):
                    kj = k[((b * hk + kh) * lk + j) * d :][:d]
                    scores.append(p["scale"] * sum(x * y for x, y in zip(qi, kj)))
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                z = sum(w)
                for c in range(d):
                    acc = sum(w[j] * v[((b * hk + kh) * lk + j) * d + c] for j in range(last + 1))
                    out.append(acc / z + shift)
    return out


def write_out(path, values, shape):
    body = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({"out": {"dtype": "F32", "shape": shape, "data_offsets": [0, len(body)]}})
    header = header.encode() + b" " * ((8 - (len(header) + 0) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(header)) + header + body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="pyattn")
    ap.add_argument("--behave", default="ok")
    ap.add_argument("--log")
    args = ap.parse_args()
    state = {}
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"{args.name} {op}\n")
        if op == "hello":
            reply(ok=True, version="pyattn 1.0 (test peer)")
        elif op == "load":
            if args.log:
                with open(args.log, "a") as f:
                    f.write(f"{args.name} device {req.get('device', '?')}\n")
            if args.behave == "crash":
                sys.stderr.write("pyattn: crashing on purpose\n")
                sys.exit(3)
            tensors, raw = read_case(req["inputs"])
            if args.log:
                with open(args.log + ".case", "wb") as f:
                    f.write(raw)
            state.update(point=req["point"], **{n: t[1] for n, t in tensors.items()})
            state["shape"] = tensors["q"][0]
            reply(ok=True)
        elif op == "run":
            if args.behave == "hang":
                time.sleep(3600)
            if args.behave == "garbage":
                print("this is not json")
                sys.stdout.flush()
                continue
            shift = 0.5 if args.behave == "wrong" else 0.0
            out = attention(state["point"], state["q"], state["k"], state["v"], shift)
            write_out(req["out"], out, state["shape"])
            reply(ok=True)
        elif op == "time":
            times = []
            for _ in range(int(req.get("reps", 1))):
                t0 = time.perf_counter()
                attention(state["point"], state["q"], state["k"], state["v"], 0.0)
                times.append((time.perf_counter() - t0) * 1e3)
            if req.get("l2") == "hot":
                # Asked for hot times (a CUDA device): say they are, as the torch peers do.
                if args.log:
                    with open(args.log, "a") as f:
                        f.write(f"{args.name} time hot\n")
                reply(ok=True, times_ms=times, l2="hot")
            else:
                reply(ok=True, times_ms=times)
        else:
            reply(ok=False, error=f"unknown op {op}")


if __name__ == "__main__":
    main()
