#!/usr/bin/env python3
"""Peer llamacpp for the workbench harness (protocol: harness/src/peer.rs; the decode
family's points: harness/src/families/decode/peers.rs).

Runs llama.cpp's llama-bench (built by scripts/fetch-peers.sh under
target/peers/llama.cpp/build-<build>/bin, or WORKBENCH_LLAMACPP_DIR/build-<build>/bin) on the
point's GGUF file with the harness's threads, one repetition per timed call (-r 1, after
llama-bench's own warm-up run):
  decode:  -p 0 -n STEPS -d CONTEXT  -> ms per generated token (STEPS tokens after a
           CONTEXT-token prompt, one sequence);
  prefill: -p N -n 0                 -> ms for the N-token prompt.
llama-bench returns no tensors, so there is nothing for the harness to check: `run` answers
that it has no output.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "_lib"))
import peerio  # noqa: E402


def main():
    root = os.environ.get("WORKBENCH_LLAMACPP_DIR") or os.path.join(HERE, "..", "..", "..", "target", "peers", "llama.cpp")
    state = {}

    def bench():
        p = state["point"]
        args = [state["bin"], "-m", state["model"], "-t", str(state["threads"]), "-r", "1", "-o", "json"]
        if p["phase"] == "decode":
            args += ["-p", "0", "-n", str(p["steps"]), "-d", str(p["context"])]
        else:
            args += ["-p", str(p["prompt"]), "-n", "0"]
        out = subprocess.run(args, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            raise RuntimeError(f"llama-bench exited {out.returncode}: {tail}")
        row = json.loads(out.stdout)[0]
        ns = row["samples_ns"][0]
        tokens = p["steps"] if p["phase"] == "decode" else p["prompt"]
        ms = ns / 1e6 / tokens if p["phase"] == "decode" else ns / 1e6
        return ms, row

    def handle(op, req):
        if op == "hello":
            build = req.get("options", {}).get("build", "native")
            path = os.path.normpath(os.path.join(root, f"build-{build}", "bin", "llama-bench"))
            if not os.access(path, os.X_OK):
                raise peerio.Unavailable(f"llama-bench (build {build}) is not at {path}")
            state["bin"] = path
            try:
                with open(os.path.join(root, "VERSION")) as f:
                    source = f.read().strip()
            except OSError:
                source = "llama.cpp (unknown source)"
            return {"version": f"{source}, build {build}"}
        if op == "load":
            p = req["point"]
            model = req["inputs"]
            if not (model.endswith(".gguf") and os.path.isfile(model)):
                raise peerio.Unsupported("llama-bench runs GGUF files only")
            if p.get("batch", 1) != 1:
                raise peerio.Unsupported("llama-bench decodes one sequence")
            if req.get("device", "cpu") != "cpu":
                raise peerio.Unsupported("this llama.cpp build runs on the CPU")
            state.update(point=p, model=model, threads=int(req.get("threads", 1)))
            return {}
        if op == "run":
            raise peerio.Unsupported("llama-bench returns no output to check")
        if op == "time":
            times, speeds = [], []
            for _ in range(int(req.get("reps", 1))):
                ms, row = bench()
                times.append(ms)
                speeds.append(row["avg_ts"])
            return {"times_ms": times, "tokens_per_s": speeds}
        raise ValueError(f"unknown op {op!r}")

    peerio.serve(handle)


if __name__ == "__main__":
    main()
