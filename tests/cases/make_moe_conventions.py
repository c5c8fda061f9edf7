"""Writes the MoE routing-convention cases replayed by harness/tests/replay.rs: one small top-2
(or top-1, or expert-choice) layer per convention, each written by a plain PyTorch port of
the system's own gating code, with `out` from that port. Run with torch installed (numpy is
not needed; the safetensors files are written by hand, the format is 20 lines):

    python make_moe_conventions.py

Every case: 64 tokens, d_model 16, SwiGLU experts of width 24, 4 experts, softmax router with
a bias favouring expert 0 (so capacity drops), weights stored the workbench's way (router
[D, E] = gate.weight.T, w_gate / w_up [E, D, F] = w1 / w3 .weight.T, w_down [E, F, D] =
w2.weight.T). Each port routes with float32 probabilities; the script checks that float64
probabilities make the same decisions with a margin, so no near-tie decides a case.

- moe_deepspeed_top2.safetensors: DeepSpeed-MoE `top2gating` (sharded_moe.py) with
  top2_2nd_expert_sampling off: rank-major slots (`locations2 += sum(mask1)`), capacity
  ceil(T/E · 2·cf) floored by min_capacity, gates renormalised over the kept choices.
  Metadata policy=gshard, norm=renormalize_kept, capacity=1.0, min_capacity=4.
- moe_deepspeed_min_capacity.safetensors: the same at cf 0.05, where min_capacity=6 sets the
  slots (ceil(64/4 · 0.1) = 2 < 6).
- moe_tutel_top2.safetensors: Tutel `extract_critical` (fast_dispatch.py): rank-major
  locations, gates renormalised over the top-k before capacity, capacity k·int(cf·ceil(T/E))
  (equal to the workbench's ceil(T·k·cf/E) at these sizes). policy=gshard, norm=renormalize.
- moe_deepspeed_topk_probs.safetensors: DeepSpeed `topkgating` with drop_policy="probs" (its
  default): each expert keeps its highest-probability assignments, renormalised over kept.
  policy=score, norm=renormalize_kept.
- moe_switch_top1.safetensors: Switch Transformer top-1: token-order positions, raw gate.
  policy=order, norm=raw, top_k=1.
- moe_reroute_top2.safetensors: second-chance routing (Switch Transformer's "No Token Left
  Behind") as the workbench documents `reroute`: rank-major placement, then rounds in which
  each assignment without a slot tries its token's next-best expert that the token does not
  hold. policy=reroute, norm=renormalize (over the token's final experts).
- moe_expert_choice.safetensors: expert choice (Zhou et al. 2022; T5X ExpertsChooseMaskedRouter):
  each expert takes its top c = int(T·cf/E) tokens by probability, weighted by that
  probability. routing=expert_choice, norm=raw, capacity=1.0 (16 tokens per expert).
"""
import json
import math
import struct

import torch
import torch.nn.functional as F

T, D, F_, E = 64, 16, 24, 4
GEN = f"torch {torch.__version__}"


def save(path, tensors, metadata):
    """A safetensors file: u64 header length, JSON header, then the raw little-endian data."""
    header, blobs, at = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        assert t.dtype == torch.float32, name
        data = t.numpy().tobytes() if hasattr(t, "numpy") else bytes(t.untyped_storage())
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def layer(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    router = torch.randn(D, E, generator=g) / math.sqrt(D)
    bias = torch.tensor([1.0, 0.0, -0.3, 0.2])
    w_gate = torch.randn(E, D, F_, generator=g) / math.sqrt(D)
    w_up = torch.randn(E, D, F_, generator=g) / math.sqrt(D)
    w_down = torch.randn(E, F_, D, generator=g) / math.sqrt(F_)
    return x, router, bias, w_gate, w_up, w_down


def experts_out(x, w_gate, w_up, w_down, routes):
    """out[t] = sum of weight · SwiGLU_e(x[t]) over (token, expert, weight) routes."""
    y = torch.zeros(T, D)
    for t, e, w in routes:
        h = F.silu(x[t] @ w_gate[e]) * (x[t] @ w_up[e])
        y[t] += w * (h @ w_down[e])
    return y


# ---- the ports: each returns [(token, expert, weight)] for the kept assignments ----

def deepspeed_top2gating(logits, capacity_factor, min_capacity):
    gates = F.softmax(logits, dim=1)
    indices1_s = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(indices1_s, num_classes=E)
    logits_except1 = logits.masked_fill(mask1.bool(), float("-inf"))
    indices2_s = torch.argmax(logits_except1, dim=1)
    mask2 = F.one_hot(indices2_s, num_classes=E)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1
    locations2 += torch.sum(mask1, dim=0, keepdim=True)
    capacity = math.ceil((T / E) * (capacity_factor * 2))
    assert capacity == math.ceil(T * 2 * capacity_factor / E)
    capacity = max(capacity, min_capacity)
    mask1 = mask1 * torch.lt(locations1, capacity)
    mask2 = mask2 * torch.lt(locations2, capacity)
    gates1_s = (gates * mask1.float()).sum(dim=1)
    gates2_s = (gates * mask2.float()).sum(dim=1)
    denom_s = torch.clamp(gates1_s + gates2_s, min=torch.finfo(gates.dtype).eps)
    gates1_s, gates2_s = gates1_s / denom_s, gates2_s / denom_s
    routes = []
    for t in range(T):
        for mask, idx, g in ((mask1, indices1_s, gates1_s), (mask2, indices2_s, gates2_s)):
            if mask[t].any():
                routes.append((t, int(idx[t]), g[t]))
    return routes, [indices1_s, indices2_s]


def tutel_extract_critical(gates, top_k, capacity_factor):
    topk_indices = torch.topk(gates, top_k, dim=1).indices
    indices_s = [x.view(-1) for x in topk_indices.chunk(top_k, dim=1)]
    masks_se = [F.one_hot(x, num_classes=E) for x in indices_s]
    gates_s = [(gates * x).sum(dim=1) for x in masks_se]
    locations1 = torch.cumsum(masks_se[0], dim=0) - 1
    locations_s = [torch.sum(locations1 * masks_se[0], dim=1)]
    acc_base = None
    for k in range(1, top_k):
        s = torch.sum(masks_se[k - 1], dim=0, keepdim=True)
        acc_base = s if acc_base is None else acc_base + s
        locations2 = torch.cumsum(masks_se[k], dim=0) - 1 + acc_base
        locations_s.append(torch.sum(locations2 * masks_se[k], dim=1))
    denom_s = torch.clamp(sum(gates_s), min=torch.finfo(gates_s[0].dtype).eps)
    gates_s = [x / denom_s for x in gates_s]
    capacity = top_k * int(capacity_factor * ((T + E - 1) // E))
    assert capacity == math.ceil(T * top_k * capacity_factor / E)
    routes = []
    for t in range(T):
        for k in range(top_k):
            if locations_s[k][t] < capacity:  # the dispatch kernel skips the rest
                routes.append((t, int(indices_s[k][t]), gates_s[k][t]))
    return routes, indices_s


def deepspeed_topkgating_probs(logits, k, capacity_factor, min_capacity):
    gates = F.softmax(logits, dim=1)
    top_gate, top_idx = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_idx, 1)
    capacity = max(math.ceil((T / E) * (capacity_factor * k)), min_capacity)
    assert capacity == max(math.ceil(T * k * capacity_factor / E), min_capacity)
    topk_masked_gates = torch.zeros_like(gates).scatter(1, top_idx, top_gate)
    _, capacity_indices = torch.topk(topk_masked_gates, k=min(capacity, T), dim=0, sorted=False)
    capacity_mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(0, capacity_indices, True)
    mask &= capacity_mask
    gates_masked = gates * mask
    denom_s = torch.clamp(gates_masked.sum(dim=-1, keepdim=True), min=torch.finfo(gates.dtype).eps)
    gates_masked = gates_masked / denom_s
    routes = [(t, e, gates_masked[t, e]) for t in range(T) for e in range(E) if mask[t, e]]
    return routes, [top_idx[:, j] for j in range(k)]


def switch_top1(gates, capacity_factor):
    expert_index = torch.argmax(gates, dim=1)
    mask = F.one_hot(expert_index, num_classes=E)
    position = torch.cumsum(mask, dim=0) - 1
    capacity = int(T * capacity_factor / E)
    assert capacity == math.ceil(T * capacity_factor / E)
    position_s = (position * mask).sum(dim=1)
    routes = [(t, int(expert_index[t]), gates[t, expert_index[t]])
              for t in range(T) if position_s[t] < capacity]
    return routes, [expert_index]


def reroute_top2(gates, capacity_factor):
    """The workbench's `reroute`, written from its documentation, in plain Python."""
    k = 2
    capacity = math.ceil(T * k * capacity_factor / E)
    prefs = [sorted(range(E), key=lambda e: (-float(gates[t, e]), e)) for t in range(T)]
    expert = [[prefs[t][r] for r in range(k)] for t in range(T)]
    kept = [[False] * k for _ in range(T)]
    load = [0] * E
    for r in range(k):                      # rank-major placement
        for t in range(T):
            if load[expert[t][r]] < capacity:
                load[expert[t][r]] += 1
                kept[t][r] = True
    waiting = [(r, t, k) for r in range(k) for t in range(T) if not kept[t][r]]
    while waiting:                          # rounds of second chances
        still = []
        for r, t, nxt in waiting:
            held = {expert[t][j] for j in range(k) if kept[t][j]}
            while nxt < E and prefs[t][nxt] in held:
                nxt += 1
            if nxt == E:
                continue
            cand = prefs[t][nxt]
            if load[cand] < capacity:
                load[cand] += 1
                expert[t][r], kept[t][r] = cand, True
            else:
                still.append((r, t, nxt + 1))
        waiting = still
    routes, moved = [], 0
    for t in range(T):
        denom = sum(gates[t, expert[t][j]] for j in range(k))   # renormalize: the final experts
        for r in range(k):
            moved += expert[t][r] != prefs[t][r]
            if kept[t][r]:
                routes.append((t, expert[t][r], gates[t, expert[t][r]] / denom))
    assert moved > 0, "the case must reroute"
    return routes, [torch.tensor([prefs[t][r] for t in range(T)]) for r in range(k)]


def expert_choice(gates, capacity_factor):
    c = int(T * capacity_factor / E)
    routes = []
    for e in range(E):
        _, tokens = torch.topk(gates[:, e], c)
        routes += [(int(t), e, gates[int(t), e]) for t in tokens]
    routes.sort(key=lambda r: (r[0], -float(r[2])))
    served = {r[0] for r in routes}
    assert len(served) < T, "some token must go unserved"
    return routes, [gates.topk(c, dim=0).indices[:, e] for e in range(E)]


def margins_hold(decide, logits32, logits64):
    """Float32 and float64 probabilities make the same choices, none within 1e-5 of a tie."""
    _, a = decide(logits32)
    _, b = decide(logits64)
    assert all(torch.equal(p.long(), q.long()) for p, q in zip(a, b)), "f32 and f64 disagree"
    p = torch.softmax(logits64, dim=-1)
    top = p.sort(dim=-1, descending=True).values
    assert (top[:, :-1] - top[:, 1:]).min() > 1e-5, "a near-tie between a token's experts"
    col = p.sort(dim=0, descending=True).values
    assert (col[:-1] - col[1:]).min() > 1e-6, "a near-tie between an expert's tokens"


CASES = {
    "moe_deepspeed_top2": (
        lambda lg: deepspeed_top2gating(lg, 1.0, 4),
        {"top_k": "2", "policy": "gshard", "norm": "renormalize_kept", "capacity": "1.0",
         "min_capacity": "4", "generator": f"{GEN} (DeepSpeed-MoE top2gating, no second-expert sampling)"},
    ),
    "moe_deepspeed_min_capacity": (
        lambda lg: deepspeed_top2gating(lg, 0.05, 6),
        {"top_k": "2", "policy": "gshard", "norm": "renormalize_kept", "capacity": "0.05",
         "min_capacity": "6", "generator": f"{GEN} (DeepSpeed-MoE top2gating, min_capacity floor)"},
    ),
    "moe_tutel_top2": (
        lambda lg: tutel_extract_critical(F.softmax(lg, dim=1), 2, 1.0),
        {"top_k": "2", "policy": "gshard", "norm": "renormalize", "capacity": "1.0",
         "generator": f"{GEN} (Tutel extract_critical, normalize_gate)"},
    ),
    "moe_deepspeed_topk_probs": (
        lambda lg: deepspeed_topkgating_probs(lg, 2, 1.0, 1),
        {"top_k": "2", "policy": "score", "norm": "renormalize_kept", "capacity": "1.0",
         "generator": f"{GEN} (DeepSpeed-MoE topkgating, drop_policy=probs)"},
    ),
    "moe_switch_top1": (
        lambda lg: switch_top1(F.softmax(lg, dim=1), 1.0),
        {"top_k": "1", "policy": "order", "norm": "raw", "capacity": "1.0",
         "generator": f"{GEN} (Switch Transformer top-1)"},
    ),
    "moe_reroute_top2": (
        lambda lg: reroute_top2(F.softmax(lg, dim=1), 1.0),
        {"top_k": "2", "policy": "reroute", "norm": "renormalize", "capacity": "1.0",
         "generator": f"{GEN} (second-chance rerouting, No Token Left Behind rounds)"},
    ),
    "moe_expert_choice": (
        lambda lg: expert_choice(F.softmax(lg, dim=1), 1.0),
        {"routing": "expert_choice", "norm": "raw", "capacity": "1.0",
         "generator": f"{GEN} (expert choice, Zhou et al. 2022)"},
    ),
}

for i, (name, (decide, meta)) in enumerate(CASES.items()):
    x, router, bias, w_gate, w_up, w_down = layer(20261201 + i)
    logits = x @ router + bias
    margins_hold(decide, logits, x.double() @ router.double() + bias.double())
    routes, _ = decide(logits)
    kept = len(routes)
    out = experts_out(x, w_gate, w_up, w_down, routes)
    save(f"{name}.safetensors",
         {"x": x, "router": router, "router_bias": bias, "w_gate": w_gate, "w_up": w_up,
          "w_down": w_down, "out": out},
         {"family": "moe", **meta})
    print(f"wrote {name}: {kept} kept assignments")
