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

from transformers import AutoTokenizer

from hf_generate import answer, greedy


def main():
    model_dir, tok_dir, max_new, chats = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    prompts = []
    with open(chats, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                enc = tok.apply_chat_template(json.loads(line)["messages"], add_generation_prompt=True, tokenize=True,
                                              return_dict=True)
                prompts.append(list(enc["input_ids"]))
    answer(greedy(model_dir, prompts, max_new))


if __name__ == "__main__":
    main()
