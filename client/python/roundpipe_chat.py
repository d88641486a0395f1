"""roundpipe chat-prompts: chat conversations rendered into prompts for sample generations.

    <venv>/bin/python roundpipe_client.py chat-prompts --model-dir DIR --input chats.jsonl [--out sampling.json]

Each input line is {"messages": [{"role": ..., "content": ...}, ...]} (other keys are ignored),
typically ending with a user's message. Each conversation is rendered with the model's own chat
template and its generation prompt (transformers' apply_chat_template(messages,
add_generation_prompt=True, tokenize=False)): the template is Jinja and transformers is its
reference, so the daemon does not re-implement it. The output is a SamplePolicy in JSON,
{"prompts": [one text per conversation]}: the `eval.samples` of a job spec, or
`roundpipe generate JOB --sampling_file sampling.json`. The daemon encodes a prompt with the
job's tokenizer without adding special tokens (the template wrote them), which gives exactly the
ids apply_chat_template(..., tokenize=True) gives. Exit status 0, or 1 with a message naming the
file, the line and the field.
"""
import json
import sys

from roundpipe_prepare import PrepareError, read_conversations


def render(model_dir, input_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if not tok.chat_template:
        raise PrepareError(f"{model_dir}: the tokenizer has no chat template (tokenizer_config.json chat_template)")
    return [tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            for msgs, _ in read_conversations(input_path)]


def main(args):
    try:
        prompts = render(args.model_dir, args.input)
    except (PrepareError, OSError) as e:
        print(f"roundpipe chat-prompts: {e}", file=sys.stderr)
        return 1
    text = json.dumps({"prompts": prompts}, ensure_ascii=False, indent=1) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{args.out}: {len(prompts)} prompts")
    else:
        sys.stdout.write(text)
    return 0
