#!/usr/bin/env python3
"""Peer llamacpp for the workbench harness (protocol: harness/src/peer.rs; the decode
family's points: harness/src/families/decode/peers.rs).

Runs llama.cpp's llama-bench and llama-batched-bench (built by scripts/fetch-peers.sh under
target/peers/llama.cpp/build-<build>/bin, or WORKBENCH_LLAMACPP_DIR/build-<build>/bin) on the
point's GGUF file with the harness's threads, one repetition per timed call (after the tool's
own warm-up):
  decode, batch 1: llama-bench -r 1 -p 0 -n STEPS -d CONTEXT
                   -> ms per generated token (STEPS tokens after a CONTEXT-token prompt);
  decode, batch B: llama-batched-bench -npp CONTEXT -ntg STEPS -npl B -c B*(CONTEXT+STEPS)
                   -> ms per step of B tokens (t_tg / STEPS: B sequences, each its own
                   CONTEXT-token prompt, then STEPS steps that decode one token of every
                   sequence; S_TG = B / that);
  prefill:         llama-bench -r 1 -p N -n 0 -> ms for the N-token prompt;
  verify:          llama-bench -r 1 -p K -n 0 -d CONTEXT -> ms for a K-token step of one
                   sequence after a CONTEXT-token prompt (a verification pass; K = 1 is its
                   1-token step, so the cost in steps is the ratio of the two).
Both run llama.cpp's defaults otherwise (flash attention auto, its repacked CPU weights where
the format has them), its best path on the machine.
llama.cpp returns no tensors; `run` with {"check": {"prompt": TEXT, "tokens": N}} answers
llama-simple's greedy continuation of TEXT ({"text": its stdout, "decoded": tokens}), which
the harness scores with its own model before it reports llama.cpp's times
(harness/src/families/decode/peer_check.rs).
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "_lib"))
import peerio  # noqa: E402


def main():
    root = os.environ.get("WORKBENCH_LLAMACPP_DIR") or os.path.join(HERE, "..", "..", "..", "target", "peers", "llama.cpp")
    state = {}

    def batched():
        p = state["point"]
        b, pp, tg = int(p["batch"]), int(p["context"]), int(p["steps"])
        args = [state["batched"], "-m", state["model"], "-t", str(state["threads"]), "-tb", str(state["threads"]),
                "-npp", str(pp), "-ntg", str(tg), "-npl", str(b), "-c", str(b * (pp + tg)),
                "--output-format", "jsonl"]
        out = subprocess.run(args, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            raise RuntimeError(f"llama-batched-bench exited {out.returncode}: {tail}")
        rows = [json.loads(l) for l in (out.stdout + "\n" + out.stderr).splitlines() if l.startswith("{")]
        rows = [r for r in rows if r.get("pl") == b and r.get("tg") == tg]
        if not rows:
            raise RuntimeError(f"llama-batched-bench printed no row for B={b}")
        ms = rows[-1]["t_tg"] * 1e3 / tg
        return ms, {"avg_ts": rows[-1]["speed_tg"]}

    def bench():
        p = state["point"]
        if p["phase"] == "decode" and p.get("batch", 1) != 1:
            return batched()
        args = [state["bin"], "-m", state["model"], "-t", str(state["threads"]), "-r", "1", "-o", "json"]
        if p["phase"] == "decode":
            args += ["-p", "0", "-n", str(p["steps"]), "-d", str(p["context"])]
        elif p["phase"] == "verify":
            args += ["-p", str(p["tokens"]), "-n", "0", "-d", str(p["context"])]
        else:
            args += ["-p", str(p["prompt"]), "-n", "0"]
        out = subprocess.run(args, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            raise RuntimeError(f"llama-bench exited {out.returncode}: {tail}")
        row = json.loads(out.stdout)[0]
        ns = row["samples_ns"][0]
        # Decode: per generated token; prefill and verify: the whole step.
        ms = ns / 1e6 / p["steps"] if p["phase"] == "decode" else ns / 1e6
        return ms, row

    def greedy(check):
        """llama-simple's greedy continuation of the check's prompt: its whole stdout (the
        prompt's pieces, then the generated ones) and how many tokens it decoded."""
        simple = os.path.join(os.path.dirname(state["bin"]), "llama-simple")
        if not os.access(simple, os.X_OK):
            raise peerio.Unsupported(f"llama-simple (its greedy tokens, to check) is not at {simple}")
        if "prompt" not in check or "tokens" not in check:
            raise ValueError("run: the request names no check prompt and tokens")
        args = [simple, "-m", state["model"], "-n", str(int(check["tokens"])), check["prompt"]]
        out = subprocess.run(args, capture_output=True)
        if out.returncode != 0:
            tail = (out.stderr.decode(errors="replace").strip().splitlines() or ["(nothing on stderr)"])[-1]
            raise RuntimeError(f"llama-simple exited {out.returncode}: {tail}")
        m = re.search(r"decoded (\d+) tokens", out.stderr.decode(errors="replace"))
        if not m:
            raise RuntimeError("llama-simple printed no 'decoded N tokens' line")
        return {"text": out.stdout.decode("utf-8", errors="replace"), "decoded": int(m.group(1))}

    def handle(op, req):
        if op == "hello":
            build = req.get("options", {}).get("build", "native")
            path = os.path.normpath(os.path.join(root, f"build-{build}", "bin", "llama-bench"))
            if not os.access(path, os.X_OK):
                raise peerio.Unavailable(f"llama-bench (build {build}) is not at {path}")
            state["bin"] = path
            state["batched"] = os.path.join(os.path.dirname(path), "llama-batched-bench")
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
            if p.get("batch", 1) != 1 and not os.access(state["batched"], os.X_OK):
                raise peerio.Unsupported(f"batch > 1 needs llama-batched-bench, not at {state['batched']}")
            if req.get("device", "cpu") != "cpu":
                raise peerio.Unsupported("this llama.cpp build runs on the CPU")
            state.update(point=p, model=model, threads=int(req.get("threads", 1)))
            return {}
        if op == "run":
            return greedy(req.get("check") or {})
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
