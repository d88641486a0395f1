"""Reference fixture for the JSONL dataset tests: a tokenizer and a dataset, tokenized by PyPI `tokenizers`.

    make_jsonl_dataset.py OUT_DIR

Writes OUT_DIR/tok/tokenizer.json (a byte-level BPE of 300 ids trained with `tokenizers`, with
Llama-3's template: <|bos|> before every encoded text) and tok/tokenizer_config.json (eos_token
<|eos|>), OUT_DIR/train.jsonl (prompt/completion records and text records, multilingual, one
with a blank line after it), OUT_DIR/valid.jsonl (40 more records of the same kinds) and
OUT_DIR/expected.json: the packed streams the daemon must train and evaluate on, computed here
independently of our tokenizer: for each record, encode(prompt) with special tokens (masked),
encode(completion) without (trained), then <|eos|> (trained); a text record is encode(text)
with special tokens, all trained. "starts" lists where each record's tokens begin.
"""
import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "tok"), exist_ok=True)
    rng = random.Random(7)
    words = ["the", "cat", "sat", "on", "a", "mat", "über", "naïve", "日本", "語", "🙂", "42", "code()", "x+y",
             "question:", "answer:", "Paris", "is", "capital", "of", "France", "two", "plus", "equals", "four"]

    def sentence(n):
        return " ".join(rng.choice(words) for _ in range(n))

    corpus = [sentence(rng.randint(3, 30)) for _ in range(400)]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|bos|>", "<|eos|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", bos)])
    tok.save(os.path.join(out, "tok", "tokenizer.json"))
    json.dump({"eos_token": {"content": "<|eos|>", "special": True}, "bos_token": "<|bos|>"},
              open(os.path.join(out, "tok", "tokenizer_config.json"), "w"))

    def records(n, blank_after):
        tokens, trained, starts, lines = [], [], [], []
        for i in range(n):
            starts.append(len(tokens))
            if i % 3 == 2:
                rec = {"text": sentence(rng.randint(5, 40))}
                ids = tok.encode(rec["text"], add_special_tokens=True).ids + [eos]
                tokens += ids
                trained += [1] * len(ids)
            else:
                rec = {"prompt": "question: " + sentence(rng.randint(2, 12)),
                       "completion": " answer: " + sentence(rng.randint(1, 15)), "id": i}
                p = tok.encode(rec["prompt"], add_special_tokens=True).ids
                c = tok.encode(rec["completion"], add_special_tokens=False).ids + [eos]
                tokens += p + c
                trained += [0] * len(p) + [1] * len(c)
            lines.append(json.dumps(rec, ensure_ascii=False))
            if i == blank_after:
                lines.append("")
        return tokens, trained, starts, lines

    tokens, trained, starts, lines = records(120, 10)
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    v_tokens, v_trained, v_starts, v_lines = records(40, -1)
    with open(os.path.join(out, "valid.jsonl"), "w") as f:
        f.write("\n".join(v_lines) + "\n")
    json.dump({"tokens": tokens, "trained": trained, "starts": starts, "vocab": tok.get_vocab_size(),
               "documents": 120, "valid_tokens": v_tokens, "valid_trained": v_trained, "valid_starts": v_starts},
              open(os.path.join(out, "expected.json"), "w"))
    print(f"{len(tokens)} tokens, {sum(trained)} trained, vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
