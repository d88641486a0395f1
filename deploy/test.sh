#!/usr/bin/env bash
# test.sh — the test command: install, build, check formatting, run every test through CTest.
# GPU tests (label gpu) skip cleanly on machines without a CUDA device.
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$RP_ROOT/deploy/build.sh"
echo "== clang-format check"
bash "$RP_ROOT/deploy/check-format.sh"
echo "== lock analysis (clang -Wthread-safety)"
bash "$RP_ROOT/deploy/thread-safety.sh" "$RP_BUILD_DIR"
echo "== ctest"
cd "$RP_BUILD_DIR"
ctest --output-on-failure -j "$RP_JOBS" --timeout 600
