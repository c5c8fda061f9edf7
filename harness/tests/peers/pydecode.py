#!/usr/bin/env python3
"""A test peer for harness/tests/peers_families.rs: the decode family's peer protocol
(harness/src/families/decode/peers.rs) without llama.cpp. It serves one sequence (a batch
above 1 is `unsupported`), answers `time` with the time of a short busy loop, and logs
"<name> <op> <phase> <batch>" per request to --log, so a test can see the rounds alternate.
"""
import argparse
import json
import sys
import time


def reply(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="pydecode")
    ap.add_argument("--log")
    args = ap.parse_args()
    point = {}
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "load":
            point = req["point"]
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"{args.name} {op} {point.get('phase', '-')} {point.get('batch', '-')}\n")
        if op == "hello":
            reply(ok=True, version="pydecode 1.0 (test peer)")
        elif op == "load":
            if point["batch"] != 1:
                reply(ok=False, unsupported="pydecode decodes one sequence")
            else:
                reply(ok=True)
        elif op == "time":
            t0 = time.perf_counter()
            sum(i * i for i in range(20000))
            reply(ok=True, times_ms=[(time.perf_counter() - t0) * 1e3])
        else:
            reply(ok=False, error=f"unknown op {op}")


if __name__ == "__main__":
    main()
