"""PyTorch's scaled_dot_product_attention on the prefill shapes gpu-check.sh gives
cuda_flash2 (batch 1, 32 query heads over 8 KV heads, head_dim 128, causal, bf16, random
normal inputs): CUDA events, 5 warm-ups, median of 20. Writes one CSV row per kv_len."""
import csv
import sys

import torch
import torch.nn.functional as F

out = sys.argv[1] if len(sys.argv) > 1 else "sdpa.csv"
rows = []
torch.manual_seed(0)
for kv_len in (1024, 4096, 8192):
    q = torch.randn(1, 32, kv_len, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, kv_len, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 8, kv_len, 128, device="cuda", dtype=torch.bfloat16)
    run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    ms = times[len(times) // 2]
    rows.append({"kv_len": kv_len, "median_ms": ms, "torch": torch.__version__})
    print(f"sdpa bf16 causal b1 h32/8 d128 L={kv_len}: {ms:.3f} ms")
with open(out, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
