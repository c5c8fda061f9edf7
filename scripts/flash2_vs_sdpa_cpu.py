#!/usr/bin/env python3
"""flash2 causal prefill (`harness exp speed_bars`, its prefill point) beside PyTorch's CPU
scaled_dot_product_attention on the same shape (batch 1, 32 query / 8 KV heads, 2048 tokens,
head_dim 128, f32, causal, 2 threads), in alternating rounds, per ISA tier: our side runs
`harness --isa T`, torch runs with ATEN_CPU_CAPABILITY=T (its own dispatch: avx512 / avx2 /
default). Also times paged decode (batch 8 × 4096, the speed_bars decode point) at each tier,
as GB/s against the run's measured read bandwidth. Run it with a Python that has torch:

  /path/to/venv/bin/python scripts/flash2_vs_sdpa_cpu.py --rounds 5

Writes results/flash2_vs_sdpa_cpu/<run-id>.{json,md}.
"""

import argparse
import csv
import datetime
import glob
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_CAP = {"avx512": "avx512", "avx2": "avx2", "portable": "default"}

SDPA = r"""
import json, sys, time, torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]))
reps = int(sys.argv[2])
torch.manual_seed(0)
q = torch.randn(1, 32, 2048, 128)
k = torch.randn(1, 8, 2048, 128)
v = torch.randn(1, 8, 2048, 128)
run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
for _ in range(2):
    run()
t = []
for _ in range(reps):
    a = time.perf_counter(); run(); t.append(time.perf_counter() - a)
t.sort()
print(json.dumps({"median_s": t[len(t) // 2], "min_s": t[0], "torch": torch.__version__,
                  "cpu_capability": torch.backends.cpu.get_cpu_capability()}))
"""


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    return out.stdout


def harness_exp(harness, isa, results, sets, variant, reps):
    args = [harness, "--isa", isa, "--results-dir", results, "exp", "speed_bars", "--threads", "2",
            "--variant", variant, "--reps", str(reps)] + [a for s in sets for a in ("--set", s)]
    run(args)
    newest = max(glob.glob(os.path.join(results, "speed_bars", "*.csv")), key=os.path.getmtime)
    rows = list(csv.DictReader(open(newest)))
    prov = json.load(open(newest[:-4] + ".json"))
    r = rows[0]
    if r["status"] != "ok":
        sys.exit(f"error: {variant} at {isa}: status {r['status']} {r['note']}")
    return float(r["median_ms"]) / 1e3, r, prov


def git(*a):
    return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--harness", default=os.path.join(ROOT, "target/release/harness"))
    p.add_argument("--isa", default="avx512,avx2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"))
    a = p.parse_args()
    scratch = os.path.join(a.results_dir, "flash2_vs_sdpa_cpu", "runs")
    os.makedirs(scratch, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    run_id = started.strftime("%Y%m%dT%H%M%SZ")
    flops = 34376515584  # causal 2048² × 32 heads × d 128: the speed_bars cost model
    samples, torch_info, decode, read = {}, {}, {}, {}
    for r in range(a.rounds):
        for isa in a.isa.split(","):
            env = dict(os.environ, ATEN_CPU_CAPABILITY=TORCH_CAP[isa], OMP_NUM_THREADS="2")
            t = json.loads(run([sys.executable, "-c", SDPA, "2", str(a.reps)], env=env))
            torch_info[isa] = {k: t[k] for k in ("torch", "cpu_capability")}
            samples.setdefault(f"{isa}|sdpa", []).append(t["median_s"])
            s, row, prov = harness_exp(a.harness, isa, scratch,
                                       ["mode=prefill", "batch=1", "kv_len=2048"], "flash2", a.reps)
            samples.setdefault(f"{isa}|flash2", []).append(s)
            s, row, prov = harness_exp(a.harness, isa, scratch,
                                       ["mode=decode", "batch=8", "kv_len=4096"], "paged:bs=16", a.reps)
            decode.setdefault(isa, []).append(float(row["gbps"]))
            read.setdefault(isa, []).append(prov["roofline"]["read_gbps"])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    out = {
        "run_id": run_id,
        "experiment": "flash2_vs_sdpa_cpu",
        "command_line": " ".join(sys.argv),
        "git_sha": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "cpu_model": cpu,
        "threads": 2,
        "torch": torch_info,
        "prefill_shape": "batch 1, 32/8 heads, 2048 tokens, d 128, f32, causal",
        "decode_shape": "batch 8, 32/8 heads, 4096-token contexts, d 128, f32, paged:bs=16",
        "prefill_seconds": samples,
        "decode_gbps": decode,
        "read_gbps_at_each_run_start": read,
        "harness_runs": sorted(os.path.basename(f) for f in glob.glob(os.path.join(scratch, "speed_bars", "*.csv"))),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    d = os.path.join(a.results_dir, "flash2_vs_sdpa_cpu")
    with open(os.path.join(d, run_id + ".json"), "w") as f:
        json.dump(out, f, indent=1)
    md = [f"# flash2_vs_sdpa_cpu {run_id}\n",
          f"**Machine.** {cpu}, 2 threads; git {out['git_sha']}{' (dirty)' if out['git_dirty'] else ''}; torch {torch_info}.\n",
          f"Alternating rounds ({a.rounds}), each a median of {a.reps} calls after warm-up.\n",
          "| ISA | case | ours | peer | ratio per round (min–max, median) |", "|---|---|---|---|---|"]
    for isa in a.isa.split(","):
        f2, sd = samples[f"{isa}|flash2"], samples[f"{isa}|sdpa"]
        ratio = [y / x for x, y in zip(f2, sd)]
        md.append(f"| {isa} | prefill 2048 | flash2 {min(f2)*1e3:.0f}–{max(f2)*1e3:.0f} ms ({flops/statistics.median(f2)/1e9:.0f} GFLOP/s) | "
                  f"SDPA {min(sd)*1e3:.0f}–{max(sd)*1e3:.0f} ms | × SDPA {min(ratio):.2f}–{max(ratio):.2f}, median {statistics.median(ratio):.2f} |")
        pct = [g / r * 100 for g, r in zip(decode[isa], read[isa])]
        md.append(f"| {isa} | paged decode 8 × 4096 | {min(decode[isa]):.1f}–{max(decode[isa]):.1f} GB/s | read bandwidth "
                  f"{min(read[isa]):.1f}–{max(read[isa]):.1f} GB/s | {min(pct):.0f}–{max(pct):.0f}% of it, median {statistics.median(pct):.0f}% |")
    with open(os.path.join(d, run_id + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
