"""Writes the sliding-window / soft-cap attention case replayed by `harness replay` in
harness/tests/replay.rs.

Third-party producer: Hugging Face transformers — the mask from masking_utils'
`sliding_window_causal_mask_function` through `sdpa_mask` (the mask Mistral and Gemma-3's
local layers use), and the attention from Gemma-2's `eager_attention_forward` (scores scaled,
soft-capped as cap·tanh(s/cap), masked, softmax in f32). Run once with torch, transformers
and safetensors installed:

    python make_window_cases.py

- hf_sliding_window_softcap.safetensors: attention, batch 2, 8 query heads over 2 KV heads
  (GQA), 12 new tokens appended to a 40-token context (queries at positions 28..39), head_dim
  64, sliding window 7, soft-cap 2.0, f32. `out` is transformers' output, [B, Hq, Lq, D].
"""
import math
from types import SimpleNamespace

import torch
import transformers
from safetensors.torch import save_file
from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

torch.manual_seed(20261201)
B, HQ, HKV, LQ, LK, D, W, CAP = 2, 8, 2, 12, 40, 64, 7, 2.0
q = torch.randn(B, HQ, LQ, D)
k = torch.randn(B, HKV, LK, D)
v = torch.randn(B, HKV, LK, D)
# Boolean [B, 1, LQ, LK], True = attend; the queries are the last LQ positions.
allowed = sdpa_mask(
    batch_size=B,
    q_length=LQ,
    kv_length=LK,
    q_offset=LK - LQ,
    mask_function=sliding_window_causal_mask_function(W),
    allow_is_causal_skip=False,
)
bias = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
module = SimpleNamespace(num_key_value_groups=HQ // HKV, training=False, head_dim=D)
out, _ = eager_attention_forward(module, q, k, v, bias, scaling=1 / math.sqrt(D), softcap=CAP)
out = out.transpose(1, 2).contiguous()  # [B, LQ, HQ, D] -> [B, HQ, LQ, D]
meta = {
    "family": "attention",
    "causal": "true",
    "scale": repr(1 / math.sqrt(D)),
    "window": str(W),
    "softcap": repr(CAP),
    "generator": f"transformers {transformers.__version__} masking_utils sliding_window_causal_mask_function + gemma2 eager_attention_forward (torch {torch.__version__})",
}
save_file({"q": q, "k": k, "v": v, "out": out}, "hf_sliding_window_softcap.safetensors", metadata=meta)
print("wrote hf_sliding_window_softcap.safetensors; rows of position 39 see", allowed[0, 0, -1].nonzero().flatten().tolist())
