"""Writes the Hugging Face checkpoint fixtures of models/tests/hf.rs with transformers: one tiny
random checkpoint per architecture of models/src/model/arch/ (save_pretrained, safetensors; 2+
layers, GQA, a sliding window of 8 where the architecture has one, experts for the MoE ones, a
non-default RoPE on most) and, for prompts of 1, 10 and 40 tokens, the logits transformers
computes at the last position (every position for the 10-token prompt) and its greedy
continuation of 24 tokens. A seed is kept only if no greedy step is a near-tie (the top two
logits closer than 1e-3 of the largest), so an f32 rounding difference cannot flip a choice,
and every continuation has at least 6 distinct tokens (a model that repeats one token would
hide errors).
Run with a Python that has torch and transformers:
    python models/tests/data/make_hf_fixtures.py
"""
import json, os, random, shutil, torch, transformers
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM,
                          OlmoeConfig, OlmoeForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM)

here = os.path.dirname(os.path.abspath(__file__))
VOCAB, NEW = 128, 24
rng = random.Random(7)
PROMPTS = [[7], [1, 17, 93, 5, 64, 127, 33, 2, 88, 41], [rng.randrange(VOCAB) for _ in range(40)]]
common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, dtype=torch.float32, tie_word_embeddings=False)


def randomise(model, seed, norm_center, embed_std):
    """Weights N(0, 0.3) (larger than the default init, so logits are far from ties), the
    embedding N(0, embed_std), norm gains uniform around `norm_center` (1 for w-scaled norms, 0
    for Gemma's (1 + w))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                sd = embed_std if "embed_tokens" in name else 0.3
                p.copy_(torch.randn(p.shape, generator=g) * sd)
            elif "norm" in name:
                p.copy_(norm_center + torch.rand(p.shape, generator=g) - 0.5)
            else:  # biases
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def run(model):
    out, margins = [], []
    with torch.no_grad():
        for ids in PROMPTS:
            logits = model(torch.tensor([ids])).logits[0]
            gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, output_scores=True,
                                 return_dict_in_generate=True)
            for s in gen.scores:
                top = torch.topk(s[0], 2).values
                margins.append(float((top[0] - top[1]) / s[0].abs().max()))
            out.append({"ids": ids, "last_logits": [float(v) for v in logits[-1]],
                        "greedy": [int(t) for t in gen.sequences[0, len(ids):]],
                        "all_logits": [[float(v) for v in r] for r in logits]
                        if len(ids) == 10 else None})
    return out, min(margins)


def save(name, make, norm_center=1.0, embed_std=0.3, **kw):
    for seed in range(100):
        torch.manual_seed(seed)
        model = make().eval()
        randomise(model, seed, norm_center, embed_std)
        prompts, margin = run(model)
        if margin > 1e-3 and all(len(set(p["greedy"])) >= 6 for p in prompts):
            break
    else:
        raise SystemExit(f"{name}: no seed without a near-tie or a repetitive continuation")
    out = os.path.join(here, name)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True, **kw)
    for p in prompts:
        if p["all_logits"] is None:
            del p["all_logits"]
    json.dump({"transformers": transformers.__version__, "class": type(model).__name__,
               "seed": seed, "min_margin": margin, "prompts": prompts},
              open(os.path.join(here, name + "_expected.json"), "w"))
    print(f"{name}: seed {seed}, smallest greedy margin {margin:.4f}")


# Llama: the default RoPE (and the transformers-4 config style test edits this one).
save("hf_llama", lambda: LlamaForCausalLM(LlamaConfig(rope_theta=10000.0, **common)))
# Llama-3: rope_type llama3 (low/medium/high frequency bands at head_dim 8, old context 64),
# Q/K/V/O and MLP biases.
save("hf_llama3", lambda: LlamaForCausalLM(LlamaConfig(
    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=64),
    attention_bias=True, mlp_bias=True, **common)))
# Mistral: a sliding window of 8 on every layer, head_dim 16 (q_dim 64 ≠ d_model 32), linear RoPE.
save("hf_mistral", lambda: MistralForCausalLM(MistralConfig(
    sliding_window=8, head_dim=16, rope_parameters=dict(rope_type="linear", rope_theta=10000.0,
                                                        factor=2.0), **common)))
# Qwen2: Q/K/V biases, a sliding window on layers ≥ max_window_layers, YaRN, tied embeddings.
save("hf_qwen2", lambda: Qwen2ForCausalLM(Qwen2Config(
    use_sliding_window=True, sliding_window=8, max_window_layers=1,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                         original_max_position_embeddings=16),
    **{**common, "tie_word_embeddings": True, "max_position_embeddings": 64})))
# Gemma-3: 6 layers (5 local with a window of 8 and base 10000, 1 global with base 1e6 and
# linear scaling), per-head QK norms, four norms per layer with (1 + w), GeGLU, √d embedding
# scale, query_pre_attn_scalar 24, final logit soft-capping, head_dim 16, tied embeddings (a
# small embedding, since √d scales it into every logit: larger ones make each greedy token
# predict itself).
save("hf_gemma3", lambda: Gemma3ForCausalLM(Gemma3TextConfig(
    head_dim=16, sliding_window=8, query_pre_attn_scalar=24, final_logit_softcapping=10.0,
    rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                     "full_attention": dict(rope_type="linear", rope_theta=1e6, factor=4.0)},
    hidden_activation="gelu_pytorch_tanh",
    **{**common, "num_hidden_layers": 6, "tie_word_embeddings": True})), norm_center=0.0,
    embed_std=0.05)
# Phi-3: fused qkv_proj / gate_up_proj, longrope (original context 16 of 64: the 40-token prompt
# runs on the long factors, the others switch as generation passes position 16), window 8.
save("hf_phi3", lambda: Phi3ForCausalLM(Phi3Config(
    sliding_window=8, original_max_position_embeddings=16,
    rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                         short_factor=[1.0, 1.3, 2.1, 3.4], long_factor=[1.1, 2.5, 4.0, 7.5]),
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    **{**common, "max_position_embeddings": 64})))
# Mixtral: top-2 of 4 experts, renormalised; sharded into several files with an index.
save("hf_mixtral", lambda: MixtralForCausalLM(MixtralConfig(
    num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6, router_jitter_noise=0.0,
    **common)), max_shard_size="100KB")
# OLMoE: QK RMSNorm over the whole projections, top-2 of 4 experts without renormalisation.
save("hf_olmoe", lambda: OlmoeForCausalLM(OlmoeConfig(
    num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, rope_theta=10000.0,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, **common)))
# Qwen2-MoE: layer 0 a dense MLP (mlp_only_layers), layer 1 top-2 of 4 experts of width 48,
# renormalised (norm_topk_prob), plus a shared expert of width 80 behind a sigmoid gate.
save("hf_qwen2moe", lambda: Qwen2MoeForCausalLM(Qwen2MoeConfig(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
    shared_expert_intermediate_size=80, norm_topk_prob=True, mlp_only_layers=[0],
    rope_theta=10000.0, **common)))
