"""Writes gguf_expected.json for models/tests/gguf.rs: transformers' greedy continuations of the
two real GGUF files scripts/fetch-models.sh fetches (Qwen2.5-Coder-0.5B-Instruct, a Q5_0 / Q8_0 /
Q4_K / Q6_K mix, and Gemma-3-270M Q4_K_M), each loaded with
`AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32)` — which
dequantises every tensor to f32, undoes llama.cpp's norm + 1 for Gemma, and reads the
architecture from the metadata — for 3 prompts × 24 tokens. The prompt ids come from the
file's tokenizer as transformers builds it, with BOS first where the model expects it (Gemma's
id 2). Run with a Python that has torch, transformers and gguf, after fetch-models.sh:
    python models/tests/data/make_gguf_expected.py
"""
import hashlib, json, os, torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

here = os.path.dirname(os.path.abspath(__file__))
cache = os.path.join(here, "..", "..", "cache")
PROMPTS = ["def fibonacci(n):", "The capital of France is",
           "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"]
FILES = [("Qwen2.5-Coder-0.5B-Instruct.gguf", False), ("gemma-3-270m-q4_k_m.gguf", True)]

out = {"transformers": transformers.__version__, "new_tokens": 24, "files": {}}
for name, bos in FILES:
    sha = hashlib.sha256(open(os.path.join(cache, name), "rb").read()).hexdigest()
    tok = AutoTokenizer.from_pretrained(cache, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(cache, gguf_file=name, dtype=torch.float32).eval()
    prompts = []
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if bos:
            ids = [tok.bos_token_id] + ids
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, output_scores=True,
                                 return_dict_in_generate=True)
        margins = []
        for s in gen.scores:
            top = torch.topk(s[0], 2).values
            margins.append(float((top[0] - top[1]) / s[0].abs().max()))
        greedy = [int(t) for t in gen.sequences[0, len(ids):]]
        prompts.append({"text": text, "ids": ids, "greedy": greedy,
                        "smallest_margin": min(margins)})
        print(name, repr(text), ids[:8], greedy, tok.decode(greedy)[:60], min(margins))
    out["files"][name] = {"sha256": sha, "architecture": model.config.model_type,
                          "prompts": prompts}
    del model
json.dump(out, open(os.path.join(here, "gguf_expected.json"), "w"), indent=1)
