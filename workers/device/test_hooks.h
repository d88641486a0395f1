// test_hooks.h — test-only hooks that stream operations and the optimizer worker call before
// each operation, so race-hunting tests can inject random delays and lost-worker tests faults (a
// lost device, an out-of-memory).
// Unset (the default) each costs one relaxed atomic load.
//
// Contract: the setters are not synchronized with running operations beyond the atomic
// pointer swap: install it before starting work and clear it after everything finished.
#pragma once

#include <atomic>
#include <functional>

#include "workers/device/device_health.h"

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

// Another, for the engine's admission: called by a runner after it asked how much host memory is
// free and before it takes the next job (a race test widens that window).
inline std::atomic<const OpDelayHook*>& AdmissionDelayHookSlot() {
  static std::atomic<const OpDelayHook*> slot{nullptr};
  return slot;
}
inline void SetAdmissionDelayHook(const OpDelayHook* hook) { AdmissionDelayHookSlot().store(hook); }
inline void MaybeDelayAdmissionForTest() {
  if (const OpDelayHook* h = AdmissionDelayHookSlot().load(std::memory_order_relaxed)) (*h)();
}

// A third hook, the fault injector: called before each device operation of a working device's
// streams with the device index and the operation's timeline label (OpInfo). kDeviceLost loses
// the device there (DeviceHealth::MarkLost): that operation and everything after it on the device
// is skipped. kOutOfMemory makes that operation fail as if the device ran out of memory
// (out_of_memory.h); the device keeps working. Lost-worker tests name the exact operation
// ("F2 mb1", "R B3 mb0", "grads B2 c0", "up F1 c0" ...).
struct OpInfo;
enum class Fault { kNone, kDeviceLost, kOutOfMemory };
using FaultHook = std::function<Fault(int device, const OpInfo& op)>;
inline std::atomic<const FaultHook*>& FaultHookSlot() {
  static std::atomic<const FaultHook*> slot{nullptr};
  return slot;
}
inline void SetFaultHook(const FaultHook* hook) { FaultHookSlot().store(hook); }
inline Fault MaybeInjectFault(const DeviceHealth& health, const OpInfo& op) {
  const FaultHook* h = FaultHookSlot().load(std::memory_order_relaxed);
  return h != nullptr ? (*h)(health.device_index(), op) : Fault::kNone;
}

}  // namespace rp::workers
