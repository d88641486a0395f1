#!/usr/bin/env bash
# test.sh — the test command: install, build, check formatting, run every test through CTest.
# GPU tests (label gpu) skip cleanly on machines without a CUDA device; any other skip fails the run.
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$RP_ROOT/deploy/build.sh"
echo "== clang-format check"
bash "$RP_ROOT/deploy/check-format.sh"
echo "== lock analysis (clang -Wthread-safety)"
bash "$RP_ROOT/deploy/thread-safety.sh" "$RP_BUILD_DIR"
echo "== ctest"
cd "$RP_BUILD_DIR"
rc=0
ctest --output-on-failure -j "$RP_JOBS" --timeout 600 --output-junit "$RP_BUILD_DIR/ctest-junit.xml" || rc=$?
# Per-label counts and the slowest tests; fails when a test other than a GPU test skipped.
python3 "$RP_ROOT/deploy/ctest_report.py" "$RP_BUILD_DIR/ctest-junit.xml" "$RP_BUILD_DIR" || rc=1
exit "$rc"
