#!/usr/bin/env python3
"""A test peer for harness/tests/peers_families.rs: the decode family's peer protocol
(harness/src/families/decode/peers.rs) without llama.cpp. It serves one sequence (a batch
above 1 is `unsupported`), answers `time` with the time of a short busy loop, and logs
"<name> <op> <phase> <batch>" per request to --log, so a test can see the rounds alternate.
Its check (`run` with {"check": {"prompt", "tokens"}}) answers as llama-simple would — the
prompt, then the greedy continuation — from `harness generate` (--harness: our own greedy in
the packed arithmetic, which the check must accept), or with its first two words swapped
(--corrupt: a continuation the check must refuse).
"""
import argparse
import json
import subprocess
import sys
import time


def reply(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="pydecode")
    ap.add_argument("--log")
    ap.add_argument("--harness", help="the harness binary, for the check's greedy tokens")
    ap.add_argument("--corrupt", action="store_true", help="swap the continuation's first two words")
    args = ap.parse_args()
    point, model = {}, None
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "load":
            point, model = req["point"], req["inputs"]
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
        elif op == "run" and args.harness:
            check = req["check"]
            out = subprocess.run(
                [args.harness, "generate", "--model", model, "--prompt", check["prompt"],
                 "--max-new-tokens", str(check["tokens"]), "--matmul", "packed", "--threads", "1",
                 "--format", "json"], capture_output=True, text=True, check=True)
            g = json.loads(out.stdout)
            text = g["text"].removesuffix("<|im_end|>")
            decoded = len(g["generated_ids"]) - (text != g["text"])
            if args.corrupt:
                words = text.split(" ")
                words[1], words[2] = words[2], words[1]
                text = " ".join(words)
            reply(ok=True, text=check["prompt"] + text + "\n", decoded=decoded)
        elif op == "time":
            t0 = time.perf_counter()
            sum(i * i for i in range(20000))
            reply(ok=True, times_ms=[(time.perf_counter() - t0) * 1e3])
        else:
            reply(ok=False, error=f"unknown op {op}")


if __name__ == "__main__":
    main()
