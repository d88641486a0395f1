#!/usr/bin/env bash
# tsan.sh — the engine's concurrency tests under ThreadSanitizer (not part of deploy/test.sh:
# a separate instrumented build of the engine takes several minutes on 2 cores).
# LibTorch itself is not instrumented, so its OpenMP regions are run single-threaded
# (OMP_NUM_THREADS=1): libgomp's barriers are invisible to TSAN and would only produce false
# reports inside LibTorch. Every thread, event, queue and store of roundpipe stays instrumented.
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${RP_TSAN_BUILD_DIR:-$RP_ROOT/build-tsan}"
RP_SKIP_DEPS="${RP_SKIP_DEPS:-0}"
[ "$RP_SKIP_DEPS" = 1 ] || bash "$RP_ROOT/deploy/install-deps.sh"
cmake -S "$RP_ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRP_WITH_SERVER=OFF \
  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build "$B" --target controller_test -j "${RP_JOBS:-$(nproc)}"
OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  "$B/tests/unit/scheduler/controller_test" \
  --gtest_filter='Async*:Engine.*:ControllerSchedule*:AutoPartition*:ControllerErrors*:EngineCheckpoint.Lora*:EngineCheckpoint.SgdLionAndAdafactor*'
