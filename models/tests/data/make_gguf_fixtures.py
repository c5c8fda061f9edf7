"""Writes the tiny GGUF fixtures of models/tests/gguf.rs and harness/tests/cli.rs with the gguf
package (gguf.GGUFWriter and gguf.quants), from the transformers checkpoints of
make_hf_fixtures.py, as llama.cpp's convert_hf_to_gguf.py lays them out: llama.cpp's names and
metadata keys, Q and K rows permuted for the `llama` architecture (interleaved RoPE pairs; not
for qwen2), tied heads as no `output.weight`. Each tensor is in its own type, as real files mix
them: Q and K in Q5_0, V in Q8_0, O in Q4_1, gate and up in Q4_0, down in Q5_1, the embedding in
F16, a separate head in Q8_0, norms and biases in F32. The expected logits and greedy ids are
transformers' on each file (`from_pretrained(dir, gguf_file=..., dtype=torch.float32)`, which
dequantises to f32 and undoes the permutation). Also two broken files: the llama file with
blk.0.attn_q's type set to IQ2_XXS (16) in its tensor info, and one without
llama.attention.head_count. Run after make_hf_fixtures.py:
    python models/tests/data/make_gguf_fixtures.py
"""
import json, os, struct, gguf, numpy as np, torch, transformers
from gguf import GGMLQuantizationType as T
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
NEW = 24
TYPES = {"attn_q": T.Q5_0, "attn_k": T.Q5_0, "attn_v": T.Q8_0, "attn_output": T.Q4_1,
         "ffn_gate": T.Q4_0, "ffn_up": T.Q4_0, "ffn_down": T.Q5_1, "token_embd": T.F16,
         "output": T.Q8_0}
HF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
      "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
      "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
      "post_attention_layernorm": "ffn_norm"}


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute (rotate_half pairs → interleaved pairs)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write(src, dst, arch, drop_key=None):
    c = json.load(open(os.path.join(here, src, "config.json")))
    w = load_file(os.path.join(here, src, "model.safetensors"))
    out = gguf.GGUFWriter(os.path.join(here, dst), arch)
    keys = {"context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
            "block_count": c["num_hidden_layers"], "feed_forward_length": c["intermediate_size"],
            "attention.head_count": c["num_attention_heads"],
            "attention.head_count_kv": c["num_key_value_heads"]}
    for k, v in keys.items():
        if k != drop_key:
            out.add_uint32(f"{arch}.{k}", v)
    out.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    out.add_float32(f"{arch}.rope.freq_base", c["rope_parameters"]["rope_theta"])
    vocab = c["vocab_size"]
    out.add_tokenizer_model("gpt2")
    # A byte-level vocabulary: printable characters (GPT-2's byte map keeps them) and one merge.
    chars = [chr(0x21 + i) for i in range(vocab - 1)]
    out.add_token_list(chars + [chars[0] + chars[1]])
    out.add_token_types([1] * vocab)
    out.add_token_merges([f"{chars[0]} {chars[1]}"])
    out.add_bos_token_id(1)
    out.add_eos_token_id(2)
    for name, t in sorted(w.items()):
        t = t.astype(np.float32)
        if name == "model.embed_tokens.weight":
            stem = "token_embd"
        elif name == "lm_head.weight":
            stem = "output"
        elif name == "model.norm.weight":
            stem = "output_norm"
        else:
            _, _, i, *rest = name.split(".")
            part, kind = ".".join(rest[:-1]), rest[-1]
            stem = f"blk.{i}.{HF[part]}"
            if arch == "llama" and HF[part] == "attn_q":
                t = permute(t, c["num_attention_heads"], c["num_attention_heads"])
            if arch == "llama" and HF[part] == "attn_k":
                t = permute(t, c["num_attention_heads"], c["num_key_value_heads"])
            if kind == "bias":
                out.add_tensor(f"{stem}.bias", t)
                continue
        qtype = TYPES.get(stem.split(".")[-1], T.F32)
        if t.ndim == 1 or qtype == T.F32:
            out.add_tensor(f"{stem}.weight", t)
        elif qtype == T.F16:
            out.add_tensor(f"{stem}.weight", t.astype(np.float16))
        else:
            out.add_tensor(f"{stem}.weight", gguf.quants.quantize(t, qtype), raw_dtype=qtype)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


def expected(dst, prompts):
    model = AutoModelForCausalLM.from_pretrained(here, gguf_file=dst, dtype=torch.float32).eval()
    res = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0, -1]
            gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(ids):]
            res.append({"ids": ids, "last_logits": [float(v) for v in logits],
                        "greedy": [int(t) for t in gen]})
    return res


out = {"transformers": transformers.__version__, "files": {}}
for src, dst, arch in [("hf_llama", "tiny_llama.gguf", "llama"),
                       ("hf_qwen2", "tiny_qwen2.gguf", "qwen2")]:
    write(src, dst, arch)
    prompts = [p["ids"] for p in json.load(open(os.path.join(here, f"{src}_expected.json")))["prompts"]]
    out["files"][dst] = expected(dst, prompts)
    print(dst, [p["greedy"][:8] for p in out["files"][dst]])
json.dump(out, open(os.path.join(here, "tiny_gguf_expected.json"), "w"))

# Broken files: an unsupported tensor type in the tensor info, a missing metadata key.
write("hf_llama", "tiny_llama_no_heads.gguf", "llama", drop_key="attention.head_count")
b = bytearray(open(os.path.join(here, "tiny_llama.gguf"), "rb").read())
name = b"blk.0.attn_q.weight"
at = b.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
n_dims = struct.unpack_from("<I", b, at)[0]
struct.pack_into("<I", b, at + 4 + 8 * n_dims, int(T.IQ2_XXS))
open(os.path.join(here, "tiny_llama_iq2_xxs.gguf"), "wb").write(bytes(b))
