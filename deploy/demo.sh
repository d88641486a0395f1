#!/usr/bin/env bash
# demo.sh — the main job: install what is missing, build, then run the daemon end to end:
# start roundpiped on loopback with a throw-away state directory, submit the built-in default
# job (a small Llama-style model, byte-level tokens of the text files under
# /usr/share/common-licenses, or of the files you name), watch it train live, export the model
# as a Hugging Face directory, show the Prometheus metrics, and stop the daemon (SIGTERM = drain).
#
#   bash deploy/demo.sh                 # default text
#   bash deploy/demo.sh my.txt more.txt # your text
#   RP_DEMO_STEPS=600 bash deploy/demo.sh
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RP_BUILD_TARGETS="roundpiped roundpipe"  # only what the demo runs; the tests are test.sh's business
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

echo "== data: byte-level tokens of ${#TEXT[@]} file(s)"
"$CLI" tokenize --out "$WORK/data/text.bin" "${TEXT[@]}"

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
  "model": {"preset": "llama-tiny", "initSeed": 1},
  "precision": "PRECISION_FP32",
  "optimizer": {"lr": 0.003, "weightDecay": 0.01, "maxGradNorm": 1.0, "mode": "OPTIMIZER_MODE_ASYNC",
                "lrSchedule": {"kind": "KIND_WARMUP_COSINE", "warmupSteps": 20, "minLrRatio": 0.1}},
  "batching": {"globalBatch": $((2 * WORKERS)), "microBatch": 1, "sequenceLength": 128},
  "data": {"tokenFile": {"path": "$WORK/data/text.bin", "maxEpochs": 100}},
  "maxSteps": $STEPS,
  "outputDir": "$WORK/data/out"
}
JSON
echo "== submitting the default job ($WORK/job.json) and watching it"
JOB="$("$CLI" submit "$WORK/job.json")"
"$CLI" watch "$JOB"
"$CLI" get "$JOB"

echo "== exporting the model"
EXPORT="$("$CLI" export "$JOB")"
ls -l "$EXPORT"
echo "   load it with: ${RP_PREFIX:-/opt/roundpipe}/venv/bin/python -c \"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('$EXPORT')\""

echo "== metrics (http://$METRICS/metrics), a few of them"
exec 3<>"/dev/tcp/${METRICS%:*}/${METRICS##*:}"
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
grep -E '^roundpipe_(tokens_trained_total|iterations_total|loss|bubble_ratio|jobs\{state="succeeded"\}|transfer_bytes_total)' <&3 || true
exec 3<&-

echo "== stopping roundpiped (SIGTERM: drain, then exit)"
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" && echo "   roundpiped exited cleanly"
trap - EXIT
echo "== done; everything is in $WORK"
