#!/usr/bin/env bash
# fuzz_soak.sh — the long fuzz runs (CI runs the short ones): each libFuzzer parser target of
# tests/fuzz (safetensors and .npy headers, config.json, tokenizer.json, JSONL records, token
# datasets, profiles, adapter_config.json, MXFP4, checkpoint meta.json, and the admission rules
# over job specs; RP_FUZZ_ONLY picks one) for RP_FUZZ_SECONDS (default 600), then the
# in-process job-spec fuzzer for RP_SPEC_FUZZ_ITERATIONS (default 1000000). Prints each run's
# count; exit 0 = nothing found.
#   build/  must hold a built tree (bash deploy/build.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${RP_BUILD_DIR:-$ROOT/build}"
RP_FUZZ_SECONDS="${RP_FUZZ_SECONDS:-600}" RP_FUZZ_BUILD="$BUILD/fuzz-soak" bash "$ROOT/tests/fuzz/run.sh"
RP_SPEC_FUZZ_ITERATIONS="${RP_SPEC_FUZZ_ITERATIONS:-1000000}" \
  "$BUILD/tests/unit/server/server_unit_test" --gtest_filter='SpecFuzz.*' | grep -E 'spec fuzz:|PASSED|FAILED'
