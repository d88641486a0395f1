#!/usr/bin/env bash
# run.sh — builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded
# time from a small seed corpus plus the inputs that once crashed it (tests/fuzz/regressions/).
# Exit status 0 = no crash, leak or sanitizer report.
#   RP_FUZZ_SECONDS  seconds per target (default 20)
#   RP_FUZZ_BUILD    build directory (default <checkout>/build/fuzz)
#   RP_FUZZ_ONLY     run only this target (e.g. jsonl_fuzzer)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${RP_FUZZ_BUILD:-$ROOT/build/fuzz}"
SECONDS_EACH="${RP_FUZZ_SECONDS:-20}"
if ! command -v clang++ >/dev/null; then
  echo "fuzz: FAILED — clang++ is not installed (deploy/install-deps.sh installs it)"
  exit 1
fi
launcher=""
command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
[ -f "$BUILD/build.ninja" ] || cmake -S "$ROOT/tests/fuzz" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ $launcher >/dev/null
if ! cmake --build "$BUILD" >"$BUILD/build.log" 2>&1; then
  grep -E "error|FAILED" "$BUILD/build.log" | head -20
  echo "fuzz: FAILED (the fuzz targets did not build; $BUILD/build.log)"
  exit 1
fi
corpus="$BUILD/corpus"
mkdir -p "$corpus/st" "$corpus/cfg" "$corpus/npy" "$corpus/tok" "$corpus/jsonl" "$corpus/tds" "$corpus/prof" "$corpus/peft" \
  "$corpus/mx" "$corpus/meta" "$corpus/spec"
cat >"$corpus/tok/bpe.json" <<'JSON'
{"added_tokens":[{"id":5,"content":"<s>","special":true}],"normalizer":{"type":"Sequence","normalizers":[{"type":"NFC"}]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+|\\p{L}+"},"behavior":"Isolated"},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],"special_tokens":{"<s>":{"ids":[5]}}},"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"c":3,"d":4},"merges":["a b"]}}
JSON
cat >"$corpus/tok/split.json" <<'JSON'
{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?:a+)+b|."},"behavior":"MergedWithNext","invert":true},"model":{"type":"BPE","vocab":{"a":0,"b":1," ":2},"merges":[],"unk_token":"a","fuse_unk":true}}
JSON
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"format":"pt"}}' >"$corpus/st/seed1"
printf '\x08\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}' >"$corpus/st/seed2"
cat >"$corpus/cfg/llama.json" <<'JSON'
{"model_type":"llama","vocab_size":96,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"rope_theta":10000.0,"rms_norm_eps":1e-6,"rope_parameters":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":16,"rope_theta":10000.0}}
JSON
cat >"$corpus/cfg/qwen3.json" <<'JSON'
{"model_type":"qwen3","vocab_size":96,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"tie_word_embeddings":true,"rope_scaling":null}
JSON
# .npy seeds: a 1-d uint16 and a 2-d int64 array with their payloads.
python3 - "$corpus/npy" <<'PY'
import struct, sys
for name, descr, shape, count, size in (("u2", "<u2", "(8,)", 8, 2), ("i8", "<i8", "(2, 3)", 6, 8)):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    with open(sys.argv[1] + "/" + name, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + bytes(count * size))
PY
printf '%s\n' '{"text": "ab ab c"}' '{"prompt": "a", "completion": " ab"}' '{"text": 3}' >"$corpus/jsonl/records"
cat >"$corpus/prof/two.json" <<'JSON'
{"format":"roundpipe.profile.v1","name":"seed","tokens_per_microbatch":64,"activation_hop_s":0.001,"layers":[{"kind":"embedding","forward_s":0.001,"backward_s":0.002,"fused_s":0.003},{"kind":"block","forward_s":0.01,"backward_s":0.02,"fused_s":0.03,"param_bytes":1024,"trainable_bytes":1024},{"kind":"head","forward_s":0.001,"backward_s":0.002,"fused_s":0.003}]}
JSON
cat >"$corpus/peft/lora.json" <<'JSON'
{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj","v_proj"],"target_parameters":["mlp.experts.gate_up_proj"],"use_dora":false}
JSON
cat >"$corpus/meta/meta.json" <<'JSON'
{"format":"roundpipe-checkpoint-2","step":3,"adamw_step":3,"batches_consumed":3,"loss_scale":1.0,"good_steps":0,"partition":{"forward":[2,2],"fused":1,"backward":[3]},"note":"job 1","optimizer":"adamw","eval":{"step":2,"loss":1.5,"tokens":64,"best_loss":1.5,"best_step":2,"without_improvement":0,"best_checkpoint":""},"base":{"fingerprint":"ab","tensors":1,"bytes":4,"file":"base.json"},"crc32":{"weights.safetensors":1,"optimizer.safetensors":2,"base.json":3}}
JSON
# MXFP4: rank 2 scales [2, 1], blocks [2, 1, 16], then 2 scale bytes and 32 block bytes.
python3 - "$corpus/mx" "$corpus/tds" <<'PY'
import json, struct, sys
open(sys.argv[1] + "/two", "wb").write(bytes([1, 2, 1, 16, 127, 130]) + bytes(range(32)))
# A token dataset: int32 ids, a bool mask, int64 document offsets.
ids, mask, offs = struct.pack("<4i", 1, 2, 3, 4), bytes([0, 1, 1, 1]), struct.pack("<3q", 0, 2, 4)
h = json.dumps({"__metadata__": {"format": "roundpipe.token_dataset.v1"},
                "input_ids": {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]},
                "loss_mask": {"dtype": "BOOL", "shape": [4], "data_offsets": [16, 20]},
                "document_offsets": {"dtype": "I64", "shape": [3], "data_offsets": [20, 44]}}).encode()
open(sys.argv[2] + "/three", "wb").write(struct.pack("<Q", len(h)) + h + ids + mask + offs)
PY
# Job specs (protobuf text) whose paths point into the admission target's allowed root.
export RP_SPEC_FUZZ_ROOT="$BUILD/spec_root"
R="$RP_SPEC_FUZZ_ROOT"
tiny='model { family: "llama" vocab: 256 hidden: 32 intermediate: 64 num_blocks: 2 num_heads: 2 num_kv_heads: 1 head_dim: 16 init_seed: 7 }'
printf '%s\n' "name: \"tiny\" $tiny precision: PRECISION_FP32 optimizer { lr: 0.001 mode: OPTIMIZER_MODE_SYNC } batching { global_batch: 4 micro_batch: 1 sequence_length: 16 } data { stream: true }" >"$corpus/spec/streamed"
printf '%s\n' "$tiny batching { global_batch: 4 micro_batch: 2 sequence_length: 16 } data { token_file { path: \"$R/tokens.bin\" max_epochs: 2 shuffle: true } validation { path: \"$R/tokens.bin\" } } eval { every_steps: 2 early_stopping_patience: 1 keep_best_checkpoint: true } checkpoint { every_steps: 1 keep_last: 2 } output_dir: \"$R/out\" max_steps: 5" >"$corpus/spec/file"
printf '%s\n' "model { hf_dir: \"$R/hf\" lora { rank: 4 alpha: 8 target_modules: \"q_proj\" } } precision: PRECISION_BF16 optimizer { lr: 0.0001 lr_schedule { kind: KIND_WARMUP_COSINE warmup_steps: 2 total_steps: 10 min_lr_ratio: 0.1 } mode: OPTIMIZER_MODE_ASYNC } batching { global_batch: 8 micro_batch: 2 sequence_length: 32 } data { token_file { path: \"$R/train.jsonl\" tokenizer_dir: \"$R/tok\" packing: PACKING_DOCUMENT_MASKED } }" >"$corpus/spec/lora"
printf '%s\n' "model { preset: \"qwen3-moe-tiny\" router_aux_loss_coef: 0.01 } partition { forward: 2 fused: 4 backward: 2 } batching { global_batch: 16 micro_batch: 4 sequence_length: 64 microbatches_per_round: 2 } data { stream: true } priority: 3" >"$corpus/spec/preset"
for t in "safetensors_header_fuzzer st" "hf_config_fuzzer cfg" "npy_header_fuzzer npy" "tokenizer_fuzzer tok" \
  "jsonl_fuzzer jsonl" "token_dataset_fuzzer tds" "profile_fuzzer prof" "peft_config_fuzzer peft" "mxfp4_fuzzer mx" \
  "checkpoint_meta_fuzzer meta" "job_spec_fuzzer spec"; do
  [ -z "${RP_FUZZ_ONLY:-}" ] || [ "$RP_FUZZ_ONLY" = "${t%% *}" ] || continue
  set -- $t
  echo "fuzz: $1 for ${SECONDS_EACH}s"
  mkdir -p "$BUILD/artifacts"
  # Inputs that once crashed a target (tests/fuzz/regressions/<target>/) run first, every time.
  regressions=""
  [ -d "$ROOT/tests/fuzz/regressions/$1" ] && regressions="$ROOT/tests/fuzz/regressions/$1"
  rc=0
  "$BUILD/$1" -max_total_time="$SECONDS_EACH" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$BUILD/artifacts/$1-" "$corpus/$2" $regressions >"$BUILD/$1.log" 2>&1 || rc=$?
  grep -aE 'Done [0-9]+ runs|ERROR|SUMMARY' "$BUILD/$1.log" || true
  if [ "$rc" != 0 ]; then
    echo "fuzz: $1 found a problem (exit $rc); input saved under $BUILD/artifacts, log $BUILD/$1.log"
    tail -30 "$BUILD/$1.log"
    exit 1
  fi
done
echo "fuzz: clean"
