"""Writes the Hugging Face checkpoint fixtures of models/tests/hf.rs with transformers:
a tiny random LlamaForCausalLM (one model.safetensors, untied head, GQA 4/2) and a tiny random
MixtralForCausalLM (8 experts... top-2, sharded into several files with an index), and for each
the logits transformers computes for a fixed prompt (every position) and its greedy
continuation. Run with a Python that has torch and transformers:
    python models/tests/data/make_hf_fixtures.py
"""
import json, os, torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)
prompt = [1, 17, 93, 5, 64, 127, 33, 2, 88, 41, 7]
common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, torch_dtype=torch.float32, tie_word_embeddings=False)

def save(name, model, **kw):
    out = os.path.join(here, name)
    model.save_pretrained(out, safe_serialization=True, **kw)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(prompt):]
    json.dump({"transformers": transformers.__version__, "prompt_ids": prompt,
               "logits": [[float(v) for v in row] for row in logits],
               "greedy_ids": [int(t) for t in gen]},
              open(os.path.join(here, name + "_expected.json"), "w"))

llama = LlamaForCausalLM(LlamaConfig(rope_theta=10000.0, **common))
for p in llama.parameters():  # larger than the default init so the logits are far from ties
    p.data.normal_(0, 0.3) if p.dim() > 1 else p.data.uniform_(0.5, 1.5)
save("hf_llama", llama)

mixtral = MixtralForCausalLM(MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                           rope_theta=1e6, router_jitter_noise=0.0, **common))
for p in mixtral.parameters():
    p.data.normal_(0, 0.3) if p.dim() > 1 else p.data.uniform_(0.5, 1.5)
save("hf_mixtral", mixtral, max_shard_size="100KB")
