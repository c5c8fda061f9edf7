#!/usr/bin/env python3
"""Decode (tg128) and prefill (pp512) of one GGUF model: `harness generate` beside llama.cpp's
`llama-bench`, same file, same threads, in alternating rounds so host noise hits both sides.

Writes results/decode_vs_llamacpp/<run-id>.json (every sample, both programs' versions, the
machine, the commit and whether it was dirty) and <run-id>.md (ranges, medians, per-round
ratios). Until the peers protocol exists (issue 15) this is how the speed targets of the ISA
issue are measured; llama-bench is built by hand (see README, "CPU instruction sets").

  scripts/decode_vs_llamacpp.py --llama-bench avx512=/path/build-native/bin/llama-bench \\
      --llama-bench avx2=/path/build-avx2/bin/llama-bench --rounds 5

Each --llama-bench ISA[/LABEL]=PATH pairs a llama.cpp build with the --isa our side runs at
(build llama.cpp for avx2 with -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_AVX512=OFF, so both sides use the same instructions); several builds may share an ISA
(e.g. avx512/native=... and avx512/noamx=...). A llama-bench test that crashes is recorded as
such (a native build's AMX prompt kernels die with SIGILL where the VM does not grant AMX).
"""

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    return out.stdout


def source_version(llama_bench_path):
    """The llama.cpp release a build came from: scripts/fetch-peers.sh writes it to VERSION beside
    the build-* folders (llama-bench's own build_commit/build_number come from whatever git
    repository encloses the source, which before the fix in fetch-peers.sh was this one)."""
    at = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(llama_bench_path)))), "VERSION")
    try:
        return open(at).read().strip()
    except OSError:
        return "release unknown"


def llama_bench(path, model, threads, test):
    """(tokens/s, its JSON row), or (None, the failure) when llama-bench dies."""
    args = [path, "-m", model, "-t", str(threads), "-r", "1", "-o", "json"]
    args += ["-p", "0", "-n", "128"] if test == "tg128" else ["-p", "512", "-n", "0"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        return None, {"failed": f"exit {out.returncode}", "stderr_tail": out.stderr.strip()[-300:]}
    rows = json.loads(out.stdout)
    return rows[0]["avg_ts"], rows[0]


def ours(harness, model, threads, isa, matmul, test, prompt_ids):
    args = [harness, "--isa", isa, "generate", "--model", model, "--threads", str(threads),
            "--matmul", matmul, "--format", "json", "--ignore-eos"]
    if test == "tg128":
        args += ["--prompt", "The capital of France is", "--max-new-tokens", "128"]
        v = json.loads(run(args))
        return 1e3 / v["tpot_ms"], v
    args += ["--prompt-ids", ",".join(map(str, prompt_ids)), "--max-new-tokens", "1"]
    v = json.loads(run(args))
    return len(prompt_ids) / (v["ttft_ms"] / 1e3), v


def git(*a):
    try:
        return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--harness", default=os.path.join(ROOT, "target/release/harness"))
    p.add_argument("--llama-bench", action="append", required=True, metavar="ISA=PATH")
    p.add_argument("--matmul", default="packed,fused:act=q8,fused")
    p.add_argument("--tests", default="tg128,pp512")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"))
    a = p.parse_args()
    builds = {}
    for x in a.llama_bench:
        key, _, path = x.partition("=")
        isa, _, label = key.partition("/")
        if isa not in ("avx512", "avx2", "portable") or not os.access(path, os.X_OK):
            sys.exit(f"error: --llama-bench {x}: want avx512|avx2|portable[/LABEL]=<executable>")
        builds.setdefault(isa, {})[label or isa] = path
    for f in (a.model, a.harness):
        if not os.path.exists(f):
            sys.exit(f"error: {f} does not exist")
    matmuls = a.matmul.split(",")
    tests = a.tests.split(",")
    rng = random.Random(512)
    prompt_ids = [rng.randrange(1000, 40000) for _ in range(512)]
    started = datetime.datetime.now(datetime.timezone.utc)
    run_id = started.strftime("%Y%m%dT%H%M%SZ")
    samples = {}
    versions = {}
    failures = {}
    for r in range(a.rounds):
        for isa, labelled in builds.items():
            for test in tests:
                for label, path in labelled.items():
                    ts, row = llama_bench(path, a.model, a.threads, test)
                    if ts is None:
                        failures[f"{label}|{test}"] = row
                        continue
                    samples.setdefault(f"{isa}|{test}|llama.cpp {label}", []).append(ts)
                    versions[label] = {k: row.get(k) for k in ("build_commit", "build_number", "cpu_info", "backends")}
                    versions[label]["source"] = source_version(path)
                for m in matmuls:
                    ts, _ = ours(a.harness, a.model, a.threads, isa, m, test, prompt_ids)
                    samples.setdefault(f"{isa}|{test}|{m}", []).append(ts)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
    flags = set(next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), []))
    widest = ("avx512" if {"avx512f", "avx512bw", "avx512vl"} <= flags
              else "avx2" if {"avx2", "fma", "f16c"} <= flags else "portable")
    prov = {
        "run_id": run_id,
        "experiment": "decode_vs_llamacpp",
        "command_line": " ".join(sys.argv),
        "git_sha": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "cpu_model": cpu,
        "isa_detected": widest,
        "isa": ",".join(builds),
        "logical_cores": os.cpu_count(),
        "threads": a.threads,
        "model": os.path.basename(a.model),
        "llama_cpp": versions,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": "alternating rounds: per round and ISA, llama-bench (-r 1) then each --matmul of "
                  "harness generate; tg128 = 1000 / tpot_ms over 128 tokens after a 5-token prompt "
                  "(llama-bench: 128 tokens from an empty cache); pp512 = 512 / ttft of a 512-token "
                  "prompt (seeded ids) with one generated token",
        "llama_bench_failures": failures,
        "samples_tokens_per_s": samples,
    }
    out_dir = os.path.join(a.results_dir, "decode_vs_llamacpp")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, run_id + ".json"), "w") as f:
        json.dump(prov, f, indent=1)
    builds_txt = ", ".join(f"{k}: {v['source']}, build {v['build_number']} ({v['build_commit']})" for k, v in versions.items())
    md = [f"# decode_vs_llamacpp {run_id}\n",
          f"**Machine.** {cpu}, {a.threads} threads; git {prov['git_sha']}{' (dirty)' if prov['git_dirty'] else ''}; "
          f"llama.cpp {builds_txt}.\n",
          f"**Method.** {prov['method']}; {a.rounds} rounds.\n",
          "| ISA | test | program | tokens/s (min–max) | median | ratio per round (min–max, median) |",
          "|---|---|---|---|---|---|"]
    for isa, labelled in builds.items():
        for test in tests:
            for m in matmuls:
                v = samples[f"{isa}|{test}|{m}"]
                md.append(f"| {isa} | {test} | harness `--matmul {m}` | {min(v):.1f}–{max(v):.1f} | "
                          f"{statistics.median(v):.1f} | |")
            for label in labelled:
                base = samples.get(f"{isa}|{test}|llama.cpp {label}")
                if not base:
                    fail = failures.get(f"{label}|{test}", {}).get("failed", "no sample")
                    md.append(f"| {isa} | {test} | llama.cpp {label} | failed ({fail}) | | |")
                    continue
                md.append(f"| {isa} | {test} | llama.cpp {label} | {min(base):.1f}–{max(base):.1f} | {statistics.median(base):.1f} | |")
                for m in matmuls:
                    v = samples[f"{isa}|{test}|{m}"]
                    ratio = [x / y for x, y in zip(v, base)]
                    md.append(f"| {isa} | {test} | harness `--matmul {m}` ÷ llama.cpp {label} | | | "
                              f"{min(ratio):.2f}–{max(ratio):.2f}, median {statistics.median(ratio):.2f} |")
    with open(os.path.join(out_dir, run_id + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"-> {os.path.join(out_dir, run_id)}.{{json,md}}", file=sys.stderr)


if __name__ == "__main__":
    main()
