#!/usr/bin/env python3
"""flash2 causal prefill (`harness exp speed_bars`, its prefill point) beside PyTorch's CPU
scaled_dot_product_attention on the same shape (batch 1, 32 query / 8 KV heads, 2048 tokens,
head_dim 128, f32, causal, 2 threads), per ISA tier: each round one harness run per tier,
`harness --isa T exp speed_bars --variant flash2 --peer torch_sdpa:cpu_capability=T'`, so
both sides are checked and timed the same way in one run — SDPA's output against the same
f64 reference as ours (status ok), both timed after that untimed checking call with the
host's caches evicted before every timed call, the same number of repetitions — and torch
runs its own dispatch at the tier (T' = avx512 / avx2 / default, ATEN_CPU_CAPABILITY, set by
the peer). Also times paged decode (batch 8 × 4096, the speed_bars decode point) at each
tier, as GB/s against the run's measured read bandwidth. Needs the peers
(scripts/fetch-peers.sh: target/peers/venv with torch):

  python3 scripts/flash2_vs_sdpa_cpu.py --rounds 5

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


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    return out.stdout


def harness_exp(harness, isa, results, sets, variant, reps, peer=None):
    """One harness run: our `variant`'s row (and `peer`'s, if named) and the provenance."""
    args = [harness, "--isa", isa, "--results-dir", results, "exp", "speed_bars", "--threads", "2",
            "--variant", variant, "--reps", str(reps)] + [a for s in sets for a in ("--set", s)]
    args += ["--peer", peer] if peer else ["--no-peers"]
    run(args)
    newest = max(glob.glob(os.path.join(results, "speed_bars", "*.csv")), key=os.path.getmtime)
    rows = {r["variant"]: r for r in csv.DictReader(open(newest))}
    prov = json.load(open(newest[:-4] + ".json"))
    for name, r in rows.items():
        if r["status"] != "ok":
            sys.exit(f"error: {name} at {isa}: status {r['status']} {r['note']}")
    return rows, prov


def git(*a):
    return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()


def dirty():
    """Whether the checkout has changes, as the harness judges it (harness/src/machine.rs): the
    roofline files its runs rewrite under results/ (a cache of the best values seen) do not
    count."""
    out = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True).stdout
    def cache(p):
        return p.startswith("results/") and p.endswith(".json") and os.path.basename(os.path.dirname(p)) == "roofline"
    return any(not cache(line[3:]) for line in out.splitlines() if line.strip())


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
            peer = f"torch_sdpa:cpu_capability={TORCH_CAP[isa]}"
            rows, _ = harness_exp(a.harness, isa, scratch, ["mode=prefill", "batch=1", "kv_len=2048"],
                                  "flash2", a.reps, peer)
            ours = next(r for name, r in rows.items() if name.startswith("flash2"))
            torch_info[isa] = rows[peer]["peer_version"]
            samples.setdefault(f"{isa}|sdpa", []).append(float(rows[peer]["median_ms"]) / 1e3)
            samples.setdefault(f"{isa}|flash2", []).append(float(ours["median_ms"]) / 1e3)
            rows, prov = harness_exp(a.harness, isa, scratch, ["mode=decode", "batch=8", "kv_len=4096"],
                                     "paged:bs=16", a.reps)
            row = next(iter(rows.values()))
            decode.setdefault(isa, []).append(float(row["gbps"]))
            read.setdefault(isa, []).append(prov["roofline"]["read_gbps"])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    out = {
        "run_id": run_id,
        "experiment": "flash2_vs_sdpa_cpu",
        "command_line": " ".join(sys.argv),
        "git_sha": git("rev-parse", "HEAD"),
        # As the harness judges it: the roofline caches its runs rewrite do not count.
        "git_dirty": dirty(),
        "cpu_model": cpu,
        "threads": 2,
        "torch": torch_info,
        "prefill_shape": "batch 1, 32/8 heads, 2048 tokens, d 128, f32, causal",
        "decode_shape": "batch 8, 32/8 heads, 4096-token contexts, d 128, f32, paged:bs=16",
        "prefill_seconds": samples,
        "decode_gbps": decode,
        "read_gbps_at_each_run_start": read,
        # This run's harness runs only (the folder keeps earlier runs' too).
        "harness_runs": sorted(os.path.basename(f) for f in glob.glob(os.path.join(scratch, "speed_bars", "*.csv"))
                               if os.path.basename(f) >= run_id),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    d = os.path.join(a.results_dir, "flash2_vs_sdpa_cpu")
    with open(os.path.join(d, run_id + ".json"), "w") as f:
        json.dump(out, f, indent=1)
    md = [f"# flash2_vs_sdpa_cpu {run_id}\n",
          f"**Machine.** {cpu}, 2 threads; git {out['git_sha']}{' (dirty)' if out['git_dirty'] else ''}; torch {torch_info}.\n",
          f"Rounds ({a.rounds}) of one harness run per tier, flash2 and SDPA (torch_sdpa peer, output "
          f"checked against the f64 reference) in the same run, each a median of {a.reps} calls, "
          "caches evicted before each.\n",
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
