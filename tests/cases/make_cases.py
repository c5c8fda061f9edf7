"""Writes the PyTorch case files replayed by `harness replay` in harness/tests/replay.rs.

Third-party producer: PyTorch's scaled_dot_product_attention (CPU). Run once with torch,
numpy and safetensors installed:

    python make_cases.py

- sdpa_gqa_causal.safetensors: attention, batch 2, 8 query heads over 2 KV heads (GQA),
  54 tokens, head_dim 64, causal (PyTorch's is_causal aligns the mask top-left; with
  Lq == Lk that is the usual causal mask), f32. `out` is SDPA's output.
- sdpa_gqa_causal_bf16.safetensors: the same tensors rounded to bf16, out from SDPA in bf16.
- paged_decode_sdpa.safetensors: paged, 3 sequences of 54/97/150 tokens in a shuffled pool of
  16-token blocks (vLLM's tensor names), q of one new token per sequence; `out` is SDPA over
  each sequence's gathered K/V.
- moe_mixtral_top2.safetensors: moe, 33 tokens through a Mixtral-style layer (8 SwiGLU
  experts, softmax router, top-2 renormalised, dropless) written in plain PyTorch; `out` is
  its output.
"""
import math
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(20261130)
gen = f"torch {torch.__version__} scaled_dot_product_attention"

# Attention: GQA + causal.
B, HQ, HKV, L, D = 2, 8, 2, 54, 64
q = torch.randn(B, HQ, L, D)
k = torch.randn(B, HKV, L, D)
v = torch.randn(B, HKV, L, D)
out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
meta = {"family": "attention", "causal": "true", "scale": repr(1 / math.sqrt(D)), "generator": gen}
save_file({"q": q, "k": k, "v": v, "out": out.contiguous()}, "sdpa_gqa_causal.safetensors", metadata=meta)
qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
outb = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
save_file({"q": qb, "k": kb, "v": vb, "out": outb.contiguous()}, "sdpa_gqa_causal_bf16.safetensors", metadata=meta)

# Paged decode: vLLM names and layout [blocks, kv_heads, block_size, head_dim].
HQ, HKV, D, BS = 8, 2, 64, 16
lens = [54, 97, 150]
need = [(n + BS - 1) // BS for n in lens]
blocks = sum(need) + 3                       # spare blocks stay NaN: must never be read
perm = torch.randperm(blocks)
k_cache = torch.full((blocks, HKV, BS, D), float("nan"))
v_cache = torch.full((blocks, HKV, BS, D), float("nan"))
tables = torch.full((len(lens), max(need)), -1, dtype=torch.int32)
qd = torch.randn(len(lens), HQ, D)
outs, at = [], 0
for s, n in enumerate(lens):
    ids = perm[at:at + need[s]]
    at += need[s]
    tables[s, :need[s]] = ids.int()
    kk, vv = torch.randn(HKV, n, D), torch.randn(HKV, n, D)
    for j, b in enumerate(ids.tolist()):
        t0, t1 = j * BS, min(n, (j + 1) * BS)
        k_cache[b, :, : t1 - t0] = kk[:, t0:t1]
        v_cache[b, :, : t1 - t0] = vv[:, t0:t1]
    o = F.scaled_dot_product_attention(qd[s][None, :, None], kk[None], vv[None], enable_gqa=True)
    outs.append(o[0, :, 0])
save_file(
    {"q": qd, "k_cache": k_cache, "v_cache": v_cache, "block_tables": tables,
     "context_lens": torch.tensor(lens, dtype=torch.int32), "out": torch.stack(outs)},
    "paged_decode_sdpa.safetensors",
    metadata={"family": "paged", "generator": gen},
)
print("wrote 3 attention/paged cases")

# MoE: a Mixtral-style layer in plain PyTorch (softmax router, top-2, renormalised weights,
# SwiGLU experts, dropless), weights stored the workbench's way: router [D, E] (= gate.weight.T),
# w_gate / w_up [E, D, F] (= w1 / w3 .weight.T per expert), w_down [E, F, D] (= w2.weight.T).
T, D, F_, E, K = 33, 24, 40, 8, 2
x = torch.randn(T, D)
router = torch.randn(D, E) / math.sqrt(D)
w_gate = torch.randn(E, D, F_) / math.sqrt(D)
w_up = torch.randn(E, D, F_) / math.sqrt(D)
w_down = torch.randn(E, F_, D) / math.sqrt(F_)
probs = torch.softmax(x @ router, dim=-1)
top_p, top_i = probs.topk(K, dim=-1)
top_p = top_p / top_p.sum(-1, keepdim=True)
y = torch.zeros(T, D)
for t in range(T):
    for j in range(K):
        e = int(top_i[t, j])
        h = F.silu(x[t] @ w_gate[e]) * (x[t] @ w_up[e])
        y[t] += top_p[t, j] * (h @ w_down[e])
save_file(
    {"x": x, "router": router, "w_gate": w_gate, "w_up": w_up, "w_down": w_down, "out": y},
    "moe_mixtral_top2.safetensors",
    metadata={"family": "moe", "top_k": "2", "capacity": "dropless", "norm": "renormalize",
              "generator": f"torch {torch.__version__} (Mixtral-style top-2 SwiGLU MoE)"},
)
print("wrote the moe case")
