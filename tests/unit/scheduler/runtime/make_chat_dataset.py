"""Reference fixture for chat token datasets: `roundpipe_client.py prepare` against transformers.

    make_chat_dataset.py OUT_DIR CLIENT_DIR

Makes two model dirs with the same tokenizer (a byte-level BPE trained with `tokenizers`) and the
same ChatML-style chat template, once with the assistant turns marked ({% generation %}) and once
without; writes chat.jsonl (multi-turn conversations with system, user and assistant messages);
runs `prepare` on both (OUT_DIR/markers.safetensors, OUT_DIR/plain.safetensors); and writes
OUT_DIR/expected.json: the tokens and assistant mask transformers' apply_chat_template gives
(return_assistant_tokens_mask with the marked template), conversations back to back, and their
offsets. It also checks that prepare refuses a bad record naming file, line and field. The two
files must both equal expected.json: the marked one is transformers' own mask, the plain one our
prefix rule, which must agree with it when turns end at <|im_end|>.
"""
import json
import os
import random
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MARKED = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
          "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
          "{% else %}{{ m['content'] }}<|im_end|>{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def main():
    out, client_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(3)
    words = ["what", "is", "the", "capital", "of", "France", "Paris", "two", "plus", "three", "five", "thanks",
             "you", "are", "a", "helpful", "assistant", "über", "日本", "🙂", "?", "!", "42"]

    def say(n):
        return " ".join(rng.choice(words) for _ in range(n))

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    tok.train_from_iterator([say(rng.randint(3, 20)) for _ in range(300)] + ["system user assistant"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    for name, template in (("model_markers", MARKED), ("model_plain", PLAIN)):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": template}, open(os.path.join(d, "tokenizer_config.json"), "w"))

    convs = []
    for i in range(40):
        msgs = [{"role": "system", "content": say(4)}] if i % 2 == 0 else []
        for _ in range(rng.randint(1, 3)):
            msgs += [{"role": "user", "content": say(rng.randint(1, 12))},
                     {"role": "assistant", "content": say(rng.randint(1, 15))}]
        convs.append(msgs)
    with open(os.path.join(out, "chat.jsonl"), "w") as f:
        for i, m in enumerate(convs):
            f.write(json.dumps({"messages": m, "id": i}, ensure_ascii=False) + "\n")

    hf = PreTrainedTokenizerFast.from_pretrained(os.path.join(out, "model_markers"))
    tokens, trained, offsets = [], [], [0]
    for m in convs:
        enc = hf.apply_chat_template(m, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        tokens += list(enc["input_ids"])
        trained += [1 if x else 0 for x in enc["assistant_masks"]]
        offsets.append(len(tokens))
    assert sum(trained) > 0 and sum(trained) < len(trained)
    json.dump({"tokens": tokens, "trained": trained, "offsets": offsets, "vocab": tok.get_vocab_size()},
              open(os.path.join(out, "expected.json"), "w"))

    client = os.path.join(client_dir, "roundpipe_client.py")
    for name in ("markers", "plain"):
        r = subprocess.run([sys.executable, client, "prepare", "--model-dir", os.path.join(out, "model_" + name),
                            "--input", os.path.join(out, "chat.jsonl"), "--out", os.path.join(out, name + ".safetensors")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"prepare ({name}) failed: {r.stdout}{r.stderr}")
    bad = os.path.join(out, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps({"messages": convs[0]}) + "\n\n" + json.dumps({"messages": [{"role": "user"}]}) + "\n")
    r = subprocess.run([sys.executable, client, "prepare", "--model-dir", os.path.join(out, "model_plain"),
                        "--input", bad, "--out", os.path.join(out, "bad.safetensors")], capture_output=True, text=True)
    want = f"{bad}:3: messages[0] needs string \"role\" and \"content\""
    if r.returncode != 1 or want not in r.stderr or os.path.exists(os.path.join(out, "bad.safetensors")):
        sys.exit(f"prepare did not refuse the bad record as expected: rc {r.returncode}: {r.stderr}")
    print(f"{len(convs)} conversations, {len(tokens)} tokens, {sum(trained)} trained")


if __name__ == "__main__":
    main()
