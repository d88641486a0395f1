#!/usr/bin/env bash
# collective-sanitizers.sh — the communicator path (workers/collective/: the daemon's side, the
# roundpipe-comm process, the rendezvous store) under AddressSanitizer + UndefinedBehaviorSanitizer
# and under ThreadSanitizer: two instrumented builds of just those targets, then every
# communicator test but the one that preloads LibTorch into the communicator (an uninstrumented
# library preloaded ahead of the sanitizer runtime is refused by it; that test checks symbol
# bindings, not memory). Not part of deploy/test.sh: each build takes a few minutes on 2 cores.
# Debian's Gloo is not instrumented: its own memory and threads are invisible to the sanitizers,
# everything of ours around it is checked.
set -euo pipefail
RP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RP_SKIP_DEPS="${RP_SKIP_DEPS:-0}"
[ "$RP_SKIP_DEPS" = 1 ] || bash "$RP_ROOT/deploy/install-deps.sh"
FILTER='-Communicator.BindsDebiansGlooAndNeverLibTorchsCopy'
for san in address thread; do
  B="${RP_SAN_BUILD_DIR:-$RP_ROOT/build}-comm-$san"
  flags="-fsanitize=$san -fno-omit-frame-pointer -g"
  [ "$san" = address ] && flags="$flags -fsanitize=undefined -fno-sanitize-recover=all"
  cmake -S "$RP_ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRP_WITH_SERVER=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
  cmake --build "$B" --target roundpipe-comm communicator_test -j "${RP_JOBS:-$(nproc)}"
  echo "== communicator tests under -fsanitize=$san"
  ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    "$B/tests/unit/workers/communicator_test" --gtest_filter="$FILTER"
done
