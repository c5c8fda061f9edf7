"""Writes smollm2_transformers_greedy.json: Hugging Face transformers' own tokenisation and
greedy continuation (24 new tokens, float32 after de-quantising the GGUF) of four prompts with
SmolLM2-135M-Instruct Q4_1, the reference models/tests/smollm2.rs compares the workbench with.

    scripts/fetch-models.sh                # puts the GGUF in models/cache/
    pip install torch transformers gguf accelerate
    python make_reference.py > smollm2_transformers_greedy.json
"""
import sys, json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import os
d = os.path.join(os.path.dirname(__file__), "..", "..", "cache"); f = "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
model.eval()
prompts = ["The capital of France is",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
           "Once upon a time, in a small village,",
           "def fibonacci(n):"]
out = []
for p in prompts:
    ids = tok(p, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        g = model.generate(ids, max_new_tokens=24, do_sample=False)
        logits = model(ids).logits[0, -1]
    out.append({"prompt": p, "prompt_ids": ids[0].tolist(), "greedy_ids": g[0, ids.shape[1]:].tolist(),
                "text": tok.decode(g[0, ids.shape[1]:]), "last_logits_top5": torch.topk(logits, 5).indices.tolist(),
                "last_logits_top5_values": [round(v, 4) for v in torch.topk(logits, 5).values.tolist()]})
import transformers
print(json.dumps({"generator": f"transformers {transformers.__version__}, torch {torch.__version__}, gguf_file={f}, float32, greedy", "cases": out}, indent=1))
