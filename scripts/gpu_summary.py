"""The short table gpu-check.sh prints last: device ceilings, check failures, paged decode
as % of the copy bandwidth, our kernels against the torch_sdpa / torch_linear peers of the
same runs (same points, alternating rounds), int4 GEMV against f16, the MoE grouped expert
GEMMs."""
import csv
import glob
import json
import os
import sys

res = sys.argv[1]


def rows(pattern):
    out = []
    for path in sorted(glob.glob(os.path.join(res, pattern))):
        with open(path) as f:
            out += list(csv.DictReader(f))
    return out


for path in glob.glob(os.path.join(res, "roofline", "cuda-*.json")):
    r = json.load(open(path))
    print(f"{r['cpu_model']}: copy {r['read_gbps']:.0f} GB/s, bf16 GEMM {r['fma_gflops'] / 1e3:.0f} TFLOP/s")
check = rows("check/*.csv")
bad = [r for r in check if r["status"] == "fail"]
print(f"check: {len(check)} rows, {sum(r['status'] == 'pass' for r in check)} pass, {len(bad)} FAIL, "
      f"{sum(r['status'] == 'unsupported' for r in check)} unsupported")
for r in bad[:10]:
    print(f"  FAIL {r['family']} {r['variant']} {r['dtype']} {r['shape']}: rel {r['rel_l2_err']} {r['note']}")
fvp = rows("flash_vs_paged/*.csv")
print("\nmode     variant                       batch kv_len   ms       GB/s   %roof status")
for r in fvp:
    ms = float(r["median_ms"]) if r["median_ms"] else float("nan")
    gb = float(r["gbps"]) if r["gbps"] else float("nan")
    pct = float(r["pct_roofline"]) if r["pct_roofline"] else float("nan")
    print(f"{r['mode']:<8} {r['variant']:<29} {r['batch']:>5} {r['kv_len']:>6} {ms:8.3f} {gb:8.0f} {pct:6.1f} {r['status']}")
key = lambda r: (r["mode"], r["dtype"], r["batch"], r["q_heads"], r["kv_heads"], r["q_len"], r["kv_len"])
sdpa = {key(r): float(r["median_ms"]) for r in fvp if r["variant"] == "torch_sdpa" and r["status"] == "ok"}
if sdpa:
    print("\nours vs torch SDPA on cuda:0, same points (time ratio sdpa/ours, 1 = parity)")
    for r in fvp:
        if r["variant"] != "torch_sdpa" and r["status"] == "ok" and key(r) in sdpa:
            ms = float(r["median_ms"])
            print(f"  {r['mode']:<8} {r['variant']:<29} b{r['batch']} kv{r['kv_len']}: ours {ms:.3f} ms, sdpa {sdpa[key(r)]:.3f} ms -> {sdpa[key(r)] / ms:.2f}x")
q = rows("quant_tradeoff/*.csv")
print("\nGEMV     shape       batch   ms      GB/s  %copy  x f16  status")
for r in q:
    f = lambda k: float(r[k]) if r[k] else float("nan")
    print(f"{r['format']:<8} {r['shape']:<11} {r['batch']:>5} {f('median_ms'):7.4f} {f('gbps'):7.0f} {f('pct_read_bw'):6.1f} {f('speedup_vs_f16'):6.2f} {r['status']}")
moe = rows("moe_capacity/*.csv")
print("\nMoE experts     routing        experts k  dtype  ms      GFLOP/s  status")
for r in moe:
    f = lambda k: float(r[k]) if r[k] else float("nan")
    print(f"{r['variant']:<15} {r['routing']:<14} {r['experts']:>7} {r['top_k'] or '-':>2} {r['dtype']:<6} {f('median_ms'):7.4f} {f('gflops'):8.0f} {r['status']}")
