#!/usr/bin/env python3
"""Our perplexity beside two independent implementations, on the same GGUF file, text and
windows (llama.cpp's convention: chunks of --ctx tokens, the second half of each scored):

  - llama.cpp's llama-perplexity (built by scripts/fetch-peers.sh) on the file as shipped,
    against `harness eval perplexity` with its default product (packed: llama.cpp's
    int8-activation arithmetic);
  - transformers' float32 model loaded from the same GGUF (gguf_file=, dequantised to f32),
    against `harness eval perplexity --weights f32 --matmul fused` (f32 arithmetic).

llama-perplexity tokenizes the text itself; llama-tokenize's ids are compared with ours
(`--save-tokens`), and transformers scores our ids; its own tokenizer built from the GGUF is
compared with them (count and first difference) but not used. Writes the numbers, versions and the agreement to --out (the fixture that
harness/tests/eval.rs checks our numbers against) and prints a table.

  target/peers/venv/bin/python scripts/crosscheck_perplexity.py \\
      --out harness/tests/data/perplexity_crosscheck.json
"""

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import re
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = {"gpl3": "/usr/share/common-licenses/GPL-3"}


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-600:]}")
    return out


def ours(a, extra):
    cmd = [a.harness, "eval", "perplexity", "--model", a.model, "--text", a.text, "--ctx", str(a.ctx),
           "--chunks", str(a.chunks), "--threads", str(a.threads), "--format", "json", *extra]
    return json.loads(run(cmd).stdout)


def llama(a, text_path):
    out = run([a.llama_perplexity, "-m", a.model, "-f", text_path, "-c", str(a.ctx), "--chunks", str(a.chunks),
               "-t", str(a.threads)])
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out.stdout + out.stderr)
    if not m:
        sys.exit("error: llama-perplexity printed no final estimate")
    return float(m.group(1)), float(m.group(2))


def llama_tokens(a, text_path):
    out = run([a.llama_tokenize, "-m", a.model, "-f", text_path, "--ids", "--log-disable"])
    return json.loads(out.stdout.strip().splitlines()[-1])


def transformers_ppl(a, text, ids):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(a.model))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    torch.set_num_threads(a.threads)
    theirs = tok(text, add_special_tokens=False)["input_ids"]
    sha = hashlib.sha256(b"".join(struct.pack("<I", t) for t in theirs)).hexdigest()
    diff = next((i for i, (x, y) in enumerate(zip(ids, theirs)) if x != y), min(len(ids), len(theirs)))
    first = a.ctx // 2
    nll, n = 0.0, 0
    with torch.inference_mode():
        for k in range(min(a.chunks, len(ids) // a.ctx)):
            chunk = torch.tensor([ids[k * a.ctx : (k + 1) * a.ctx]])
            logp = torch.log_softmax(model(chunk).logits[0].double(), dim=-1)
            for j in range(first, a.ctx - 1):
                nll -= logp[j, chunk[0, j + 1]].item()
                n += 1
    import math

    return math.exp(nll / n), n, sha, len(theirs), diff


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--text", default="gpl3")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--harness", default=os.path.join(ROOT, "target/release/harness"))
    p.add_argument("--llama-perplexity",
                   default=os.path.join(ROOT, "target/peers/llama.cpp/build-native/bin/llama-perplexity"))
    p.add_argument("--llama-tokenize",
                   default=os.path.join(ROOT, "target/peers/llama.cpp/build-native/bin/llama-tokenize"))
    p.add_argument("--out", required=True)
    a = p.parse_args()
    text_path = TEXTS.get(a.text, a.text)
    text = open(text_path, encoding="utf-8").read()
    tokens_file = a.out + ".tokens.json"
    packed = ours(a, ["--save-tokens", tokens_file])
    ids = json.load(open(tokens_file))
    os.remove(tokens_file)
    f32 = ours(a, ["--weights", "f32", "--matmul", "fused"])
    l_ppl, l_err = llama(a, text_path)
    l_ids = llama_tokens(a, text_path)
    t_ppl, t_n, t_sha, t_len, t_diff = transformers_ppl(a, text, ids)
    with open(os.path.join(ROOT, "target/peers/llama.cpp/VERSION")) as f:
        llama_version = f.read().strip()
    rel = lambda x, y: abs(x - y) / y
    fixture = {
        "what": "perplexity of one GGUF file over one text, ours beside llama.cpp and transformers",
        "model": os.path.basename(a.model),
        "model_id": packed["model_id"],
        "text": a.text,
        "text_sha256": packed["text_sha256"],
        "ctx": a.ctx,
        "chunks": a.chunks,
        "threads": a.threads,
        "tokens": packed["text_tokens"],
        "tokens_sha256": packed["tokens_sha256"],
        "scored_tokens": packed["scored_tokens"],
        "ours_packed": {"ppl": packed["ppl"], "ppl_stderr": packed["ppl_stderr"]},
        "ours_f32_fused": {"ppl": f32["ppl"], "ppl_stderr": f32["ppl_stderr"]},
        "llama_cpp": {"ppl": l_ppl, "ppl_stderr": l_err, "version": llama_version,
                      "command": f"llama-perplexity -m MODEL -f {text_path} -c {a.ctx} --chunks {a.chunks} -t {a.threads}"},
        "transformers": {"ppl": t_ppl, "scored_tokens": t_n,
                         "its_tokenizer": {"tokens": t_len, "tokens_sha256": t_sha, "first_difference_at": t_diff},
                         "version": f"transformers {md.version('transformers')}, torch {md.version('torch')}, gguf {md.version('gguf')}",
                         "how": "AutoModelForCausalLM.from_pretrained(gguf_file=, dtype=float32), same chunks"},
        "agreement": {
            "packed_vs_llama_cpp": rel(packed["ppl"], l_ppl),
            "f32_vs_transformers": rel(f32["ppl"], t_ppl),
            "llama_cpp_tokenizer_agrees": l_ids == ids,
            "transformers_tokenizer_agrees": t_sha == packed["tokens_sha256"],
        },
    }
    with open(a.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"llama.cpp's tokenizer gives {'the same' if l_ids == ids else 'DIFFERENT'} ids ({len(l_ids)})")
    print(f"tokens: ours {packed['text_tokens']} ({packed['tokens_sha256'][:12]}); transformers' tokenizer {t_len} "
          f"({t_sha[:12]}), first difference at token {t_diff} (not used: every model scores our ids)")
    print(f"ours packed      PPL {packed['ppl']:.4f} +/- {packed['ppl_stderr']:.4f} | llama.cpp {l_ppl:.4f} +/- {l_err:.4f} | "
          f"rel diff {100 * rel(packed['ppl'], l_ppl):.3f}% (bound 1%)")
    print(f"ours f32 fused   PPL {f32['ppl']:.4f} | transformers f32 {t_ppl:.4f} | rel diff {100 * rel(f32['ppl'], t_ppl):.3f}% (bound 0.5%)")


if __name__ == "__main__":
    main()
