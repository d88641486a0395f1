"""roundpipe prepare: chat data rendered with the model's chat template into a token dataset file.

    <venv>/bin/python roundpipe_client.py prepare --model-dir DIR --input chat.jsonl --out train.safetensors

Each input line is {"messages": [{"role": ..., "content": ...}, ...]} (other keys are ignored).
Each conversation is rendered and tokenized by transformers' apply_chat_template with the
tokenizer of DIR (tokenizer.json, tokenizer_config.json, its chat template): the template is Jinja
and transformers is its reference, so nothing here re-implements it. The loss mask trains the
assistant turns only:
  * when the template marks them ({% generation %} ... {% endgeneration %}), transformers' own
    assistant mask (return_assistant_tokens_mask) is used;
  * otherwise each assistant turn k is the tokens between the rendering of messages[:k] with the
    generation prompt and the rendering of messages[:k+1]; a template whose renderings are not
    prefixes of one another is refused, naming the line and the message.
The output is a token dataset file for the daemon (FORMAT_TOKEN_DATASET, docs/DAEMON.md): a
safetensors file with input_ids (int32 [N]), loss_mask (uint8 [N]: 1 = trained target) and
document_offsets (int64 [D+1]), conversations back to back. Needs transformers and safetensors
(deploy/install-deps.sh puts both in its venv). Exit status 0, or 1 with a message naming the
file, the line and the field.
"""
import json
import sys


class PrepareError(Exception):
    pass


def _ids(enc):
    return list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc)


def conversation_tokens(tok, messages, where):
    """(ids, mask) of one conversation; mask[i] = 1 for tokens of assistant turns."""
    has_markers = "{% generation %}" in (tok.chat_template or "") or "{%- generation %}" in (tok.chat_template or "")
    full = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                   return_assistant_tokens_mask=has_markers)
    ids = list(full["input_ids"])
    if has_markers:
        return ids, [1 if m else 0 for m in full["assistant_masks"]]
    mask = [0] * len(ids)
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        head = _ids(tok.apply_chat_template(messages[:k], tokenize=True, return_dict=True, add_generation_prompt=True)) \
            if k > 0 else _ids(tok.apply_chat_template([], tokenize=True, return_dict=True, add_generation_prompt=True))
        upto = _ids(tok.apply_chat_template(messages[:k + 1], tokenize=True, return_dict=True))
        if ids[:len(head)] != head or ids[:len(upto)] != upto or len(head) > len(upto):
            raise PrepareError(f"{where}: messages[{k}]: the chat template does not render the conversation as a "
                               "sequence of prefixes; mark the assistant turns with {% generation %} in the template")
        for i in range(len(head), len(upto)):
            mask[i] = 1
    return ids, mask


def read_conversations(input_path):
    """The (messages, "file:line") of each {"messages": [...]} line; PrepareError naming the line."""
    out = []
    with open(input_path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{input_path}:{n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{where}: not valid JSON ({e.msg})")
            msgs = rec.get("messages") if isinstance(rec, dict) else None
            if not isinstance(msgs, list) or not msgs:
                raise PrepareError(f"{where}: needs \"messages\": a non-empty list of {{role, content}}")
            for k, m in enumerate(msgs):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise PrepareError(f"{where}: messages[{k}] needs string \"role\" and \"content\"")
            out.append((msgs, where))
    if not out:
        raise PrepareError(f"{input_path}: holds no conversations")
    return out


def prepare(model_dir, input_path, out_path):
    import numpy as np
    from safetensors.numpy import save_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if not tok.chat_template:
        raise PrepareError(f"{model_dir}: the tokenizer has no chat template (tokenizer_config.json chat_template)")
    ids, mask, offsets = [], [], [0]
    for msgs, where in read_conversations(input_path):
        i, m = conversation_tokens(tok, msgs, where)
        ids += i
        mask += m
        offsets.append(len(ids))
    save_file({"input_ids": np.asarray(ids, dtype=np.int32), "loss_mask": np.asarray(mask, dtype=np.uint8),
               "document_offsets": np.asarray(offsets, dtype=np.int64)},
              out_path, metadata={"format": "roundpipe.token_dataset.v1"})
    return len(ids), sum(mask), len(offsets) - 1


def main(args):
    try:
        n, trained, docs = prepare(args.model_dir, args.input, args.out)
    except (PrepareError, OSError) as e:
        print(f"roundpipe prepare: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {docs} conversations, {n} tokens, {trained} trained")
    return 0
