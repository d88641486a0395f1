"""Greedy generation by PyPI transformers (the oracle of generate_test):

  hf_generate.py MODEL_DIR MAX_NEW_TOKENS PROMPTS_JSON
prints a JSON list, per prompt, of the ids `model.generate` appends (greedy, fp32, no end-of-text
stop: exactly MAX_NEW_TOKENS each). Each prompt alone (batch of one: no padding involved).
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def greedy(model_dir, prompts, max_new):
    """The ids generate appends to each prompt (a list of ids), each alone, fp32, no stop."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    model.generation_config.eos_token_id = None
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], dtype=torch.long)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, min_new_tokens=max_new,
                                 do_sample=False, pad_token_id=0)
            out.append(gen[0, len(p):].tolist())
    return out


def answer(out):
    print()  # the answer on a line of its own, after anything transformers printed
    json.dump(out, sys.stdout)
    print()


def main():
    answer(greedy(sys.argv[1], json.loads(sys.argv[3]), int(sys.argv[2])))


if __name__ == "__main__":
    main()
