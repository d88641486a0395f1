#!/usr/bin/env bash
# demo.sh — the main job: install what is missing, build, then run the daemon end to end:
# start roundpiped on loopback with a throw-away state directory, submit the built-in default
# job (a small Llama-style model trained on the text files under /usr/share/common-licenses, or on
# the files you name: a BPE tokenizer is trained on them, and their paragraphs become a JSONL
# dataset the daemon tokenizes itself, packed with document masks, every 20th paragraph held out
# for validation: the eval loss and two sample generations are reported six times), watch it
# train live (a loss curve), export the model
# as a Hugging Face directory, show the Prometheus metrics, stop the daemon (SIGTERM = drain), and
# show the schedule at the paper's scale: the engine on 8 paced workers beside the simulator.
#
#   bash deploy/demo.sh                 # default text
#   bash deploy/demo.sh my.txt more.txt # your text
#   RP_DEMO_STEPS=600 bash deploy/demo.sh
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RP_BUILD_TARGETS="roundpiped roundpipe paced_bench"  # only what the demo runs; the tests are test.sh's business
source "$RP_ROOT/deploy/build.sh"
DAEMON="$RP_BUILD_DIR/server/roundpiped"
CLI="$RP_BUILD_DIR/client/roundpipe"
STEPS="${RP_DEMO_STEPS:-600}"

if [ "$#" -gt 0 ]; then TEXT=("$@"); else
  TEXT=()
  for f in /usr/share/common-licenses/*; do [ -f "$f" ] && TEXT+=("$f"); done
fi
WORK="$(mktemp -d /tmp/roundpipe-demo.XXXXXX)"
mkdir -p "$WORK/data"
# Workers: every GPU when there is one (RP_DEMO_DEVICES overrides), else one CPU worker per core
# (2..4).
WORKERS=$(( $(nproc) < 4 ? $(nproc) : 4 )); [ "$WORKERS" -ge 2 ] || WORKERS=2
DEVICES="${RP_DEMO_DEVICES:-cpu:$WORKERS}"
if [ -z "${RP_DEMO_DEVICES:-}" ] && nvidia-smi -L >/dev/null 2>&1; then
  DEVICES=cuda
  WORKERS=$(nvidia-smi -L | grep -c '^GPU')  # the global batch below keeps >= 2 micro-batches per worker
fi

PY="${RP_PREFIX:-/opt/roundpipe}/venv/bin/python"
echo "== data: a BPE tokenizer trained on ${#TEXT[@]} file(s), and their paragraphs as a JSONL dataset"
# The tokenizer is trained here with PyPI's `tokenizers` (Llama-3's pre-tokenizer split and
# template); the daemon reads its tokenizer.json natively and tokenizes the JSONL itself.
"$PY" - "$WORK/data" "${TEXT[@]}" <<'PY'
import json, os, re, sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
out, files = sys.argv[1], sys.argv[2:]
texts = [open(f, encoding="utf-8", errors="replace").read() for f in files]
split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
specials = ["<|begin_of_text|>", "<|end_of_text|>"]
tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1024, special_tokens=specials, show_progress=False,
                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                   special_tokens=[("<|begin_of_text|>", tok.token_to_id(specials[0]))])
os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
tok.save(os.path.join(out, "tokenizer", "tokenizer.json"))
json.dump({"eos_token": specials[1], "bos_token": specials[0]}, open(os.path.join(out, "tokenizer", "tokenizer_config.json"), "w"))
# Every 20th paragraph is held out as the validation split.
n = [0, 0]
with open(os.path.join(out, "train.jsonl"), "w") as train, open(os.path.join(out, "valid.jsonl"), "w") as valid:
    k = 0
    for t in texts:
        for para in re.split(r"\n\s*\n", t):
            if para.strip():
                held_out = k % 20 == 19
                (valid if held_out else train).write(json.dumps({"text": para.strip()}) + "\n")
                n[held_out] += 1
                k += 1
print(f"   tokenizer: {tok.get_vocab_size()} tokens; dataset: {n[0]} paragraphs -> {out}/train.jsonl, "
      f"{n[1]} held out -> {out}/valid.jsonl")
PY

echo "== starting roundpiped (state in $WORK/state, log in $WORK/roundpiped.log)"
"$DAEMON" --state_dir "$WORK/state" --listen 127.0.0.1:0 --metrics_address 127.0.0.1:0 \
  --devices "$DEVICES" --allowed_root "$WORK/data" --ready_file "$WORK/ready.json" \
  >"$WORK/roundpiped.log" 2>&1 &
DAEMON_PID=$!
cleanup() { kill "$DAEMON_PID" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 600); do
  [ -f "$WORK/ready.json" ] && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$WORK/roundpiped.log"; echo "roundpiped exited" >&2; exit 1; }
  sleep 0.1
done
[ -f "$WORK/ready.json" ] || { echo "roundpiped did not come up" >&2; exit 1; }
READY="$(cat "$WORK/ready.json")"
ADDR="$(sed -E 's/.*"grpc": \["([^"]+)".*/\1/' <<<"$READY")"
METRICS="$(sed -E 's/.*"metrics": "([^"]+)".*/\1/' <<<"$READY")"
export ROUNDPIPE_ADDRESS="$ADDR"
echo "   gRPC on $ADDR, metrics on http://$METRICS/metrics"
"$CLI" info

cat >"$WORK/job.json" <<JSON
{
  "name": "demo-llama-tiny",
  "model": {"preset": "llama-tiny", "vocab": 1024, "initSeed": 1},
  "precision": "PRECISION_FP32",
  "optimizer": {"lr": 0.003, "weightDecay": 0.01, "maxGradNorm": 1.0, "mode": "OPTIMIZER_MODE_ASYNC",
                "lrSchedule": {"kind": "KIND_WARMUP_COSINE", "warmupSteps": 20, "minLrRatio": 0.1}},
  "batching": {"globalBatch": $((2 * WORKERS)), "microBatch": 1, "sequenceLength": 128},
  "data": {"tokenFile": {"path": "$WORK/data/train.jsonl", "tokenizerDir": "$WORK/data/tokenizer", "maxEpochs": 100,
                         "shuffle": true, "shuffleSeed": 1, "packing": "PACKING_DOCUMENT_MASKED"},
           "validation": {"path": "$WORK/data/valid.jsonl", "tokenizerDir": "$WORK/data/tokenizer"}},
  "eval": {"everySteps": $(( STEPS / 6 > 0 ? STEPS / 6 : 1 )), "keepBestCheckpoint": true,
           "samples": {"prompts": ["This License", "The software is provided"], "maxNewTokens": 24}},
  "maxSteps": $STEPS,
  "outputDir": "$WORK/data/out"
}
JSON
echo "== submitting the default job ($WORK/job.json) and watching it"
JOB="$("$CLI" submit "$WORK/job.json")"
"$CLI" watch "$JOB"
"$CLI" get "$JOB"
echo "== what the model now says (greedy, from the final weights; generated at every evaluation)"
"$CLI" samples "$JOB"

echo "== exporting the model"
EXPORT="$("$CLI" export "$JOB")"
ls -l "$EXPORT"
echo "   load it with: ${RP_PREFIX:-/opt/roundpipe}/venv/bin/python -c \"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('$EXPORT')\""

echo "== the loss curves in TensorBoard (files the daemon wrote for the job):"
echo "   ${RP_PREFIX:-/opt/roundpipe}/venv/bin/tensorboard --logdir $WORK/data/out/tensorboard   # then http://localhost:6006"
ls "$WORK/data/out/tensorboard"

echo "== metrics (http://$METRICS/metrics), a few of them"
exec 3<>"/dev/tcp/${METRICS%:*}/${METRICS##*:}"
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
grep -E '^roundpipe_(tokens_trained_total|iterations_total|loss|eval_loss|evaluations_total|bubble_ratio|jobs\{state="succeeded"\}|transfer_bytes_total)' <&3 || true
exec 3<&-

echo "== stopping roundpiped (SIGTERM: drain, then exit)"
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" && echo "   roundpiped exited cleanly"
trap - EXIT
echo "== the schedule where it means something"
echo "   The bubble above is high: two CPU workers share this machine's cores and a tiny model's stages"
echo "   take milliseconds, so it measures host overhead. At the paper's scale (Qwen3-1.7B, 8 workers,"
echo "   16 micro-batches, the authors' per-layer times) the same engine, on paced workers that take each"
echo "   operation's profiled time, beside the simulator (real-time equivalents; a few seconds each):"
"$RP_BUILD_DIR/tests/bench/paced_bench" --models qwen3-1.7b --transfers on --repeats 1 --iterations 2
echo "== done; everything is in $WORK"
