// test_hooks.h — a test-only hook that stream operations and the optimizer worker call before
// each operation, so race-hunting tests can inject random delays. Unset (the default) it costs
// one relaxed atomic load.
//
// Contract: SetOpDelayHook is not synchronized with running operations beyond the atomic
// pointer swap: install it before starting work and clear it after everything finished.
#pragma once

#include <atomic>
#include <functional>

namespace rp::workers {

using OpDelayHook = std::function<void()>;

inline std::atomic<const OpDelayHook*>& OpDelayHookSlot() {
  static std::atomic<const OpDelayHook*> slot{nullptr};
  return slot;
}
inline void SetOpDelayHook(const OpDelayHook* hook) { OpDelayHookSlot().store(hook); }
inline void MaybeDelayForTest() {
  if (const OpDelayHook* h = OpDelayHookSlot().load(std::memory_order_relaxed)) (*h)();
}

// A second hook, called once per optimizer step (sync and async alike), for benchmarks that
// need a deliberately slow optimizer.
inline std::atomic<const OpDelayHook*>& OptimizerDelayHookSlot() {
  static std::atomic<const OpDelayHook*> slot{nullptr};
  return slot;
}
inline void SetOptimizerDelayHook(const OpDelayHook* hook) { OptimizerDelayHookSlot().store(hook); }
inline void MaybeDelayOptimizerForTest() {
  if (const OpDelayHook* h = OptimizerDelayHookSlot().load(std::memory_order_relaxed)) (*h)();
}

}  // namespace rp::workers
