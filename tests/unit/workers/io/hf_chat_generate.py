"""Greedy generation by PyPI transformers from chat conversations (the oracle of the daemon's
chat-prompt test):

  hf_chat_generate.py MODEL_DIR TOKENIZER_DIR MAX_NEW_TOKENS CHATS_JSONL
Each line of CHATS_JSONL is {"messages": [...]}; its prompt is the ids of transformers'
apply_chat_template(messages, add_generation_prompt=True, tokenize=True) with TOKENIZER_DIR's
tokenizer. Prints a JSON list, per conversation, of the ids `model.generate` appends (greedy,
fp32, exactly MAX_NEW_TOKENS each, each conversation alone).
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir, tok_dir, max_new, chats = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    model.generation_config.eos_token_id = None
    out = []
    with torch.no_grad(), open(chats, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            enc = tok.apply_chat_template(json.loads(line)["messages"], add_generation_prompt=True, tokenize=True,
                                          return_dict=True)
            prompt = list(enc["input_ids"])
            ids = torch.tensor([prompt], dtype=torch.long)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                 min_new_tokens=max_new, do_sample=False, pad_token_id=0)
            out.append(gen[0, len(prompt):].tolist())
    print()  # the answer on a line of its own, after anything transformers printed
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
