"""Writes tokenizer_expected.json: llama.cpp's own token ids (llama-tokenize) for a set of hard
strings and for the whole GPL-3 text, on each real GGUF file in models/cache/ and on two tiny
vocabulary-only files this script writes beside it, the reference models/tests/tokenizer.rs
compares the workbench's tokenizers with. BOS is added as the file says (llama-tokenize's
default: tokenizer.ggml.add_bos_token, else llama.cpp's default for the tokenizer kind);
control and user-defined tokens in the text are parsed (its default); the text is passed
verbatim (-f FILE --no-escape).

The tiny files hold what the real ones lack, so that CI checks it without the models:
- tiny_spm.gguf: SentencePiece with llama.cpp's defaults (no add_space_prefix, no
  add_bos_token keys: a space before the text, BOS first), pieces of equal score (the leftmost
  merge must win), a user-defined and a control token;
- tiny_bpe.gguf: byte-level BPE without tokenizer.ggml.pre (llama.cpp's `default`
  pre-tokenizer: punctuation runs, GPT-2's regex, digit runs, three-digit groups).

    scripts/fetch-models.sh        # puts the GGUF files in models/cache/
    scripts/fetch-peers.sh         # builds llama.cpp's tools in target/peers/llama.cpp/
    pip install gguf               # writes the tiny files
    python make_tokenizer_ids.py > tokenizer_expected.json
"""
import hashlib, json, os, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", "..", ".."))
peer = os.path.join(root, "target", "peers", "llama.cpp")
tokenize = os.path.join(peer, "build-native", "bin", "llama-tokenize")
cache = os.path.join(root, "models", "cache")
files = ["SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen2.5-Coder-0.5B-Instruct.gguf",
         "gemma-3-270m-q4_k_m.gguf"]
gpl3 = "/usr/share/common-licenses/GPL-3"

strings = [
    ("plain", "Hello world"),
    ("empty", ""),
    ("lone space", " "),
    ("three spaces", "   "),
    ("leading space", " leading space"),
    ("trailing space", "trailing space "),
    ("multiple spaces", "multiple   spaces   inside  the    line"),
    ("newlines", "line one\nline two\n\nline four\n"),
    ("lone newline", "\n"),
    ("many newlines", "a" + "\n" * 40 + "b"),
    ("tabs", "\ttab\tseparated\t\tvalues\t\n"),
    ("crlf", "\r\n windows\r\nnewlines \r\n"),
    ("spaces before newline", "end of line   \n  next\n\n  \n"),
    ("digits", "12345678 and 3.14159 and 1,000,000 and 0x1F and 2024-12-01"),
    ("contractions", "don't I'll we're they've she'd it's DON'T I'LL You'Re"),
    ("cjk", "中文分词测试：我们今天去北京。日本語のテキスト、한국어 텍스트"),
    ("emoji", "emoji 🙂👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ❤️"),
    ("accented", "naïve café résumé Ångström façade Ça va? Zürich"),
    ("combining marks", "cafe\u0301 n\u0303 a\u0308\u0301 Z\u030civot"),
    ("scripts", "αβγ Ελληνικά русский текст العربية עברית हिन्दी ไทย"),
    ("code", "def f(x):\n    if x > 0:\n        return x * 2  # comment\n    return -x\n"),
    ("indentation", "    four spaces\n\t\ttwo tabs\n        eight spaces\n\t    mixed\n"),
    ("punctuation", "Wait... what?!?! (yes) [no] {maybe} <tag> a--b __init__ foo_bar @user #x $5 100% a+b=c"),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ............ ----------"),
    ("url", "https://example.com/path/to?query=1&b=%20x#frag"),
    ("chatml", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("gemma turns", "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"),
    ("specials glued", "x<|im_start|>y <|endoftext|> z<start_of_turn>w <bos>"),
    ("special lookalikes", "<|im_start <|im_start|| <start_of_turn <|endoftext|"),
    ("end markers", "html </s> and <s> and <eos> and <tool_call>"),
    ("ties", "aab aaab abcabc aabab cab"),
    ("tiny specials", "ab<tag>ca <ctl>abc b<s>a\nx"),
]


def ids(model, text):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        name = f.name
    try:
        out = subprocess.run([tokenize, "-m", model, "-f", name, "--ids", "--log-disable",
                              "--no-escape"], capture_output=True, check=True).stdout
    finally:
        os.unlink(name)
    return json.loads(out.decode("utf-8").strip().splitlines()[-1])


def gpt2_byte_chars():
    """GPT-2's byte-to-character map (bytes_to_unicode), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tiny_writer(path):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    return w


def write_tiny_spm(path):
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    # Equal scores on purpose: "aab" is aa+b (leftmost first), never a+ab.
    for text, score in [("\u2581", -1), ("a", -2), ("b", -2), ("c", -2), ("x", -2),
                        ("\u2581a", -3), ("\u2581b", -3), ("\u2581x", -3), ("ab", -3),
                        ("bc", -3), ("ca", -3), ("aa", -3), ("abc", -4), ("\u2581ab", -4),
                        ("aaa", -5), ("\u2581\u2581", -6), ("\u2581c", -3)]:
        pieces.append((text, float(score), 1))
    pieces += [("<tag>", 0.0, 4), ("<ctl>", 0.0, 3), ("\n", 0.0, 4)]
    w = tiny_writer(path)
    w.add_tokenizer_model("llama")
    w.add_token_list([p[0] for p in pieces])
    w.add_token_scores([p[1] for p in pieces])
    w.add_token_types([p[2] for p in pieces])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def write_tiny_bpe(path):
    tokens = ["<|endoftext|>", "<tool>"] + gpt2_byte_chars()
    merges = ["\u0120 t", "h e", "\u0120t he", "1 2", "12 3", "a b", "ab c", ", ,", "\u0120 \u0120",
              "i n", "\u0120 in"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    w = tiny_writer(path)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 4] + [1] * (len(tokens) - 2))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def meta(model):
    """tokenizer.ggml.* scalars, read with the gguf package when it is there."""
    try:
        import gguf
    except ImportError:
        return {}
    r = gguf.GGUFReader(model)
    keys = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.add_bos_token"]
    return {k: r.fields[k].contents() for k in keys if k in r.fields}


with open(gpl3, "rb") as f:
    gpl3_bytes = f.read()
with open(os.path.join(peer, "VERSION")) as f:
    version = f.read().strip()
write_tiny_spm(os.path.join(here, "tiny_spm.gguf"))
write_tiny_bpe(os.path.join(here, "tiny_bpe.gguf"))
models = {}
for name in files + ["tiny_spm.gguf", "tiny_bpe.gguf"]:
    path = os.path.join(here if name.startswith("tiny_") else cache, name)
    if not os.path.exists(path):
        sys.exit(f"{path} is absent: run scripts/fetch-models.sh")
    print(f"{name} ...", file=sys.stderr)
    models[name] = {
        "tokenizer": meta(path),
        "ids": {label: ids(path, text) for label, text in strings},
        "gpl3": ids(path, gpl3_bytes.decode("utf-8")),
    }
doc = {
    "generator": f"{version}: llama-tokenize -m FILE -f TEXT --ids --log-disable --no-escape "
                 "(BOS as the file says, special tokens parsed)",
    "strings": [{"label": label, "text": text} for label, text in strings],
    "gpl3": {"path": gpl3, "bytes": len(gpl3_bytes),
             "sha256": hashlib.sha256(gpl3_bytes).hexdigest()},
    "models": models,
}
# One line per id list: indented JSON, with each list of ids written compactly.
lists = {}


def compact(v):
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        key = f"@@{len(lists)}@@"
        lists[key] = json.dumps(v, separators=(",", ":"))
        return key
    if isinstance(v, dict):
        return {k: compact(x) for k, x in v.items()}
    if isinstance(v, list):
        return [compact(x) for x in v]
    return v


text = json.dumps(compact(doc), ensure_ascii=False, indent=1)
for key, value in lists.items():
    text = text.replace(f'"{key}"', value)
print(text)
