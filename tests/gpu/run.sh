#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU check, in one command, for a machine with an NVIDIA GPU and a
# CUDA PyTorch but none of our Debian libraries (the lent device machine: ../shared/DEVICE.md).
#
#   here (a Debian 12 machine with network):  bash tests/gpu/run.sh --fetch
#       downloads the .deb files the engine build needs, plus CMake and ninja wheels (used only
#       where the machine's own are missing or older than 3.25), into .devdeps/ (git-ignored, ~30 MB)
#   there (the command given to the device tool, with carry [".devdeps"]):
#       OUT=/some/dir bash tests/gpu/run.sh
#
# There it unpacks .devdeps/*.deb into a private prefix (never into /), configures the engine
# only (-DRP_WITH_SERVER=OFF: no gRPC/protobuf/prometheus needed) against the machine's own
# LibTorch (python3 -c 'import torch'), builds the GPU tests and the GPU benchmark with every
# core, runs the tests (ctest label "gpu"), then the benchmark (Qwen3-1.7B; then a GPT-OSS-20B
# shaped LoRA run when time is left), and prints a short table last.
# Full logs go to $OUT (build.log, gpu_tests.log, gpu_tests.xml, bench.log, bench.json).
#   RP_GPU_BUDGET_S   wall-clock budget for the whole script (default 480): the benchmark's
#                     optional parts are dropped when time runs short
#   RP_PYTHON         the Python whose torch to build against (default python3)
#   RP_BENCH_ARGS     extra gpu_bench flags
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEBS="$ROOT/.devdeps"
# Engine-only build dependencies (Debian 12 names): Abseil, GoogleTest/GoogleMock, nlohmann-json,
# zlib, and the tokenizer's PCRE2 and utf8proc.
PKGS="libabsl-dev libabsl20220623 libgtest-dev libgmock-dev nlohmann-json3-dev zlib1g-dev zlib1g
      libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2"

if [ "${1:-}" = --fetch ]; then
  mkdir -p "$DEBS"
  (cd "$DEBS" && apt-get download $PKGS)
  # CMake >= 3.25 and ninja as PyPI wheels (static manylinux binaries, ~28 MB), used there only
  # when the machine's own are missing or too old.
  FETCH_PY="${RP_PYTHON:-/opt/roundpipe/venv/bin/python}"
  "$FETCH_PY" -m pip download "cmake>=3.25,<4" ninja --only-binary :all: --platform manylinux2014_x86_64 \
    --python-version 3.12 --no-deps -d "$DEBS" -q
  ls -la "$DEBS"
  exit 0
fi

START=$(date +%s)
BUDGET="${RP_GPU_BUDGET_S:-480}"
left() { echo $((BUDGET - ($(date +%s) - START))); }
OUT="${OUT:-$ROOT/build-gpu/out}"
mkdir -p "$OUT"
PY="${RP_PYTHON:-python3}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

ls "$DEBS"/*.deb >/dev/null 2>&1 || { echo "no .deb files in $DEBS: run 'bash tests/gpu/run.sh --fetch' first and carry .devdeps" >&2; exit 2; }
BUILD="$ROOT/build-gpu"
# A fixed private prefix inside the build dir, so a rerun's CMake cache still points at it.
DD="$BUILD/devdeps"
rm -rf "$DD" && mkdir -p "$DD"
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DD"; done
TORCH_PREFIX="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
say "torch: $TORCH_VERSION; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi unavailable')"
# Debian's zlib1g-dev's libz.so is an absolute link into /lib (another zlib version there):
# link against the unpacked runtime file itself; at run time any libz.so.1 will do.
ZLIB_SO="$(ls "$DD"/lib/x86_64-linux-gnu/libz.so.1.* | head -1)"
# (A CMake *variable*, ';'-separated: the CMAKE_PREFIX_PATH environment variable splits on ':'.)
PREFIXES="$DD/usr"
export LD_LIBRARY_PATH="$DD/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Build tools: the machine's, unless missing or older than our CMakeLists needs (3.25); then the
# wheels fetched with --fetch.
CMAKE=cmake
NINJA_ARGS=()
unpack_wheel() { "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; }
have_cmake="$(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
if [ -z "$have_cmake" ] || [ "$(printf '%s\n3.25\n' "$have_cmake" | sort -V | head -1)" != 3.25 ]; then
  whl="$(ls "$DEBS"/cmake-*.whl 2>/dev/null | head -1)"
  [ -n "$whl" ] || { echo "cmake ${have_cmake:-missing} < 3.25 and no cmake wheel in $DEBS" >&2; exit 2; }
  unpack_wheel "$whl" "$BUILD/tools"
  chmod +x "$BUILD"/tools/cmake/data/bin/*
  CMAKE="$BUILD/tools/cmake/data/bin/cmake"
fi
if ! command -v ninja >/dev/null 2>&1; then
  whl="$(ls "$DEBS"/ninja-*.whl 2>/dev/null | head -1)"
  [ -n "$whl" ] || { echo "no ninja and no ninja wheel in $DEBS" >&2; exit 2; }
  unpack_wheel "$whl" "$BUILD/tools"
  NINJA="$(ls "$BUILD"/tools/ninja-*.data/scripts/ninja)"
  chmod +x "$NINJA"
  NINJA_ARGS=(-DCMAKE_MAKE_PROGRAM="$NINJA")
fi
say "cmake: $("$CMAKE" --version | head -1)"
# No CUDA toolkit is needed: the build takes cuda_runtime_api.h and libcudart from the nvidia-*
# wheels beside torch (cmake/RoundpipeTorch.cmake), or from a toolkit when the wheels lack them.

t0=$(date +%s)
if ! {
  "$CMAKE" -S "$ROOT" -B "$BUILD" -G Ninja "${NINJA_ARGS[@]}" -DCMAKE_BUILD_TYPE=Release -DRP_WITH_SERVER=OFF -DRP_WITH_GLOO=OFF \
    -DCMAKE_PREFIX_PATH="$PREFIXES" -DRP_TORCH_PREFIX="$TORCH_PREFIX" \
    -DZLIB_ROOT="$DD/usr" -DZLIB_INCLUDE_DIR="$DD/usr/include" \
    -DZLIB_LIBRARY="$ZLIB_SO" &&
    "$CMAKE" --build "$BUILD" -j "$(nproc)" --target cuda_backend_test gpu_bench host_register_bench
} >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  say "BUILD FAILED after $(($(date +%s) - t0)) s (see build.log)"
  exit 1
fi
say "build (engine + GPU tests + bench, $(nproc) jobs): $(($(date +%s) - t0)) s"

# GPU tests: the CUDA backend against the CPU backend (N = 1..3 workers sharing GPU 0).
t0=$(date +%s)
set +e
timeout $(( $(left) / 2 )) "$BUILD/tests/gpu/cuda_backend_test" --gtest_output="xml:$OUT/gpu_tests.xml" \
  >"$OUT/gpu_tests.log" 2>&1
TEST_RC=$?
set -e
PASSED=$(grep -c '^\[       OK \]' "$OUT/gpu_tests.log" || true)
FAILED=$(grep -c '^\[  FAILED  \].*ms)' "$OUT/gpu_tests.log" || true)
SKIPPED=$(grep -c '^\[  SKIPPED \].*ms)' "$OUT/gpu_tests.log" || true)
say "gpu tests: rc=$TEST_RC passed=$PASSED failed=$FAILED skipped=$SKIPPED ($(($(date +%s) - t0)) s)"
grep '^\[  FAILED  \]' "$OUT/gpu_tests.log" | head -20 | tee -a "$SUMMARY" || true

# Benchmark: Qwen3-1.7B shape, bf16, seq 2048; max sequence at micro-batch 1 if time allows.
t0=$(date +%s)
# The longest-sequence tries get what is left beyond a reserve for the GPT-OSS run and the
# host-register bench (about 160 s and 60 s on the H200), so that all three report.
REMAIN=$(left)
RESERVE=230
MAXSEQ="131072,294912"
MAXSEQ_S=$((REMAIN - RESERVE))  # gpu_bench counts it from its own start (the run itself ~120 s)
if [ "$MAXSEQ_S" -lt 165 ]; then MAXSEQ=""; MAXSEQ_S=0; fi
set +e
timeout $((REMAIN - 15)) "$BUILD/tests/bench/gpu_bench" --devices=cuda:0 --model=qwen3-1.7b --seq=2048 \
  --microbatches=32 --warmup=3 --iterations=4 --max_seq="$MAXSEQ" --max_seq_seconds="$MAXSEQ_S" \
  --json="$OUT/bench.json" ${RP_BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
BENCH_RC=$?
set -e
say "bench: rc=$BENCH_RC ($(($(date +%s) - t0)) s)"
# GPT-OSS-20B's shape (4 of its 24 blocks: sinks, sliding blocks, 32 experts top-4 with biases),
# LoRA r=16 on q/k/v/o, seq 2048: tokens/s and HFU over active FLOPs, when time is left.
REMAIN=$(left)
MOE_RC=skipped
if [ "$REMAIN" -gt 175 ]; then
  t0=$(date +%s)
  set +e
  timeout $((REMAIN - 15)) "$BUILD/tests/bench/gpu_bench" --devices=cuda:0 --model=gpt-oss-20b --blocks=4 \
    --lora_rank=16 --seq=2048 --microbatches=8 --warmup=3 --iterations=2 --resident=false \
    --json="$OUT/bench_gpt_oss.json" >"$OUT/bench_gpt_oss.log" 2>&1
  MOE_RC=$?
  set -e
  say "bench gpt-oss-20b (4 blocks, LoRA): rc=$MOE_RC ($(($(date +%s) - t0)) s)"
fi
# A LoRA base from its model file: cudaHostRegister of the mapping vs the pinned-arena copy (1 GiB;
# each upload stops after 20 s and reports its partial rate: the registered one stalled there twice).
REMAIN=$(left)
if [ "$REMAIN" -gt 60 ]; then
  set +e
  timeout $((REMAIN - 10)) "$BUILD/tests/bench/host_register_bench" 1 "${TMPDIR:-/tmp}" >"$OUT/host_register.log" 2>&1
  say "host_register_bench: rc=$? (see host_register.log)"
  set -e
fi
echo
echo "=== summary ($(($(date +%s) - START)) s) ==="
cat "$SUMMARY"
echo "--- gpu_bench ---"
tail -32 "$OUT/bench.log"
[ -f "$OUT/bench_gpt_oss.log" ] && { echo "--- gpu_bench gpt-oss-20b ---"; tail -16 "$OUT/bench_gpt_oss.log"; }
[ -f "$OUT/host_register.log" ] && { echo "--- host_register_bench ---"; cat "$OUT/host_register.log"; }
[ "$TEST_RC" = 0 ] && [ "$BENCH_RC" = 0 ]
